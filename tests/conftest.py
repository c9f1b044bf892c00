import numpy as np
import pytest
from util import devices_under_test


@pytest.fixture(params=devices_under_test())
def device(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)

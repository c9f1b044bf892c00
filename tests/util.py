"""Shared helpers for the test suites (imported as `util`; tests/ is on pythonpath)."""

import os

import ml_dtypes
import numpy as np

import rnncore
from rnncore._ops import rel_err  # noqa: F401 (the suites import it from here)

# The contract's tolerances: relative to the reference's norm.
# float16 and bfloat16 are storage only (float32 arithmetic): 1e-2 and 5e-2 of the float64
# reference (issues 6 and 16).
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FORWARD_TOL = {
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.float16): 1e-2,
    BFLOAT16: 5e-2,
}
GRADIENT_TOL = {
    np.dtype(np.float32): 1e-4,
    np.dtype(np.float64): 1e-10,
    np.dtype(np.float16): 1e-2,
    BFLOAT16: 5e-2,
}


def assert_rel_close(actual, expected, tol, what=""):
    """rel_err(actual, expected) <= tol, for arrays of the same shape."""
    shape, want = np.shape(actual), np.shape(expected)
    assert shape == want, f"{what}: shape {shape} != expected {want}"
    err = rel_err(actual, expected)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


# PyTorch's layer class and its options for each PyTorch mode the suites compare with.
TORCH_LAYERS = {
    "rnn_tanh": ("RNN", {"nonlinearity": "tanh"}),
    "rnn_relu": ("RNN", {"nonlinearity": "relu"}),
    "lstm": ("LSTM", {}),
    "gru": ("GRU", {}),
}


def torch_layer_of(mode, I, H, bidirectional, *, seed, scale=1.0):  # noqa: E741
    """A float64 one-layer PyTorch module of `mode` (TORCH_LAYERS) with the weights of
    torch.manual_seed(seed) times `scale`."""
    import torch

    torch.manual_seed(seed)
    cls, options = TORCH_LAYERS[mode]
    layer = getattr(torch.nn, cls)(I, H, bidirectional=bidirectional, **options).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(scale)
    return layer


def devices_under_test():
    """Devices the suites run on: every available one, or RNNCORE_DEVICE alone."""
    forced = os.environ.get("RNNCORE_DEVICE")
    return [forced] if forced else list(rnncore.devices())

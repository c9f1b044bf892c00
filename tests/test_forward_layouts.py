"""Input memory layouts and array types of the forward ops.

Any strided input (transposed views, step slices, negative strides, zero strides,
read-only arrays) and torch CPU tensors give exactly the result of contiguous numpy
copies; outputs are writable numpy arrays; inputs are never written to.
"""

import numpy as np
import pytest
from cases import (
    DTYPES,
    KINDS,
    OPTIONAL_INPUTS,
    full_descriptor,
    make_inputs,
    result_fields,
    run,
    skip_unsupported,
)

import rnncore

T, N, I, H = 4, 3, 5, 6  # noqa: E741


def descriptor(kind):
    return full_descriptor(kind, bidirectional=True, training=True)


def inputs_for(rng, kind, dtype):
    """Every input of `kind` given; bidirectional so the recurrent weight is 3-D."""
    options = {"I": I, "bias": True, "init_state": True, "mask": "ndh"}
    if kind == "lstm":
        options.update(init_cell=True, peephole=True)
    if kind == "gru":
        options.update(secondary_bias=True)
    return make_inputs(rng, kind, T=T, N=N, H=H, bidirectional=True, dtype=dtype, **options)


def transposed(a):
    """Same values, all axes' strides reversed (a Fortran-order view); 1-D: unchanged."""
    return np.ascontiguousarray(a.T).T


def step2(a):
    """Same values, a view taking every other element of a buffer twice as large."""
    big = np.full(tuple(2 * s for s in a.shape), np.nan, dtype=a.dtype)
    view = big[tuple(slice(None, None, 2) for _ in a.shape)]
    view[...] = a
    return view


def negative(a):
    """Same values, a view with negative strides on every axis."""
    flipped = np.ascontiguousarray(a[tuple(slice(None, None, -1) for _ in a.shape)])
    return flipped[tuple(slice(None, None, -1) for _ in a.shape)]


def readonly(a):
    b = a.copy()
    b.flags.writeable = False
    return b


def zero_stride(a):
    """A read-only broadcast view (stride 0 on axis 0) whose values are a's first row."""
    return np.broadcast_to(a[:1], a.shape) if a.ndim else a


LAYOUTS = {
    "transposed": transposed,
    "step2": step2,
    "negative": negative,
    "readonly": readonly,
    "zero_stride": zero_stride,
}

INPUT_NAMES = {kind: ("source", "recurrent_weight") + OPTIONAL_INPUTS[kind] for kind in KINDS}


def assert_same_result(actual, expected, kind, what):
    for field in result_fields(kind):
        a, e = getattr(actual, field), getattr(expected, field)
        assert (a is None) == (e is None), f"{what}: {field}"
        if e is not None:
            np.testing.assert_array_equal(a, e, err_msg=f"{what}: {field}")


def layout_cases():
    for kind in KINDS:
        for name in INPUT_NAMES[kind] + ("all",):
            yield pytest.param(kind, name, id=f"{kind}-{name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("kind", "name"), list(layout_cases()))
def test_strided_inputs_give_the_contiguous_result(rng, device, kind, name, layout, dtype):
    skip_unsupported(device, dtype)
    desc = descriptor(kind)
    inputs = inputs_for(rng, kind, dtype)
    strided = dict(inputs)
    for key in inputs if name == "all" else (name,):
        strided[key] = LAYOUTS[layout](inputs[key])
    contiguous = {k: np.ascontiguousarray(v) for k, v in strided.items()}
    before = {k: v.copy() for k, v in strided.items()}
    expected = run(rnncore, kind, contiguous, desc, device=device)
    actual = run(rnncore, kind, strided, desc, device=device)
    assert_same_result(actual, expected, kind, f"{kind} {name} {layout}")
    for k, v in strided.items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"input {k} was modified")


def to_torch(a, layout):
    torch = pytest.importorskip("torch")

    def tensor(c):  # torch.from_numpy knows no ml_dtypes.bfloat16: its bits, viewed
        if c.dtype.name == "bfloat16":
            return torch.from_numpy(c.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(c)

    if layout == "contiguous":
        return tensor(np.ascontiguousarray(a))
    # A view with every axis reversed (non-contiguous for ndim >= 2).
    axes = tuple(reversed(range(a.ndim)))
    return tensor(np.ascontiguousarray(a.transpose(axes))).permute(*axes)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("kind", KINDS)
def test_torch_cpu_tensors_are_accepted(rng, device, kind, layout, dtype):
    skip_unsupported(device, dtype)
    desc = descriptor(kind)
    inputs = inputs_for(rng, kind, dtype)
    tensors = {k: to_torch(v, layout) for k, v in inputs.items()}
    expected = run(rnncore, kind, inputs, desc, device=device)
    actual = run(rnncore, kind, tensors, desc, device=device)
    for field in result_fields(kind):
        value = getattr(actual, field)
        assert isinstance(value, np.ndarray), f"{field} is {type(value)}, not numpy"
    assert_same_result(actual, expected, kind, f"torch {layout} {kind}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_outputs_are_writable_numpy_arrays(rng, device, kind, dtype):
    skip_unsupported(device, dtype)
    result = run(rnncore, kind, inputs_for(rng, kind, dtype), descriptor(kind), device=device)
    for field in result_fields(kind):
        value = getattr(result, field)
        assert type(value) is np.ndarray, f"{field} is {type(value)}"
        assert value.dtype == np.dtype(dtype)
        assert value.flags.writeable, f"{field} is read-only"
        assert value.flags.c_contiguous, f"{field} is not C-contiguous"
        value[...] = 1.0  # writing must work (and must not touch any input)
        assert np.all(value == 1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_contiguous_inputs_are_not_modified(rng, device, kind, dtype):
    skip_unsupported(device, dtype)
    inputs = inputs_for(rng, kind, dtype)
    assert all(v.flags.c_contiguous for v in inputs.values())
    before = {k: v.copy() for k, v in inputs.items()}
    result = run(rnncore, kind, inputs, descriptor(kind), device=device)
    for field in result_fields(kind):
        getattr(result, field)[...] = 0.0  # outputs must not alias inputs either
    for k, v in inputs.items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"input {k} was modified")

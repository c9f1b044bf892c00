"""Case builders shared by the forward and gradient suites (tests/test_forward_*.py,
tests/test_gradients_*.py).

Random inputs in the contract's shapes (spec/semantics.md), descriptors and calls by op
kind, and the output checks every forward comparison needs.
"""

import copy

import numpy as np
import pytest
from util import FORWARD_TOL, GRADIENT_TOL, assert_rel_close, rel_err

import rnncore

KINDS = ("rnn", "lstm", "gru")
GATES = {"rnn": 1, "lstm": 4, "gru": 3}
# float64 runs on the CPU only, float16 (storage, float32 arithmetic) on Metal devices only.
DTYPES = (np.float32, np.float64, np.float16)

# Forms of the mask that broadcast to [N, D·H] (the contract's list).
MASK_FORMS = ("scalar", "dh", "1dh", "n1", "ndh")

FLAG_FIELDS = {
    "rnn": ("reverse", "bidirectional", "training"),
    "lstm": ("reverse", "bidirectional", "training", "produce_cell", "forget_gate_last"),
    "gru": (
        "reverse",
        "bidirectional",
        "training",
        "reset_gate_first",
        "reset_after",
        "flip_z",
    ),
}

ACTIVATION_FIELDS = {
    "rnn": ("activation",),
    "lstm": (
        "input_gate_activation",
        "forget_gate_activation",
        "cell_gate_activation",
        "output_gate_activation",
        "activation",
    ),
    "gru": ("update_gate_activation", "reset_gate_activation", "output_gate_activation"),
}

ACTIVATIONS = ("NONE", "RELU", "TANH", "SIGMOID", "HARD_SIGMOID")

# Optional inputs each op takes, besides source and recurrent_weight.
OPTIONAL_INPUTS = {
    "rnn": ("input_weight", "bias", "init_state", "mask"),
    "lstm": ("input_weight", "bias", "init_state", "init_cell", "mask", "peephole"),
    "gru": ("input_weight", "bias", "init_state", "mask", "secondary_bias"),
}

_OPS = {"rnn": "single_gate_rnn", "lstm": "lstm", "gru": "gru"}
_DESCRIPTORS = {"rnn": "RNNDescriptor", "lstm": "LSTMDescriptor", "gru": "GRUDescriptor"}


def op(module, kind):
    """The forward function of `kind` in `module` (rnncore or rnncore.reference)."""
    return getattr(module, _OPS[kind])


def make_descriptor(kind, **fields):
    """A descriptor of `kind`; activation fields may be given by name ("TANH")."""
    fields = {
        k: getattr(rnncore.Activation, v) if isinstance(v, str) else v for k, v in fields.items()
    }
    return getattr(rnncore, _DESCRIPTORS[kind])(**fields)


def supported(device, dtype):
    """float64 is a CPU-only dtype (api.md), float16 a Metal-only one."""
    if np.dtype(dtype) == np.float64:
        return device == "cpu"
    if np.dtype(dtype) == np.float16:
        return device != "cpu"
    return True


def skip_unsupported(device, dtype):
    if not supported(device, dtype):
        pytest.skip(f"device {device!r} does not compute {np.dtype(dtype).name}")


def mask_shape(form, N, DH):
    return {"scalar": (), "dh": (DH,), "1dh": (1, DH), "n1": (N, 1), "ndh": (N, DH)}[form]


def make_inputs(
    rng,
    kind,
    *,
    T,
    N,
    H,
    I=None,  # noqa: E741 (the contract's name)
    bidirectional=False,
    dtype=np.float64,
    bias=False,
    init_state=False,
    init_cell=False,
    mask=None,
    peephole=False,
    secondary_bias=False,
):
    """Random inputs as a dict of keyword arguments for the forward op.

    I=None means no input weight: the source then has D·G·H channels. `mask` is None or
    one of MASK_FORMS. Values are drawn in float64 and rounded to `dtype`, scaled so that
    a few steps of any activation stay in a well-conditioned range.
    """
    D = 2 if bidirectional else 1
    G = GATES[kind]
    DH, GH = D * H, G * H
    dt = np.dtype(dtype)

    def normal(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(dt)

    args = {}
    if I is None:
        args["source"] = normal((T, N, D * GH), 1.0)
    else:
        args["source"] = normal((T, N, I), 1.0)
    r_shape = (2, GH, H) if bidirectional else (GH, H)
    args["recurrent_weight"] = normal(r_shape, 0.8 / np.sqrt(H))
    if I is not None:
        args["input_weight"] = normal((D * GH, I), 1.0 / np.sqrt(I))
    if bias:
        args["bias"] = normal((D * GH,), 0.5)
    if init_state:
        args["init_state"] = normal((N, DH), 0.7)
    if init_cell:
        args["init_cell"] = normal((N, DH), 1.0)
    if mask is not None:
        shape = mask_shape(mask, N, DH)
        values = rng.uniform(0.5, 1.5, shape)
        values = np.where(rng.random(shape) < 0.25, 0.0, values)
        args["mask"] = np.asarray(0.75 if mask == "scalar" else values, dtype=dt)
    if peephole:
        args["peephole"] = normal((2, 4 * H) if bidirectional else (4 * H,), 0.5)
    if secondary_bias:
        args["secondary_bias"] = normal((DH,), 0.5)
    return args


def run(module, kind, inputs, descriptor, **kwargs):
    """Call the forward op: source and recurrent_weight positionally, the rest by name."""
    rest = {k: v for k, v in inputs.items() if k not in ("source", "recurrent_weight")}
    return op(module, kind)(
        inputs["source"],
        inputs["recurrent_weight"],
        **rest,
        descriptor=descriptor,
        **kwargs,
    )


def as_float64(inputs):
    return {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}


def result_fields(kind):
    return ("state", "cell", "z_state") if kind == "lstm" else ("state", "z_state")


def expected_shapes(kind, descriptor, T, N, H):
    """Shape of every output field of `kind` (None where the contract says absent)."""
    D = 2 if descriptor.bidirectional else 1
    shapes = {"state": (T, N, D * H), "z_state": None}
    if descriptor.training:
        width = {"rnn": 1, "lstm": 4, "gru": 4 if kind == "gru" and descriptor.reset_after else 3}
        shapes["z_state"] = (T, N, D * width[kind] * H)
    if kind == "lstm":
        produce = descriptor.produce_cell or descriptor.training
        shapes["cell"] = (T, N, D * H) if produce else None
    return shapes


def check_layout(result, kind, descriptor, T, N, H, dtype, what=""):
    """Every field is a numpy array of the expected shape and dtype, or None."""
    shapes = expected_shapes(kind, descriptor, T, N, H)
    for field in result_fields(kind):
        value = getattr(result, field)
        shape = shapes[field]
        if shape is None:
            assert value is None, f"{what}: {field} should be None, got {type(value)}"
            continue
        assert isinstance(value, np.ndarray), f"{what}: {field} is {type(value)}"
        assert value.shape == shape, f"{what}: {field} shape {value.shape} != {shape}"
        assert value.dtype == np.dtype(dtype), f"{what}: {field} dtype {value.dtype}"


def check_close(actual, expected, kind, tol, what=""):
    """Every field of `actual` within `tol` (relative) of `expected`; None matches None."""
    for field in result_fields(kind):
        a, e = getattr(actual, field), getattr(expected, field)
        if e is None:
            assert a is None, f"{what}: {field} should be None"
            continue
        assert a is not None, f"{what}: {field} is None but expected an array"
        assert np.all(np.isfinite(a)), f"{what}: {field} has non-finite values"
        assert_rel_close(a, e, tol, f"{what}: {field}")


def forward_tol(dtype):
    return FORWARD_TOL[np.dtype(dtype)]


# --------------------------------------------------------------------------------------
# Gradient suites (tests/test_gradients_*.py)
# --------------------------------------------------------------------------------------

_GRADIENT_OPS = {
    "rnn": "single_gate_rnn_gradients",
    "lstm": "lstm_gradients",
    "gru": "gru_gradients",
}
# Fields of the gradient results (RNNGradients, LSTMGradients, GRUGradients), in order.
GRADIENT_FIELDS = {
    "rnn": ("source", "recurrent_weight", "input_weight", "bias", "init_state"),
    "lstm": (
        "source",
        "recurrent_weight",
        "input_weight",
        "bias",
        "peephole",
        "init_state",
        "init_cell",
    ),
    "gru": ("source", "recurrent_weight", "input_weight", "bias", "init_state", "secondary_bias"),
}
# The LSTM cell gradient: none, dL/d(final cell) [N, D·H], or dL/d(c[t]) [T, N, D·H].
CELL_GRADIENT_FORMS = (None, "final", "steps")


def gradient_op(module, kind):
    """The gradient function of `kind` in `module` (rnncore or rnncore.reference)."""
    return getattr(module, _GRADIENT_OPS[kind])


def with_fields(descriptor, **fields):
    """A copy of the rnncore `descriptor` with some fields replaced."""
    d = copy.copy(descriptor)
    for k, v in fields.items():
        setattr(d, k, getattr(rnncore.Activation, v) if isinstance(v, str) else v)
    return d


def make_cotangents(
    rng,
    kind,
    *,
    T,
    N,
    H,
    bidirectional=False,
    dtype=np.float64,
    state_gradient=False,
    cell_gradient=None,
):
    """dL/dh for every step (`source_gradient`), plus the optional `state_gradient` and,
    for LSTM, `cell_gradient` in one of CELL_GRADIENT_FORMS; as a dict of arguments."""
    DH = (2 if bidirectional else 1) * H
    dt = np.dtype(dtype)
    cot = {"source_gradient": rng.standard_normal((T, N, DH)).astype(dt)}
    if state_gradient:
        cot["state_gradient"] = rng.standard_normal((N, DH)).astype(dt)
    if kind == "lstm" and cell_gradient == "final":
        cot["cell_gradient"] = rng.standard_normal((N, DH)).astype(dt)
    elif kind == "lstm" and cell_gradient == "steps":
        cot["cell_gradient"] = rng.standard_normal((T, N, DH)).astype(dt)
    elif cell_gradient is not None and kind == "lstm":
        raise ValueError(f"unknown cell gradient form {cell_gradient!r}")
    return cot


def training_forward(module, kind, inputs, descriptor, **kwargs):
    """A forward run with training = True (z_state, and the LSTM cell)."""
    return run(module, kind, inputs, with_fields(descriptor, training=True), **kwargs)


def run_gradients(module, kind, inputs, descriptor, cot, *, forward=None, **kwargs):
    """The gradient op of `module`, fed as a user would: with the z_state (and GRU
    output / LSTM cell) of `forward`, by default a training forward run of `module`
    itself. The descriptor passed to the gradient op has training = False: the field is
    ignored there. Returns (gradients, forward result)."""
    if descriptor is None:
        descriptor = make_descriptor(kind)
    if forward is None:
        forward = training_forward(module, kind, inputs, descriptor, **kwargs)
    extra = {"rnn": (), "lstm": (getattr(forward, "cell", None),), "gru": (forward.state,)}[kind]
    rest = {k: v for k, v in inputs.items() if k not in ("source", "recurrent_weight")}
    optional = {k: v for k, v in cot.items() if k != "source_gradient"}
    grads = gradient_op(module, kind)(
        inputs["source"],
        inputs["recurrent_weight"],
        cot["source_gradient"],
        forward.z_state,
        *extra,
        **optional,
        **rest,
        descriptor=with_fields(descriptor, training=False),
        **kwargs,
    )
    return grads, forward


def final_state(y, H, bidirectional):
    """Each direction's final state [N, D·H] from a [T, N, D·H] output (the contract's
    "Bidirectional halves"): y[T-1] forward, y[0] backward."""
    if bidirectional:
        return np.concatenate([y[-1, :, :H], y[0, :, H:]], axis=-1)
    return y[-1]


def check_gradient_layout(grads, kind, inputs, dtype, what=""):
    """Every field is an array of its input's shape and dtype, or None if not given."""
    for field in GRADIENT_FIELDS[kind]:
        value = getattr(grads, field)
        if field not in inputs:
            assert value is None, f"{what}: d{field} should be None (input not given)"
            continue
        assert isinstance(value, np.ndarray), f"{what}: d{field} is {type(value)}"
        shape = np.shape(inputs[field])
        assert value.shape == shape, f"{what}: d{field} shape {value.shape} != {shape}"
        assert value.dtype == np.dtype(dtype), f"{what}: d{field} dtype {value.dtype}"


def check_gradients_close(actual, expected, kind, tol, what=""):
    """Every field of `actual` within `tol` (relative) of `expected`; None matches None."""
    worst = 0.0
    for field in GRADIENT_FIELDS[kind]:
        a, e = getattr(actual, field), getattr(expected, field)
        if e is None:
            assert a is None, f"{what}: d{field} should be None"
            continue
        assert a is not None, f"{what}: d{field} is None but expected an array"
        assert np.all(np.isfinite(a)), f"{what}: d{field} has non-finite values"
        assert_rel_close(a, e, tol, f"{what}: d{field}")
        worst = max(worst, rel_err(a, e))
    return worst


def gradient_tol(dtype):
    return GRADIENT_TOL[np.dtype(dtype)]

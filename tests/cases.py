"""Case builders shared by the forward and gradient suites (tests/test_forward_*.py,
tests/test_gradients_*.py).

Random inputs in the contract's shapes (docs/semantics.md), descriptors and calls by op
kind, and the output checks every forward comparison needs.
"""

import copy
import functools
import itertools

import numpy as np
import pytest
from util import BFLOAT16, FORWARD_TOL, GRADIENT_TOL, assert_rel_close, rel_err

import rnncore
from rnncore import _ops, reference

KINDS = tuple(_ops.KINDS)
GATES = {k: kind.gates for k, kind in _ops.KINDS.items()}
# float64 runs on the CPU only, float16 storage (float32 arithmetic) on every device, bfloat16
# storage where supported() says.
DTYPES = (np.float32, np.float64, np.float16, BFLOAT16)

# Forms of the mask that broadcast to [N, D·H] (the contract's list).
MASK_FORMS = ("scalar", "dh", "1dh", "n1", "ndh")


def descriptor_class(kind):
    return getattr(rnncore, _ops.KINDS[kind].descriptor)


# The descriptor fields, as the binding lists them.
FLAG_FIELDS = {k: _ops.flag_fields(descriptor_class(k)) for k in KINDS}
ACTIVATION_FIELDS = {k: _ops.activation_fields(descriptor_class(k)) for k in KINDS}
ACTIVATIONS = tuple(a.name for a in rnncore.Activation)
# Each activation field's default (the descriptor's).
DEFAULT_ACTIVATIONS = {
    k: {f: int(getattr(descriptor_class(k)(), f)) for f in ACTIVATION_FIELDS[k]} for k in KINDS
}

# Optional inputs each op takes, besides source and recurrent_weight.
OPTIONAL_INPUTS = {k: kind.optional_inputs for k, kind in _ops.KINDS.items()}


def op(module, kind):
    """The forward function of `kind` in `module` (rnncore or rnncore.reference)."""
    return getattr(module, _ops.KINDS[kind].forward)


def make_descriptor(kind, **fields):
    """A descriptor of `kind`; activation fields may be given by name ("TANH")."""
    fields = {
        k: getattr(rnncore.Activation, v) if isinstance(v, str) else v for k, v in fields.items()
    }
    return descriptor_class(kind)(**fields)


def full_descriptor(kind, **fields):
    """make_descriptor(kind, **fields), with reset_after for a GRU: the configuration in
    which every input counts (secondary_bias is ignored without it)."""
    if kind == "gru":
        fields.setdefault("reset_after", True)
    return make_descriptor(kind, **fields)


def supported(device, dtype):
    """float64 is CPU-only (api.md); float16 storage is on every device; bfloat16 storage on
    the CPU, the emulator, and Metal from macOS 14 (MSL 3.1's bfloat)."""
    if np.dtype(dtype) == np.float64:
        return device == "cpu"
    if np.dtype(dtype) == BFLOAT16 and device == "metal":
        return metal_computes_bfloat16()
    return True


@functools.cache
def metal_computes_bfloat16():
    """Whether this Mac's "metal" device takes bfloat16 (a TypeError names macOS 14 if not)."""
    x = np.zeros((1, 1, 1), BFLOAT16)
    try:
        rnncore.single_gate_rnn(x, np.zeros((1, 1), BFLOAT16), device="metal")
    except TypeError as e:
        assert "macOS 14" in str(e), e
        return False
    return True


def skip_unsupported(device, dtype):
    if not supported(device, dtype):
        pytest.skip(f"device {device!r} does not compute {np.dtype(dtype).name}")


def mask_shape(form, N, DH):
    return {"scalar": (), "dh": (DH,), "1dh": (1, DH), "n1": (N, 1), "ndh": (N, DH)}[form]


# One descriptor's fields per kind with every gate's activation other than its default.
DISTINCT_ACTIVATIONS = {
    "rnn": dict(activation="HARD_SIGMOID"),
    "lstm": dict(
        input_gate_activation="HARD_SIGMOID",
        forget_gate_activation="TANH",
        cell_gate_activation="RELU",
        output_gate_activation="NONE",
        activation="SIGMOID",
    ),
    "gru": dict(
        update_gate_activation="HARD_SIGMOID",
        reset_gate_activation="TANH",
        output_gate_activation="RELU",
        reset_after=True,
    ),
}

# (T, N, I, H): T = 1, N = 1, H either side of 32, I != H, and no input weight (I None).
AWKWARD_SIZES = [
    (1, 3, 4, 5),
    (5, 1, 4, 5),
    (3, 2, 7, 1),
    (3, 2, 7, 31),
    (3, 2, 40, 32),
    (3, 2, 7, 33),
    (4, 5, None, 33),
    (7, 9, 33, 32),
    (2, 3, 9, 127),
    (3, 67, 8, 33),
    (2, 16, 5, 31),  # the CPU LSTM and GRU project each step's rows in the step from N = 16
]


def flag_cases(with_index=False):
    """pytest params (kind, flags[, k]): every combination of each kind's flags, named by
    the flags set; k is the combination's index (for varying the other options)."""
    for kind in KINDS:
        fields = FLAG_FIELDS[kind]
        for k, values in enumerate(itertools.product((False, True), repeat=len(fields))):
            flags = dict(zip(fields, values))
            tag = "-".join(f for f, v in flags.items() if v) or "default"
            args = (kind, flags, k) if with_index else (kind, flags)
            yield pytest.param(*args, id=f"{kind}-{tag}")


def optional_input_cases(kind, I):  # noqa: E741
    """pytest params (kind, make_inputs options): each optional input of `kind` alone, the
    mask in each of MASK_FORMS."""
    for name in OPTIONAL_INPUTS[kind]:
        if name == "input_weight":
            yield pytest.param(kind, {"I": I}, id=f"{kind}-input_weight")
        elif name == "mask":
            for form in MASK_FORMS:
                yield pytest.param(kind, {"mask": form}, id=f"{kind}-mask_{form}")
        else:
            yield pytest.param(kind, {name: True}, id=f"{kind}-{name}")


def activation_cases(with_index=False):
    """pytest params (kind, field, activation name[, k]): every activation on every gate;
    k is the activation's index."""
    for kind in KINDS:
        for field in ACTIVATION_FIELDS[kind]:
            for k, act in enumerate(ACTIVATIONS):
                args = (kind, field, act, k) if with_index else (kind, field, act)
                yield pytest.param(*args, id=f"{kind}-{field}-{act}")


def size_ids(sizes):
    return [f"T{t}-N{n}-I{i}-H{h}" for t, n, i, h in sizes]


def input_shapes(kind, *, T, N, H, I=None, bidirectional=False):  # noqa: E741
    """The contract's shape of every input of `kind`'s forward op, in signature order
    (the mask's full [N, D·H] form); I=None: no input weight, the source has D·G·H
    channels."""
    D = 2 if bidirectional else 1
    GH, DH = GATES[kind] * H, D * H
    every = {
        "source": (T, N, D * GH if I is None else I),
        "recurrent_weight": (2, GH, H) if bidirectional else (GH, H),
        "input_weight": (D * GH, I),
        "bias": (D * GH,),
        "init_state": (N, DH),
        "init_cell": (N, DH),
        "mask": (N, DH),
        "peephole": (2, 4 * H) if bidirectional else (4 * H,),
        "secondary_bias": (DH,),
    }
    names = ("source", "recurrent_weight") + OPTIONAL_INPUTS[kind]
    return {n: every[n] for n in names if n != "input_weight" or I is not None}


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
    dt = np.dtype(dtype)
    shapes = input_shapes(kind, T=T, N=N, H=H, I=I, bidirectional=bidirectional)

    def normal(name, scale):
        return (rng.standard_normal(shapes[name]) * scale).astype(dt)

    args = {"source": normal("source", 1.0)}
    args["recurrent_weight"] = normal("recurrent_weight", 0.8 / np.sqrt(H))
    if I is not None:
        args["input_weight"] = normal("input_weight", 1.0 / np.sqrt(I))
    if bias:
        args["bias"] = normal("bias", 0.5)
    if init_state:
        args["init_state"] = normal("init_state", 0.7)
    if init_cell:
        args["init_cell"] = normal("init_cell", 1.0)
    if mask is not None:
        shape = mask_shape(mask, N, shapes["init_state"][1])
        values = rng.uniform(0.5, 1.5, shape)
        values = np.where(rng.random(shape) < 0.25, 0.0, values)
        args["mask"] = np.asarray(0.75 if mask == "scalar" else values, dtype=dt)
    if peephole:
        args["peephole"] = normal("peephole", 0.5)
    if secondary_bias:
        args["secondary_bias"] = normal("secondary_bias", 0.5)
    return args


def all_inputs(kind, I):  # noqa: E741
    """make_inputs options that give every optional input of `kind` (the mask in its full
    [N, D·H] form), with I source channels."""
    options = {"I": I}
    for name in OPTIONAL_INPUTS[kind]:
        if name != "input_weight":
            options[name] = "ndh" if name == "mask" else True
    return options


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
    return _ops.KINDS[kind].result._fields


def z_width(kind, reset_after=False):
    """Training-state (z_state) channels per direction, in units of H."""
    return {"rnn": 1, "lstm": 4, "gru": 4 if reset_after else 3}[kind]


def expected_shapes(kind, descriptor, T, N, H):
    """Shape of every output field of `kind` (None where the contract says absent)."""
    D = 2 if descriptor.bidirectional else 1
    shapes = {"state": (T, N, D * H), "z_state": None}
    if descriptor.training:
        width = z_width(kind, kind == "gru" and descriptor.reset_after)
        shapes["z_state"] = (T, N, D * width * H)
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
    _check_fields_close(actual, expected, result_fields(kind), tol, what, "")


def _check_fields_close(actual, expected, fields, tol, what, prefix):
    """The worst relative error of the `fields` of `actual` against `expected`, each
    within `tol` and finite; None matches None. `prefix` ("d" for gradients) is only
    for the messages."""
    worst = 0.0
    for field in fields:
        a, e = getattr(actual, field), getattr(expected, field)
        name = prefix + field
        if e is None:
            assert a is None, f"{what}: {name} should be None"
            continue
        assert a is not None, f"{what}: {name} is None but expected an array"
        assert np.all(np.isfinite(a)), f"{what}: {name} has non-finite values"
        assert_rel_close(a, e, tol, f"{what}: {name}")
        worst = max(worst, rel_err(a, e))
    return worst


def forward_tol(dtype):
    return FORWARD_TOL[np.dtype(dtype)]


# --------------------------------------------------------------------------------------
# Gradient suites (tests/test_gradients_*.py)
# --------------------------------------------------------------------------------------

# Fields of the gradient results (RNNGradients, LSTMGradients, GRUGradients), in order.
GRADIENT_FIELDS = {k: kind.gradient_fields for k, kind in _ops.KINDS.items()}
# The LSTM cell gradient: none, dL/d(final cell) [N, D·H], or dL/d(c[t]) [T, N, D·H].
CELL_GRADIENT_FORMS = (None, "final", "steps")


def gradient_op(module, kind):
    """The gradient function of `kind` in `module` (rnncore or rnncore.reference)."""
    return getattr(module, _ops.KINDS[kind].gradients)


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


def cotangents_like(rng, kind, inputs, **options):
    """make_cotangents for the sizes, directions and dtype of the forward `inputs`."""
    T, N = inputs["source"].shape[:2]
    R = inputs["recurrent_weight"]
    return make_cotangents(
        rng, kind, T=T, N=N, H=R.shape[-1], bidirectional=R.ndim == 3, dtype=R.dtype, **options
    )


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
    """Every field of `actual` within `tol` (relative) of `expected`; None matches None.
    Returns the worst relative error."""
    return _check_fields_close(actual, expected, GRADIENT_FIELDS[kind], tol, what, "d")


def gradient_tol(dtype):
    return GRADIENT_TOL[np.dtype(dtype)]


# --------------------------------------------------------------------------------------
# Finite-difference sweeps (tests/test_gradients_fd.py, tests/test_reference.py)
# --------------------------------------------------------------------------------------

# (T, N, H, I): T in {1, 3}, N in {1, 2}, H in {1, 3}, I != H; cycled over a sweep.
FD_SIZES = [(3, 2, 3, 2), (3, 1, 1, 2), (1, 2, 3, 2), (3, 2, 1, 4), (3, 1, 3, 2), (1, 1, 1, 2)]
FD_MODES = {
    "fwd": {},
    "rev": {"reverse": True},
    "bi": {"bidirectional": True},
    "bi+rev": {"bidirectional": True, "reverse": True},  # reverse is ignored
}


class FDCases(list):
    """A sweep's cases: (id, kind, descriptor fields, options), the id naming them all."""

    def add(self, kind, fields, **options):
        name = "-".join(
            [kind]
            + [f"{k}={int(v)}" for k, v in fields.items()]
            + [f"{k}={v}" for k, v in options.items()]
        )
        self.append((name, kind, fields, options))


def other_activations(kind):
    """(k, field, activation) for every activation field of `kind` and every activation
    but its default; k counts them (to cycle the other options)."""
    k = 0
    for field, default in DEFAULT_ACTIVATIONS[kind].items():
        for act in range(len(ACTIVATIONS)):
            if act != default:
                yield k, field, act
                k += 1


def draw_clear_of_kinks(seed, draw, distance, clearance):
    """(inputs, rng): the first draw(rng) whose distance(inputs) to the activation kinks
    exceeds `clearance`, rng seeded [seed, attempt] (and left to draw the cotangents)."""
    for attempt in range(50):
        rng = np.random.default_rng([seed, attempt])
        inputs = draw(rng)
        if distance(inputs) > clearance:
            return inputs, rng
    pytest.fail("could not draw inputs away from the activation kinks")


def elementwise_fd(f, x, eps=1e-6):
    """Central differences of the scalar f() in every element of x (perturbed in place)."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        orig = x[idx]
        x[idx] = orig + eps
        plus = f()
        x[idx] = orig - eps
        minus = f()
        x[idx] = orig
        g[idx] = (plus - minus) / (2 * eps)
    return g


def cotangent_loss(out, cot, H, bidirectional):
    """The loss the gradient ops differentiate (docs/semantics.md, "Gradient operations")
    at the forward result `out`: sum(h·source_gradient) + sum(final h·state_gradient)
    (+ the LSTM cell term)."""
    total = np.sum(out.state * cot["source_gradient"])
    if "state_gradient" in cot:
        total += np.sum(final_state(out.state, H, bidirectional) * cot["state_gradient"])
    if "cell_gradient" in cot:
        cg = cot["cell_gradient"]
        cell = out.cell if cg.ndim == 3 else final_state(out.cell, H, bidirectional)
        total += np.sum(cell * cg)
    return total


def preactivations(kind, out, H, field):
    """(pre-activation values, activation) pairs of the training forward result `out`;
    field(name) is the value of the descriptor's field `name`."""
    T, N = out.state.shape[:2]
    D = 2 if field("bidirectional") else 1

    def act(name):
        return int(field(name))

    if kind == "rnn":
        return [(out.z_state, act("activation"))]
    if kind == "lstm":
        a = out.z_state.reshape(T, N, D, 4, H)
        order = "izfo" if field("forget_gate_last") else "ifzo"
        names = dict(i="input", f="forget", z="cell", o="output")
        pairs = [(a[..., k, :], act(f"{names[g]}_gate_activation")) for k, g in enumerate(order)]
        return pairs + [(out.cell, act("activation"))]
    zs = out.z_state.reshape(T, N, D, 4 if field("reset_after") else 3, H)
    kz, kr = (1, 0) if field("reset_gate_first") else (0, 1)
    a_o = zs[..., 2, :]
    if field("reset_after"):  # a_o = x'_o + r ⊙ q
        a_o = zs[..., 3, :] + reference.activate(zs[..., kr, :], act("reset_gate_activation")) * a_o
    return [
        (zs[..., kz, :], act("update_gate_activation")),
        (zs[..., kr, :], act("reset_gate_activation")),
        (a_o, act("output_gate_activation")),
    ]


def kink_distance(kind, out, H, field):
    """How far the pre-activations of the training forward result `out` are from relu's
    and hard_sigmoid's kinks (see preactivations)."""
    dist = np.inf
    for x, act in preactivations(kind, out, H, field):
        if x.size and act == reference.RELU:
            dist = min(dist, np.abs(x).min())
        if x.size and act == reference.HARD_SIGMOID:
            dist = min(dist, np.abs(np.abs(x) - 2.5).min())
    return dist

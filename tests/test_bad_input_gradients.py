"""Bad inputs to the gradient ops: each is refused with ValueError / TypeError whose
message starts with the operation in brackets ("[gru_gradients] ..."), names the
argument and shows the shape it got and the shape it needs (docs/api.md "Arrays");
nothing crashes.

The gradient ops take the forward's inputs again (their checks are the forward's, spot
checked here) plus the training state of a forward run and the incoming gradients: a
training state from a differently configured forward (a reset_after GRU's 4H state for a
reset_before descriptor, a bidirectional state for a unidirectional one) or of the wrong
size, a source_gradient / output_fwd / cell_output_fwd / state_gradient of the wrong
shape, a cell_gradient of neither accepted form, and mixed or integer dtypes.
"""

import re

import bad_input
import numpy as np
import pytest
from bad_input import H, I, N, T, all_of, build_args, name_re, rand, shape_re, unique
from cases import GATES, KINDS, input_shapes, z_width
from cases import make_descriptor as descriptor

import rnncore
from rnncore import _ops

OP = {k: kind.gradients for k, kind in _ops.KINDS.items()}
# The required positional arguments, in order.
POSITIONAL = {k: kind.gradient_required for k, kind in _ops.KINDS.items()}


def base_shapes(kind, bidirectional=False, reset_after=False):
    """Shapes of a valid call with every argument of `kind` given, in signature order:
    the forward's inputs with the training state and the incoming gradients after the
    weights."""
    D = 2 if bidirectional else 1
    DH = D * H
    forward = input_shapes(kind, T=T, N=N, H=H, I=I, bidirectional=bidirectional)
    shapes = {n: forward.pop(n) for n in ("source", "recurrent_weight")}
    shapes["source_gradient"] = (T, N, DH)
    shapes["z_state"] = (T, N, D * z_width(kind, reset_after) * H)
    for name in POSITIONAL[kind][4:]:  # cell_output_fwd / output_fwd
        shapes[name] = (T, N, DH)
    shapes["state_gradient"] = (N, DH)
    if kind == "lstm":
        shapes["cell_gradient"] = (N, DH)
    shapes.update(forward)
    return shapes


# ---- message patterns ---------------------------------------------------------------


def op_re(kind):
    return r"^\[" + OP[kind] + r"\]"


# ---- cases ---------------------------------------------------------------------------


def case(kind, tag, *, bidirectional=False, reset_after=False, **kw):
    """A call of `kind` with base_shapes(...) updated by `shapes` (see bad_input.case)."""
    flags = {}
    if bidirectional:
        flags["bidirectional"] = True
        tag = "bi-" + tag
    if reset_after:
        flags["reset_after"] = True
        tag = "ra-" + tag
    base = base_shapes(kind, bidirectional, reset_after)
    return bad_input.case(kind, tag, base, flags=flags, **kw)


def shape_error(kind, name, got, *want, **kw):
    """A ValueError naming `name`, the shape `got` and every shape in `want`."""
    return bad_input.shape_error(case, kind, name, got, *want, **kw)


def cases_for(kind):
    out = []
    base = base_shapes(kind)
    DH = H
    ZH = z_width(kind) * H

    # -- training state from a differently configured forward, or of the wrong size ------
    # Bidirectional state for a unidirectional descriptor, and the other way round.
    out.append(shape_error(kind, "z_state", (T, N, 2 * ZH), (T, N, ZH)))
    out.append(shape_error(kind, "z_state", (T, N, ZH), (T, N, 2 * ZH), bidirectional=True))
    if kind == "gru":
        # reset_after's 4H state for a reset_before descriptor, and the other way round.
        out.append(shape_error(kind, "z_state", (T, N, 4 * H), (T, N, 3 * H)))
        out.append(shape_error(kind, "z_state", (T, N, 3 * H), (T, N, 4 * H), reset_after=True))
        out.append(
            shape_error(
                kind, "z_state", (T, N, 6 * H), (T, N, 8 * H), reset_after=True, bidirectional=True
            )  # fmt: skip
        )
        out.append(case(kind, "z_state-4H-valid", reset_after=True))
    # Another op's state (the widths differ: LSTM 4H, GRU 3H, RNN H).
    for other in KINDS:
        if other != kind and z_width(other) != z_width(kind):
            got = (T, N, z_width(other) * H)
            out.append(shape_error(kind, "z_state", got, (T, N, ZH)))
    for got in [(T + 1, N, ZH), (T - 1, N, ZH), (T, N + 1, ZH), (T, N, ZH + 1), (T, N, ZH - 1)]:
        out.append(shape_error(kind, "z_state", got, (T, N, ZH)))
    for got in [(T, N * ZH), (1, T, N, ZH), (T * N * ZH,)]:
        out.append(shape_error(kind, "z_state", got, (T, N, ZH)))

    # -- source_gradient, output_fwd, cell_output_fwd: [T, N, D·H] -------------------------
    sequences = ["source_gradient"] + [n for n in ("output_fwd", "cell_output_fwd") if n in base]
    for name in sequences:
        for got in [(T + 1, N, DH), (T - 1, N, DH), (T, N + 1, DH), (T, N, DH + 1), (T, N, 2 * DH)]:
            out.append(shape_error(kind, name, got, (T, N, DH)))
        for got in [(T, N * DH), (1, T, N, DH), (N, DH)]:
            out.append(shape_error(kind, name, got, (T, N, DH)))
        # A unidirectional layout for a bidirectional layer.
        out.append(shape_error(kind, name, (T, N, H), (T, N, 2 * H), bidirectional=True))

    # -- state_gradient: [N, D·H] ------------------------------------------------------------
    for got in [(N, DH + 1), (N + 1, DH), (N - 1, DH), (1, N, DH), (DH,), (T, N, DH), ()]:
        out.append(shape_error(kind, "state_gradient", got, (N, DH)))
    out.append(shape_error(kind, "state_gradient", (N, H), (N, 2 * H), bidirectional=True))

    # -- LSTM cell_gradient: [N, D·H] (final cell) or [T, N, D·H] (every step) -------------
    if kind == "lstm":
        both = ((N, DH), (T, N, DH))
        for got in [
            (N, DH + 1),
            (N + 1, DH),
            (DH,),
            (1, N, DH),
            (T + 1, N, DH),
            (T - 1, N, DH),
            (T, N + 1, DH),
            (T, N, DH + 1),
            (T, N, DH, 1),
            (),
        ]:
            out.append(shape_error(kind, "cell_gradient", got, *both))
        out.append(
            shape_error(
                kind, "cell_gradient", (N, H), (N, 2 * H), (T, N, 2 * H), bidirectional=True
            )  # fmt: skip
        )
        out.append(case(kind, "cell_gradient-steps-valid", shapes={"cell_gradient": (T, N, DH)}))
        out.append(case(kind, "cell_gradient-none-valid", shapes={"cell_gradient": None}))

    # -- the forward's inputs are checked as the forward checks them (spot checks) --------
    out.append(shape_error(kind, "init_state", (N, DH + 1), (N, DH)))
    out.append(shape_error(kind, "bias", (GATES[kind] * H + 1,), (GATES[kind] * H,)))
    out.append(shape_error(kind, "input_weight", (GATES[kind] * H, I + 1), (GATES[kind] * H, I)))
    out.append(
        shape_error(kind, "recurrent_weight", (GATES[kind] * H + 1, H), (GATES[kind] * H, H))
    )
    out.append(shape_error(kind, "mask", (T, N, DH), (N, DH)))
    out.append(shape_error(kind, "mask", (N + 1, DH), (N, DH)))
    if kind == "lstm":
        out.append(shape_error(kind, "init_cell", (N + 1, DH), (N, DH)))
        out.append(shape_error(kind, "peephole", (3 * H,), (4 * H,)))
        out.append(shape_error(kind, "peephole", (4 * H,), (2, 4 * H), bidirectional=True))
    if kind == "gru":
        # Ignored without reset_after, but its shape is still checked.
        out.append(shape_error(kind, "secondary_bias", (H + 1,), (H,)))
        out.append(shape_error(kind, "secondary_bias", (H + 1,), (H,), reset_after=True))
    with_n1 = r"\(\d+, " + str(N + 1) + r"\b|\(" + str(N + 1) + ","  # a shape with N+1
    out.append(bad_input.other_batch(case, kind, with_n1))

    # -- dtypes ------------------------------------------------------------------------------
    out += bad_input.dtype_errors(case, kind, base, ("int32", "int64"))
    for name in ("source_gradient", "z_state", "state_gradient"):
        out.append(bad_input.float32_among_float64(case, kind, name, base))
    for dt in ("uint8", "bool", "float16", "complex64", "complex128"):
        tag = f"z_state-{dt}"
        out.append(bad_input.dtype_error(case, kind, tag, "z_state", {"z_state": dt}, dt))
    out.append(case(kind, "all-float64-valid", dtypes={n: "float64" for n in base}))
    out.append(case(kind, "valid"))
    out.append(case(kind, "valid", bidirectional=True))

    return unique(out)


CASES = [c for kind in KINDS for c in cases_for(kind)]


def call(kind, args, desc, device=None):
    args = dict(args)
    positional = [args.pop(n) for n in POSITIONAL[kind]]
    return getattr(rnncore, OP[kind])(*positional, **args, descriptor=desc, device=device)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_gradient_input_validation(rng, device, c):
    args = build_args(rng, c)
    desc = descriptor(c.kind, **c.flags)
    dtype = np.dtype(c.dtypes.get("source", "float32"))
    if c.exc is None and dtype == np.float64 and device != "cpu":
        # A valid float64 call on a float32-only device: TypeError naming op and device.
        with pytest.raises(TypeError, match=rf"\[{OP[c.kind]}\] device '{device}'"):
            call(c.kind, args, desc, device)
        return
    if c.exc is None:
        grads = call(c.kind, args, desc, device)
        for field, value in zip(grads._fields, grads):
            assert value.shape == c.shapes[field], field
            assert value.dtype == dtype, field
        return
    with pytest.raises(c.exc) as info:
        call(c.kind, args, desc, device)
    message = str(info.value)
    assert re.match(op_re(c.kind), message), f"message does not start with [{OP[c.kind]}]"
    assert re.match(all_of(*c.pieces), message), f"message lacks {c.pieces}: {message}"


def test_case_table_covers_every_argument():
    """Every argument of every gradient op has a shape or rank case and dtype cases."""
    for kind in KINDS:
        ids = {c.id for c in CASES if c.kind == kind}
        for name in base_shapes(kind):
            for tag in ("int32", "int64", "float64-among-float32"):
                assert f"{kind}-{name}-{tag}" in ids, (kind, name, tag)
        for name in POSITIONAL[kind][2:] + ("state_gradient",):
            assert any(i.startswith(f"{kind}-{name}[") for i in ids), (kind, name)


# ---- a real forward run configured differently from the gradient op's descriptor ------


def forward_then_gradients(rng, kind, forward_flags, gradient_flags, device):
    """The training state of a real forward run handed to a differently configured
    gradient op."""
    fwd_desc = descriptor(kind, training=True, **forward_flags)
    shapes = base_shapes(kind, forward_flags.get("bidirectional", False))
    inputs = {
        n: rand(rng, shapes[n], "float32")
        for n in ("source", "recurrent_weight", "input_weight", "bias")
    }
    fwd = getattr(rnncore, _ops.KINDS[kind].forward)(**inputs, descriptor=fwd_desc, device=device)
    D = 2 if gradient_flags.get("bidirectional", False) else 1
    gshapes = base_shapes(kind, D == 2)
    args = {
        "source": inputs["source"],
        "recurrent_weight": rand(rng, gshapes["recurrent_weight"], "float32"),
        "input_weight": rand(rng, gshapes["input_weight"], "float32"),
        "source_gradient": rand(rng, (T, N, D * H), "float32"),
        "z_state": fwd.z_state,
    }
    if kind == "lstm":
        args["cell_output_fwd"] = rand(rng, (T, N, D * H), "float32")
    if kind == "gru":
        args["output_fwd"] = rand(rng, (T, N, D * H), "float32")
    return fwd.z_state.shape, lambda: call(kind, args, descriptor(kind, **gradient_flags), device)


MISCONFIGURED = [
    ("gru", {"reset_after": True}, {}),
    ("gru", {}, {"reset_after": True}),
    ("gru", {"reset_after": True, "bidirectional": True}, {"bidirectional": True}),
    ("rnn", {"bidirectional": True}, {}),
    ("lstm", {"bidirectional": True}, {}),
    ("gru", {"bidirectional": True}, {}),
    ("rnn", {}, {"bidirectional": True}),
    ("lstm", {}, {"bidirectional": True}),
    ("gru", {}, {"bidirectional": True}),
]


@pytest.mark.parametrize(
    ("kind", "forward_flags", "gradient_flags"),
    MISCONFIGURED,
    ids=[f"{k}-{sorted(f)}-to-{sorted(g)}" for k, f, g in MISCONFIGURED],
)
def test_training_state_of_another_configuration(rng, device, kind, forward_flags, gradient_flags):
    got, run = forward_then_gradients(rng, kind, forward_flags, gradient_flags, device)
    D = 2 if gradient_flags.get("bidirectional", False) else 1
    want = (T, N, D * z_width(kind, gradient_flags.get("reset_after", False)) * H)
    with pytest.raises(ValueError) as info:
        run()
    message = str(info.value)
    assert re.match(op_re(kind), message), message
    assert re.match(all_of(name_re("z_state"), shape_re(got), shape_re(want)), message), message


# ---- arguments that are not arrays, and other misuse: TypeError, never a crash ----------

NOT_ARRAYS = [
    pytest.param("abc", id="str"),
    pytest.param([[0.1, 0.2], [0.3]], id="ragged-list"),
    pytest.param(np.zeros((2, 2), dtype=object), id="object-array"),
    pytest.param(object(), id="object"),
    pytest.param(0.5, id="float"),
]


@pytest.mark.parametrize("value", NOT_ARRAYS)
@pytest.mark.parametrize("name", ["source_gradient", "z_state", "state_gradient", "output"])
@pytest.mark.parametrize("kind", KINDS)
def test_non_array_arguments_raise_type_error(rng, device, kind, name, value):
    args = build_args(rng, case(kind, "x"))
    if name == "output":
        name = {"rnn": "mask", "lstm": "cell_output_fwd", "gru": "output_fwd"}[kind]
    args[name] = value
    with pytest.raises(TypeError):
        call(kind, args, descriptor(kind), device)


@pytest.mark.parametrize("kind", KINDS)
def test_missing_required_array_raises_type_error(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    for name in POSITIONAL[kind]:
        with pytest.raises(TypeError):
            call(kind, dict(args, **{name: None}), descriptor(kind), device)


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_descriptor_type_raises_type_error(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    for other in KINDS:
        if other != kind:
            with pytest.raises(TypeError):
                call(kind, args, descriptor(other), device)
    for bad in ({"reverse": True}, 1, "gru"):
        with pytest.raises(TypeError):
            call(kind, args, bad, device)


@pytest.mark.parametrize("kind", KINDS)
def test_non_finite_values_do_not_crash(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    args["z_state"][0, 0, 0] = np.nan
    args["z_state"][1, 1, 1] = np.inf
    args["source_gradient"][2, 0, 0] = -np.inf
    grads = call(kind, args, descriptor(kind), device)
    assert grads.source.shape == (T, N, I)


@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_arguments_are_read_correctly(rng, device, kind):
    """Strided views (a transposed copy read back, every other step) give the same
    gradients as contiguous copies; they are copied, not refused."""
    args = build_args(rng, case(kind, "x"))
    expected = call(kind, args, descriptor(kind), device)
    strided = dict(args)
    for name in ("source_gradient", "z_state"):
        wide = np.zeros((2 * T,) + args[name].shape[1:], np.float32)
        wide[::2] = args[name]
        strided[name] = wide[::2]
    strided["recurrent_weight"] = np.asfortranarray(args["recurrent_weight"])
    actual = call(kind, strided, descriptor(kind), device)
    for field, a, e in zip(expected._fields, actual, expected):
        np.testing.assert_array_equal(a, e, err_msg=field)

"""Bad inputs to the forward ops: every one is refused with the right exception and a
message naming the operation, the argument, the shape it got and the shape it needs
(docs/api.md "Arrays", docs/semantics.md "Shapes"); nothing crashes.

The checks are table-driven: ``CASES`` holds one ``bad_input.Case`` per bad (or borderline
but valid) input, built from a valid base call by replacing some of its arguments.
"""

import re

import bad_input
import numpy as np
import pytest
from bad_input import H, I, N, T, all_of, build_args, name_re, rand, shape_re, unique
from cases import ACTIVATION_FIELDS, GATES, KINDS, input_shapes, z_width
from cases import make_descriptor as descriptor

import rnncore
from rnncore import _ops, reference


def base_shapes(kind, bidirectional=False, input_weight=True):
    """Shapes of a valid call with every input of `kind` given, in signature order."""
    return input_shapes(
        kind, T=T, N=N, H=H, I=I if input_weight else None, bidirectional=bidirectional
    )


# ---- message patterns ---------------------------------------------------------------


def op_re(kind):
    return r"\[" + _ops.KINDS[kind].forward + r"\]"


def rank_re(rank, shape):
    """The expected part of a rank error: 'rank 3' (any wording) or the full shape."""
    alternatives = [r"rank\W*" + str(rank) + r"\b", r"\b" + str(rank) + r"-?D\b"]
    if shape is not None:
        alternatives.append(shape_re(shape))
    return "|".join(alternatives)


# ---- cases ---------------------------------------------------------------------------


def case(kind, tag, *, bidirectional=False, input_weight=True, flags=None, **kw):
    """A call of `kind` with base_shapes(...) updated by `shapes` (see bad_input.case)."""
    f = dict(flags or {})
    if bidirectional:
        f["bidirectional"] = True
        tag = "bi-" + tag
    base = base_shapes(kind, bidirectional, input_weight)
    return bad_input.case(kind, tag, base, flags=f, **kw)


def shape_error(kind, name, got, want, **kw):
    """A ValueError naming `name`, `got` and `want`."""
    return bad_input.shape_error(case, kind, name, got, want, **kw)


def cases_for(kind):
    out = []
    base = base_shapes(kind)
    GH, DH = GATES[kind] * H, H
    others = [n for n in base if n not in ("source", "recurrent_weight")]

    # -- wrong rank ---------------------------------------------------------------------
    for got in [(T, N), (T, N, I, 1), (T * N * I,)]:
        out.append(
            case(
                kind,
                f"source-rank{len(got)}",
                shapes={"source": got},
                exc=ValueError,
                pieces=(name_re("source"), shape_re(got), rank_re(3, None)),
            )
        )
    for got in [(1, GH, H), (GH,), (2, GH, H)]:
        out.append(
            case(
                kind,
                f"recurrent_weight-rank{len(got)}-uni",
                shapes={"recurrent_weight": got},
                exc=ValueError,
                pieces=(name_re("recurrent_weight"), shape_re(got), rank_re(2, (GH, H))),
            )
        )
    for name in others:
        shape = base[name]
        for got in [(1, *shape), shape[:-1]]:
            if name == "mask" and len(got) < 2:
                continue  # a lower-rank mask may broadcast; see the mask cases
            out.append(shape_error(kind, name, got, (N, DH) if name == "mask" else shape))

    # -- wrong size along each axis ------------------------------------------------------
    for name in others:
        shape = base[name]
        for axis in range(len(shape)):
            got = tuple(s + 1 if a == axis else s for a, s in enumerate(shape))
            out.append(shape_error(kind, name, got, (N, DH) if name == "mask" else shape))
    for got in [(GH + 1, H), (GH - 1, H)]:
        out.append(shape_error(kind, "recurrent_weight", got, (GH, H)))
    # A wrong H in the recurrent weight's last axis redefines H; only the received shape
    # is certain to be in the message.
    got = (GH, H + 1)
    out.append(
        case(
            kind,
            "recurrent_weight-H+1",
            shapes={"recurrent_weight": got},
            exc=ValueError,
            pieces=(name_re("recurrent_weight"), shape_re(got)),
        )
    )
    # The source defines T, N and I: a longer source is valid; another N or I makes the
    # arguments that depend on it wrong.
    out.append(case(kind, "source-T+1-valid", shapes={"source": (T + 1, N, I)}))
    names = "|".join(name_re(n) for n in ("init_state", "init_cell", "mask"))
    out.append(bad_input.other_batch(case, kind, names, shape_re((N + 1, DH)), shape_re((N, DH))))
    out.append(
        case(
            kind,
            "source-I+1",
            shapes={"source": (T, N, I + 1)},
            exc=ValueError,
            pieces=(name_re("input_weight"), shape_re((GH, I + 1)), shape_re((GH, I))),
        )
    )

    # -- dtypes ----------------------------------------------------------------------------
    out += bad_input.dtype_errors(case, kind, base, ("int32", "complex64"))
    out.append(bad_input.float32_among_float64(case, kind, "init_state", base))
    for dt in ("int64", "uint8", "bool", "float16", "complex128"):
        out.append(bad_input.dtype_error(case, kind, f"source-{dt}", "source", {"source": dt}, dt))

    # -- bidirectional -------------------------------------------------------------------
    bi = base_shapes(kind, bidirectional=True)
    out.append(
        case(
            kind,
            "rank2-recurrent_weight",
            bidirectional=True,
            shapes={"recurrent_weight": (GH, H)},
            exc=ValueError,
            pieces=(name_re("recurrent_weight"), shape_re((GH, H)), rank_re(3, (2, GH, H))),
        )
    )
    out.append(shape_error(kind, "recurrent_weight", (3, GH, H), (2, GH, H), bidirectional=True))
    out.append(shape_error(kind, "recurrent_weight", (1, GH, H), (2, GH, H), bidirectional=True))
    # Unidirectional shapes given to a bidirectional layer (each but the weight).
    uni = base_shapes(kind)
    for name in others:
        if name == "mask":
            continue  # (N, H) does not broadcast to (N, 2H): below
        out.append(shape_error(kind, name, uni[name], bi[name], bidirectional=True))
    out.append(shape_error(kind, "mask", (N, H), (N, 2 * H), bidirectional=True))

    # -- mask ----------------------------------------------------------------------------
    for got in [(T, N, DH), (1, 1, DH), (T, N, DH, 1)]:
        out.append(shape_error(kind, "mask", got, (N, DH)))
    for got in [(N,), (DH + 1,), (2, DH), (N, 2), (N + 1, 1), (1, DH + 1)]:
        out.append(shape_error(kind, "mask", got, (N, DH)))
    for got in [(), (1,), (DH,), (1, DH), (N, 1), (1, 1), (N, DH)]:
        out.append(case(kind, f"mask{list(got)}-valid", shapes={"mask": got}))
    for got in [(), (2 * H,), (N, 1), (1, 2 * H)]:
        out.append(
            case(kind, f"bi-mask{list(got)}-valid", bidirectional=True, shapes={"mask": got})
        )

    # -- op-specific extra inputs ----------------------------------------------------------
    if kind == "lstm":
        for got in [(4 * H + 1,), (3 * H,), (H,), (2, 4 * H), (1, 4 * H), (4, H)]:
            out.append(shape_error(kind, "peephole", got, (4 * H,)))
        for got in [(4 * H,), (1, 4 * H), (2, 4 * H + 1), (8 * H,)]:
            out.append(shape_error(kind, "peephole", got, (2, 4 * H), bidirectional=True))
    if kind == "gru":
        for got in [(H + 1,), (2 * H,), (1, H), (3 * H,), ()]:
            out.append(shape_error(kind, "secondary_bias", got, (H,)))
        for got in [(H,), (2, H), (2 * H + 1,)]:
            out.append(shape_error(kind, "secondary_bias", got, (2 * H,), bidirectional=True))
        # secondary_bias is ignored without reset_after, but its shape is still checked.
        out.append(
            case(
                kind,
                "secondary_bias-reset_after",
                flags={"reset_after": True},
                shapes={"secondary_bias": (H + 1,)},
                exc=ValueError,
                pieces=(name_re("secondary_bias"), shape_re((H + 1,)), shape_re((H,))),
            )
        )

    # -- source without input weight -------------------------------------------------------
    out.append(
        case(
            kind,
            "no-input_weight-source",
            input_weight=False,
            shapes={"source": (T, N, I)},
            exc=ValueError,
            pieces=(name_re("source"), shape_re((T, N, I)), shape_re((T, N, GH))),
        )
    )
    out.append(
        case(
            kind,
            "no-input_weight-source",
            input_weight=False,
            bidirectional=True,
            shapes={"source": (T, N, GH)},
            exc=ValueError,
            pieces=(name_re("source"), shape_re((T, N, GH)), shape_re((T, N, 2 * GH))),
        )
    )
    out.append(case(kind, "no-input_weight-valid", input_weight=False))
    out.append(case(kind, "no-input_weight-valid", input_weight=False, bidirectional=True))
    required_only = {n: None for n in others if n != "input_weight"}
    out.append(case(kind, "only-required", input_weight=False, shapes=required_only))
    return unique(out)


CASES = [c for kind in KINDS for c in cases_for(kind)]


def call(kind, args, desc, device):
    return getattr(rnncore, _ops.KINDS[kind].forward)(**args, descriptor=desc, device=device)


def expected_state_shape(c):
    D = 2 if c.flags.get("bidirectional") else 1
    T_, N_ = c.shapes["source"][:2]
    return (T_, N_, D * H)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_forward_input_validation(rng, device, c):
    args = build_args(rng, c)
    desc = descriptor(c.kind, **c.flags)
    if c.exc is None:
        result = call(c.kind, args, desc, device)
        assert result.state.shape == expected_state_shape(c)
        assert result.state.dtype == np.float32
        expected = getattr(reference, _ops.KINDS[c.kind].forward)(**args, descriptor=desc)
        err = np.linalg.norm(result.state - expected.state) / max(
            np.linalg.norm(expected.state), 1e-30
        )
        assert err < 1e-5
        return
    with pytest.raises(c.exc, match=all_of(op_re(c.kind), *c.pieces)):
        call(c.kind, args, desc, device)


def test_case_table_covers_every_argument():
    """Every argument of every op has a rank, a size and a dtype case."""
    for kind in KINDS:
        ids = {c.id for c in CASES if c.kind == kind}
        for name in base_shapes(kind):
            for tag in ("int32", "complex64", "float64-among-float32"):
                assert f"{kind}-{name}-{tag}" in ids
            assert any(i.startswith(f"{kind}-{name}[") or f"-{name}-rank" in i for i in ids)


# ---- arguments that are not arrays -----------------------------------------------------

NOT_ARRAYS = [
    pytest.param("abc", id="str"),
    pytest.param([[0.1, 0.2], [0.3]], id="ragged-list"),
    pytest.param(np.zeros((2, 2), dtype=object), id="object-array"),
    pytest.param({"a": 1}, id="dict"),
    pytest.param(object(), id="object"),
    pytest.param(b"bytes", id="bytes"),
]


@pytest.mark.parametrize("value", NOT_ARRAYS)
@pytest.mark.parametrize("name", ["source", "recurrent_weight", "init_state", "mask"])
@pytest.mark.parametrize("kind", KINDS)
def test_non_array_arguments_raise_type_error(rng, device, kind, name, value):
    c = case(kind, "x")
    args = build_args(rng, c)
    args[name] = value
    with pytest.raises(TypeError):
        call(kind, args, None, device)


@pytest.mark.parametrize("kind", KINDS)
def test_nested_list_raises_type_error(rng, device, kind):
    """A (well-shaped) nested list is not an array: TypeError, not a crash."""
    args = build_args(rng, case(kind, "x"))
    args["source"] = args["source"].tolist()
    with pytest.raises(TypeError):
        call(kind, args, None, device)


@pytest.mark.parametrize("kind", KINDS)
def test_missing_required_array_raises_type_error(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    with pytest.raises(TypeError):
        call(kind, dict(args, source=None), None, device)
    with pytest.raises(TypeError):
        call(kind, dict(args, recurrent_weight=None), None, device)


@pytest.mark.parametrize("kind", KINDS)
def test_python_scalars_raise_type_error(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    for name in ("source", "bias", "mask"):
        with pytest.raises(TypeError):
            call(kind, dict(args, **{name: 0.5}), None, device)


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_descriptor_type_raises_type_error(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    wrong = [k for k in KINDS if k != kind]
    for other in wrong:
        with pytest.raises(TypeError):
            call(kind, args, descriptor(other), device)
    for bad in ({"reverse": True}, "gru", 1, True):
        with pytest.raises(TypeError):
            call(kind, args, bad, device)


@pytest.mark.parametrize("kind", KINDS)
def test_non_native_byte_order_is_read_correctly_or_refused(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    expected = call(kind, args, None, device).state
    swapped = dict(args, source=args["source"].astype(">f4" if np.little_endian else "<f4"))
    try:
        result = call(kind, swapped, None, device)
    except (TypeError, ValueError):
        return
    np.testing.assert_array_equal(result.state, expected)


@pytest.mark.parametrize("kind", KINDS)
def test_non_finite_values_do_not_crash(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    args["source"][0, 0, 0] = np.nan
    args["source"][1, 1, 1] = np.inf
    args["recurrent_weight"].flat[0] = -np.inf
    result = call(kind, args, descriptor(kind, training=True), device)
    assert result.state.shape == (T, N, H)


# ---- descriptors with bad values ---------------------------------------------------------


@pytest.mark.parametrize(("kind", "field"), [(k, f) for k in KINDS for f in ACTIVATION_FIELDS[k]])
@pytest.mark.parametrize("value", [5, -1, 7, 2**31, -(2**40), 2**70])
def test_out_of_range_activation_raises_value_error(kind, field, value):
    cls = getattr(rnncore, _ops.KINDS[kind].descriptor)
    with pytest.raises(ValueError, match=name_re(field)):
        cls(**{field: value})
    d = cls()
    before = getattr(d, field)
    with pytest.raises(ValueError, match=name_re(field)):
        setattr(d, field, value)
    assert getattr(d, field) == before


# ---- zero sizes ----------------------------------------------------------------------------


def zero_size_inputs(rng, kind, T_, N_, bidirectional, with_init):
    shapes = base_shapes(kind, bidirectional)
    shapes["source"] = (T_, N_, I)
    for name in ("init_state", "init_cell", "mask"):
        if name in shapes:
            shapes[name] = (N_, shapes[name][1]) if with_init else None
    return {n: rand(rng, s, "float32") for n, s in shapes.items() if s is not None}


@pytest.mark.parametrize("with_init", [False, True], ids=["no-init", "init"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize(("T_", "N_"), [(0, N), (T, 0), (0, 0)], ids=["T0", "N0", "T0N0"])
@pytest.mark.parametrize("kind", KINDS)
def test_zero_sizes(rng, device, kind, T_, N_, bidirectional, with_init):
    D = 2 if bidirectional else 1
    flags = {"bidirectional": bidirectional, "training": True}
    if kind == "gru":
        flags["reset_after"] = True
    args = zero_size_inputs(rng, kind, T_, N_, bidirectional, with_init)
    result = call(kind, args, descriptor(kind, **flags), device)
    assert result.state.shape == (T_, N_, D * H)
    assert result.state.dtype == np.float32
    assert result.z_state.shape == (T_, N_, D * z_width(kind, reset_after=True) * H)
    if kind == "lstm":
        assert result.cell.shape == (T_, N_, D * H)


@pytest.mark.parametrize("kind", KINDS)
def test_zero_time_steps_with_wrong_init_state_is_still_refused(rng, device, kind):
    args = zero_size_inputs(rng, kind, 0, N, False, True)
    args["init_state"] = rand(rng, (N, H + 1), "float32")
    with pytest.raises(ValueError, match=all_of(op_re(kind), name_re("init_state"))):
        call(kind, args, None, device)


@pytest.mark.parametrize("kind", KINDS)
def test_zero_input_features(rng, device, kind):
    """I = 0 with an input weight [G*H, 0]: x' is just the bias."""
    args = build_args(rng, case(kind, "x", shapes={"source": (T, N, 0)}))
    args["input_weight"] = np.zeros((GATES[kind] * H, 0), np.float32)
    result = call(kind, args, None, device)
    expected = getattr(reference, _ops.KINDS[kind].forward)(**args)
    np.testing.assert_allclose(result.state, expected.state, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", KINDS)
def test_zero_hidden_size_does_not_crash(device, kind, bidirectional):
    """H = 0 (a [0, 0] recurrent weight): empty outputs [T, N, 0], or a ValueError."""
    r_shape = (2, 0, 0) if bidirectional else (0, 0)
    args = {
        "source": np.zeros((T, N, I), np.float32),
        "recurrent_weight": np.zeros(r_shape, np.float32),
        "input_weight": np.zeros((0, I), np.float32),
        "init_state": np.zeros((N, 0), np.float32),
    }
    desc = descriptor(kind, bidirectional=bidirectional, training=True)
    try:
        result = call(kind, args, desc, device)
    except ValueError:
        return
    assert result.state.shape == (T, N, 0)
    assert result.z_state.shape == (T, N, 0)


# ---- descriptor=None and devices --------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_none_descriptor_means_defaults(rng, device, kind):
    args = build_args(rng, case(kind, "x"))
    a = call(kind, args, None, device)
    b = call(kind, args, descriptor(kind), device)
    np.testing.assert_array_equal(a.state, b.state)
    assert a.z_state is None
    # No descriptor argument at all.
    c = getattr(rnncore, _ops.KINDS[kind].forward)(**args, device=device)
    np.testing.assert_array_equal(a.state, c.state)


@pytest.mark.parametrize("name", ["nonsense", "gpu", "tpu", "cpu0"])
@pytest.mark.parametrize("kind", KINDS)
def test_unknown_device_raises_value_error(rng, kind, name):
    args = build_args(rng, case(kind, "x"))
    with pytest.raises(ValueError, match=re.escape(name)):
        call(kind, args, None, name)


@pytest.mark.parametrize("kind", KINDS)
def test_device_of_wrong_type_raises_type_error(rng, kind):
    args = build_args(rng, case(kind, "x"))
    for bad in (0, 1.5, ["cpu"]):
        with pytest.raises(TypeError):
            call(kind, args, None, bad)


def test_devices_lists_cpu():
    devices = rnncore.devices()
    assert isinstance(devices, list)
    assert all(isinstance(d, str) for d in devices)
    assert "cpu" in devices


def test_unknown_device_in_environment_raises_value_error(rng, monkeypatch):
    args = build_args(rng, case("gru", "x"))
    monkeypatch.setenv("RNNCORE_DEVICE", "nonsense")
    with pytest.raises(ValueError, match="nonsense"):
        call("gru", args, None, None)
    monkeypatch.setenv("RNNCORE_DEVICE", "cpu")
    assert call("gru", args, None, None).state.shape == (T, N, H)

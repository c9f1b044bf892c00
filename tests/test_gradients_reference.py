"""Gradient ops against rnncore.reference (float64 numpy) over flags, inputs and sizes.

Each side is fed as a user would feed it: rnncore's gradient op with the training state of
rnncore's forward (in the inputs' dtype), the reference's with the reference's (float64),
on the same rounded inputs. float16, and bfloat16 on Metal, are the exception: there the
state each step feeds the next is itself stored in the 16-bit type, which alone moves
ill-conditioned gradients by more than the tolerance (measured: a float32 computation from
the float16-rounded state of an H = 1 LSTM misses dinit_state by up to 4%; a bfloat16 ReLU
RNN's dsource on the emulator by 13%), so the reference then gets rnncore's training state.
Every gradient is compared within GRADIENT_TOL of the dtype; every field must have its
input's shape and dtype, or be None when the input was not given. Zero sizes (T = 0,
N = 0) follow the contract's rules for them.
"""

import itertools
from types import SimpleNamespace

import cases
import numpy as np
import pytest
from cases import (
    AWKWARD_SIZES,
    CELL_GRADIENT_FORMS,
    DISTINCT_ACTIVATIONS,
    DTYPES,
    GRADIENT_FIELDS,
    KINDS,
    OPTIONAL_INPUTS,
    activation_cases,
    as_float64,
    check_gradient_layout,
    check_gradients_close,
    cotangents_like,
    flag_cases,
    full_descriptor,
    gradient_op,
    gradient_tol,
    make_cotangents,
    make_descriptor,
    make_inputs,
    run_gradients,
    size_ids,
    skip_unsupported,
    supported,
    training_forward,
)

import rnncore
from rnncore import _ops, reference

T_, N_, I_, H_ = 4, 3, 5, 6


def reference_gradients(kind, inputs, desc, cot, dtype, device):
    """The reference's gradients (float64) for rnncore's call on the same inputs; for
    float16, and bfloat16 off the CPU, from rnncore's own training state (see the module
    docstring)."""
    forward = None
    if np.dtype(dtype) == np.float16 or (np.dtype(dtype) == cases.BFLOAT16 and device != "cpu"):
        ours = training_forward(rnncore, kind, inputs, desc, device=device)
        forward = SimpleNamespace(
            **{
                f: None if v is None else np.asarray(v, np.float64)
                for f, v in ours._asdict().items()
            }
        )
    expected, _ = run_gradients(
        reference, kind, as_float64(inputs), desc, as_float64(cot), forward=forward
    )
    return expected


def compare(
    rng,
    device,
    kind,
    dtype,
    desc,
    *,
    T=T_,
    N=N_,
    H=H_,
    state_gradient=False,
    cell_gradient=None,
    **input_options,
):
    """rnncore's gradients (dtype) against the reference's (float64) on the same inputs."""
    skip_unsupported(device, dtype)
    bi = desc.bidirectional
    inputs = make_inputs(rng, kind, T=T, N=N, H=H, bidirectional=bi, dtype=dtype, **input_options)
    cot = cotangents_like(
        rng, kind, inputs, state_gradient=state_gradient, cell_gradient=cell_gradient
    )
    before = {k: v.copy() for k, v in {**inputs, **cot}.items()}
    actual, _ = run_gradients(rnncore, kind, inputs, desc, cot, device=device)
    for k, v in {**inputs, **cot}.items():  # the inputs are read, never written
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} was modified")
    expected = reference_gradients(kind, inputs, desc, cot, dtype, device)
    what = f"{kind} {desc!r} cot={sorted(cot)}"
    check_gradient_layout(actual, kind, inputs, dtype, what)
    check_gradients_close(actual, expected, kind, gradient_tol(dtype), what)
    return inputs, cot, actual


def all_inputs(kind):
    return cases.all_inputs(kind, I_)


def all_cotangents(kind, k=0):
    """state_gradient, and for the LSTM a cell gradient (final or per step, by k)."""
    return {"state_gradient": True, "cell_gradient": ("final", "steps")[k % 2]}


# --------------------------------------------------------------------------------------
# Every flag combination (training included: the gradient ops must ignore it)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("given", ["all-inputs", "no-optional-inputs"])
@pytest.mark.parametrize(("kind", "flags", "k"), list(flag_cases(with_index=True)))
def test_every_flag_combination_matches_reference(rng, device, kind, flags, k, given, dtype):
    desc = make_descriptor(kind, **flags)
    if given == "all-inputs":
        options = {**all_inputs(kind), **all_cotangents(kind, k)}
    else:
        options = {}
    compare(rng, device, kind, dtype, desc, **options)


# --------------------------------------------------------------------------------------
# Each optional input, and each optional cotangent, on its own
# --------------------------------------------------------------------------------------


def optional_input_cases():
    """Each optional input, and each optional cotangent, on its own."""
    for kind in KINDS:
        yield from cases.optional_input_cases(kind, I_)
        yield pytest.param(kind, {"state_gradient": True}, id=f"{kind}-state_gradient")
    for form in ("final", "steps"):
        yield pytest.param("lstm", {"cell_gradient": form}, id=f"lstm-cell_gradient_{form}")
        yield pytest.param(
            "lstm",
            {"cell_gradient": form, "state_gradient": True, "init_cell": True},
            id=f"lstm-cell_gradient_{form}-state_gradient-init_cell",
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize(("kind", "options"), list(optional_input_cases()))
def test_each_optional_input_matches_reference(rng, device, kind, options, bidirectional, dtype):
    # GRU with reset_after so that secondary_bias matters (reset_after = False is below).
    compare(rng, device, kind, dtype, full_descriptor(kind, bidirectional=bidirectional), **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_secondary_bias_without_reset_after_gets_zeros(rng, device, reverse, bidirectional, dtype):
    desc = make_descriptor("gru", reverse=reverse, bidirectional=bidirectional)
    options = {**all_inputs("gru"), "state_gradient": True}
    inputs, _, grads = compare(rng, device, "gru", dtype, desc, **options)
    assert grads.secondary_bias.shape == inputs["secondary_bias"].shape
    assert grads.secondary_bias.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(grads.secondary_bias, 0)


# --------------------------------------------------------------------------------------
# Every activation on every gate
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(
    ("kind", "field", "activation", "k"), list(activation_cases(with_index=True))
)
def test_every_activation_on_every_gate_matches_reference(
    rng, device, kind, field, activation, k, dtype
):
    flags = {field: activation, "bidirectional": k % 2 == 1, "reverse": k % 3 == 1}
    if kind == "gru":
        flags.update(reset_after=k % 2 == 0, reset_gate_first=k % 4 < 2)
    if kind == "lstm":
        flags["forget_gate_last"] = k % 2 == 0
    options = {**all_inputs(kind), **all_cotangents(kind, k)}
    compare(rng, device, kind, dtype, make_descriptor(kind, **flags), **options)


def test_all_gates_with_distinct_activations_match_reference(rng, device):
    """One descriptor per op with every gate's activation different from its default."""
    for kind, fields in DISTINCT_ACTIVATIONS.items():
        dtypes = [d for d in DTYPES if supported(device, d)]
        for bidirectional, dtype in itertools.product((False, True), dtypes):
            desc = make_descriptor(kind, bidirectional=bidirectional, **fields)
            options = {**all_inputs(kind), **all_cotangents(kind, int(bidirectional))}
            compare(rng, device, kind, dtype, desc, **options)


# --------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------

# (T, N, I, H): T = 1, N = 1, H either side of 32, I != H, no input weight (I None), and
# a batch large enough to be split over threads.
SIZES = AWKWARD_SIZES + [(16, 16, 10, 64)]  # large enough for the CPU's threaded paths


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("size", SIZES, ids=size_ids(SIZES))
@pytest.mark.parametrize("kind", KINDS)
def test_awkward_sizes_match_reference(rng, device, kind, size, bidirectional, dtype):
    T, N, I, H = size  # noqa: E741
    options = {**all_inputs(kind), **all_cotangents(kind, T)}
    options["I"] = I
    desc = full_descriptor(kind, bidirectional=bidirectional)
    compare(rng, device, kind, dtype, desc, T=T, N=N, H=H, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_default_descriptor_matches_reference(rng, device, kind, dtype):
    """The gradient op requires its forward's descriptor (no default: a default would give
    the gradients of another operation); the defaults passed explicitly match the
    reference's descriptor=None."""
    skip_unsupported(device, dtype)
    inputs = make_inputs(rng, kind, T=T_, N=N_, H=H_, I=I_, dtype=dtype, bias=True)
    cot = make_cotangents(rng, kind, T=T_, N=N_, H=H_, dtype=dtype, state_gradient=True)
    fwd = training_forward(rnncore, kind, inputs, make_descriptor(kind), device=device)
    extra = {"rnn": (), "lstm": (getattr(fwd, "cell", None),), "gru": (fwd.state,)}[kind]
    args = (inputs["source"], inputs["recurrent_weight"], cot["source_gradient"], fwd.z_state)
    kwargs = dict(
        state_gradient=cot["state_gradient"],
        input_weight=inputs["input_weight"],
        bias=inputs["bias"],
        device=device,
    )
    with pytest.raises(TypeError, match="descriptor"):
        gradient_op(rnncore, kind)(*args, *extra, **kwargs)
    actual = gradient_op(rnncore, kind)(*args, *extra, descriptor=make_descriptor(kind), **kwargs)
    expected, _ = run_gradients(reference, kind, as_float64(inputs), None, as_float64(cot))
    check_gradient_layout(actual, kind, inputs, dtype, f"{kind} default descriptor")
    check_gradients_close(actual, expected, kind, gradient_tol(dtype), f"{kind} default descriptor")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_same_training_state_gives_the_reference_gradients(rng, device, kind, dtype):
    """Both gradient ops fed the very same training state (the reference's, rounded to
    dtype): the gradient op alone, without the forward's rounding."""
    skip_unsupported(device, dtype)
    desc = full_descriptor(kind, bidirectional=True)
    inputs = make_inputs(
        rng, kind, T=T_, N=N_, H=H_, bidirectional=True, dtype=dtype, **all_inputs(kind)
    )
    cot = cotangents_like(rng, kind, inputs, state_gradient=True, cell_gradient="steps")
    fwd64 = training_forward(reference, kind, as_float64(inputs), desc)
    fwd = type(fwd64)(*(None if a is None else a.astype(dtype) for a in fwd64))
    actual, _ = run_gradients(rnncore, kind, inputs, desc, cot, forward=fwd, device=device)
    fwd_rounded = type(fwd64)(*(None if a is None else a.astype(np.float64) for a in fwd))
    expected, _ = run_gradients(
        reference, kind, as_float64(inputs), desc, as_float64(cot), forward=fwd_rounded
    )
    check_gradients_close(actual, expected, kind, gradient_tol(dtype), f"{kind} same z_state")


# --------------------------------------------------------------------------------------
# Zero sizes
# --------------------------------------------------------------------------------------


def zero_case_inputs(rng, kind, T, N, bidirectional, dtype, with_init):
    options = all_inputs(kind)
    if not with_init:
        options.pop("init_state")
        options.pop("init_cell", None)
    return make_inputs(
        rng, kind, T=T, N=N, H=H_, bidirectional=bidirectional, dtype=dtype, **options
    )


def assert_weight_gradients_zero(grads, inputs, what):
    """No step and no batch row: nothing accumulates into the weights and biases."""
    for name in ("recurrent_weight", "input_weight", "bias", "peephole", "secondary_bias"):
        if name in inputs:
            assert not getattr(grads, name).any(), f"{what}: d{name} is not zero"


def zero_cases():
    for kind in KINDS:
        forms = CELL_GRADIENT_FORMS if kind == "lstm" else (None,)
        for sg, cg in itertools.product((False, True), forms):
            tag = f"{kind}-sg{int(sg)}-cg_{cg}"
            yield pytest.param(kind, sg, cg, id=tag)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("with_init", [False, True], ids=["no-init", "init"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize(("kind", "state_gradient", "cell_gradient"), list(zero_cases()))
def test_zero_time_steps(
    rng, device, kind, state_gradient, cell_gradient, bidirectional, with_init, dtype
):
    """T = 0: weight and bias gradients are zeros; dinit_state is state_gradient (zeros
    without one); dinit_cell the final-form cell_gradient (zeros otherwise)."""
    skip_unsupported(device, dtype)
    D = 2 if bidirectional else 1
    desc = full_descriptor(kind, bidirectional=bidirectional)
    inputs = zero_case_inputs(rng, kind, 0, N_, bidirectional, dtype, with_init)
    cot = cotangents_like(
        rng, kind, inputs, state_gradient=state_gradient, cell_gradient=cell_gradient
    )
    grads, _ = run_gradients(rnncore, kind, inputs, desc, cot, device=device)
    what = f"{kind} T=0"
    check_gradient_layout(grads, kind, inputs, dtype, what)
    assert grads.source.shape == (0, N_, I_)
    assert_weight_gradients_zero(grads, inputs, what)
    zeros = np.zeros((N_, D * H_), dtype)
    if with_init:
        np.testing.assert_array_equal(grads.init_state, cot.get("state_gradient", zeros))
        if kind == "lstm":
            expected = cot["cell_gradient"] if cell_gradient == "final" else zeros
            np.testing.assert_array_equal(grads.init_cell, expected)
    expected = reference_gradients(kind, inputs, desc, cot, dtype, device)
    check_gradients_close(grads, expected, kind, gradient_tol(dtype), what)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("T", [3, 0], ids=["T3", "T0"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", KINDS)
def test_zero_batch(rng, device, kind, bidirectional, T, dtype):
    """N = 0: empty source / state gradients; weight and bias gradients are zeros."""
    skip_unsupported(device, dtype)
    D = 2 if bidirectional else 1
    desc = full_descriptor(kind, bidirectional=bidirectional)
    inputs = zero_case_inputs(rng, kind, T, 0, bidirectional, dtype, True)
    for cg in CELL_GRADIENT_FORMS if kind == "lstm" else (None,):
        cot = cotangents_like(rng, kind, inputs, state_gradient=True, cell_gradient=cg)
        grads, fwd = run_gradients(rnncore, kind, inputs, desc, cot, device=device)
        assert fwd.state.shape == (T, 0, D * H_)
        check_gradient_layout(grads, kind, inputs, dtype, f"{kind} N=0")
        assert grads.source.shape == (T, 0, I_)
        assert grads.init_state.shape == (0, D * H_)
        assert_weight_gradients_zero(grads, inputs, f"{kind} N=0")


def test_every_gradient_field_is_checked():
    """The sweeps above name every field of every gradient result."""
    for kind in KINDS:
        result = getattr(rnncore, _ops.KINDS[kind].gradient_result.__name__)
        assert result._fields == GRADIENT_FIELDS[kind]
        fields = set(GRADIENT_FIELDS[kind]) - {"source", "recurrent_weight"}
        assert fields <= set(OPTIONAL_INPUTS[kind]), kind

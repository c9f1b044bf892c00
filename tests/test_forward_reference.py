"""Forward ops against rnncore.reference (float64 numpy) over flags, inputs and sizes.

Every output is compared (state, cell, z_state) within FORWARD_TOL of the inputs' dtype;
the reference always runs in float64 on the same (rounded) inputs.
"""

import cases
import numpy as np
import pytest
from cases import (
    AWKWARD_SIZES,
    BFLOAT16,
    DISTINCT_ACTIVATIONS,
    DTYPES,
    KINDS,
    activation_cases,
    as_float64,
    check_close,
    check_layout,
    flag_cases,
    forward_tol,
    full_descriptor,
    make_descriptor,
    make_inputs,
    optional_input_cases,
    run,
    size_ids,
    skip_unsupported,
)

import rnncore
from rnncore import reference

T_, N_, I_, H_ = 4, 3, 5, 6


def compare(rng, device, kind, dtype, desc, *, T=T_, N=N_, H=H_, **input_options):
    skip_unsupported(device, dtype)
    inputs = make_inputs(
        rng, kind, T=T, N=N, H=H, bidirectional=desc.bidirectional, dtype=dtype, **input_options
    )
    actual = run(rnncore, kind, inputs, desc, device=device)
    expected = run(reference, kind, as_float64(inputs), desc)
    what = f"{kind} {desc!r}"
    check_layout(actual, kind, desc, T, N, H, dtype, what)
    check_close(actual, expected, kind, forward_tol(dtype), what)


def all_inputs(kind):
    return cases.all_inputs(kind, I_)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("given", ["all-inputs", "no-optional-inputs"])
@pytest.mark.parametrize(("kind", "flags"), list(flag_cases()))
def test_every_flag_combination_matches_reference(rng, device, kind, flags, given, dtype):
    desc = make_descriptor(kind, **flags)
    options = all_inputs(kind) if given == "all-inputs" else {}
    compare(rng, device, kind, dtype, desc, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize(
    ("kind", "options"), [p for kind in KINDS for p in optional_input_cases(kind, I_)]
)
def test_each_optional_input_matches_reference(rng, device, kind, options, bidirectional, dtype):
    # training so that z_state (and the LSTM cell) are compared too; GRU with reset_after
    # so that secondary_bias matters (reset_after=False ignoring it is in the flag sweep).
    desc = full_descriptor(kind, bidirectional=bidirectional, training=True)
    compare(rng, device, kind, dtype, desc, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("kind", "field", "activation"), list(activation_cases()))
def test_every_activation_on_every_gate_matches_reference(
    rng, device, kind, field, activation, dtype
):
    desc = full_descriptor(kind, training=True, **{field: activation})
    compare(rng, device, kind, dtype, desc, **all_inputs(kind))


def test_all_gates_with_distinct_activations_match_reference(rng, device):
    """One descriptor per op with every gate's activation different from its default."""
    for kind, fields in DISTINCT_ACTIVATIONS.items():
        for bidirectional in (False, True):
            desc = make_descriptor(kind, training=True, bidirectional=bidirectional, **fields)
            compare(rng, device, kind, np.float32, desc, **all_inputs(kind))


@pytest.mark.parametrize(("kind", "flags"), list(flag_cases()))
def test_every_flag_combination_projected_in_the_steps_matches_reference(rng, kind, flags):
    """From 16 batch rows the CPU's float32 LSTM and GRU forwards project each step's source
    rows in the step (W packed beside R; the reset-before GRU in both of its phases)."""
    desc = make_descriptor(kind, **flags)
    compare(rng, "cpu", kind, np.float32, desc, N=17, H=31, **all_inputs(kind))


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, BFLOAT16], ids=lambda d: np.dtype(d).name
)
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("first", [False, True], ids=["default-order", "other-order"])
@pytest.mark.parametrize(("N", "H"), [(1, 64), (2, 32), (32, 48)], ids=["N1", "N2", "N32"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_one_pass_epilogues_in_either_gate_order_match_reference(
    rng, kind, N, H, first, training, dtype
):
    """The CPU's one-pass epilogues (default activations, no peephole, full panels: the LSTM's
    in every mode, the reset-after GRU's in inference) read each gate at the descriptor's
    offset: the LSTM's forget gate last or not, the GRU's reset gate first or not, at batch 1
    (a panel batch's rows), a small batch and a batch whose steps project their own rows."""
    flags = {"forget_gate_last": first} if kind == "lstm" else {"reset_gate_first": first}
    if kind == "gru":
        flags["reset_after"] = True
    desc = make_descriptor(kind, training=training, **flags)
    extra = {"secondary_bias": True} if kind == "gru" else {}
    compare(rng, "cpu", kind, dtype, desc, T=5, N=N, H=H, I=24, bias=True, **extra)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize(("T", "N", "I", "H"), AWKWARD_SIZES, ids=size_ids(AWKWARD_SIZES))
@pytest.mark.parametrize("kind", KINDS)
def test_awkward_sizes_match_reference(rng, device, kind, T, N, I, H, bidirectional, dtype):  # noqa: E741
    desc = full_descriptor(kind, bidirectional=bidirectional, training=True)
    options = all_inputs(kind)
    options["I"] = I
    compare(rng, device, kind, dtype, desc, T=T, N=N, H=H, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("N", [6, 7, 11, 13, 32])
def test_lstm_batch_rows_in_split_tiles_match_reference(rng, device, N, dtype):
    """With 16 vector registers (AVX2, generic) the CPU's LSTM products take 3-6 batch rows
    per tile, two gates at a time, and an odd N's last row alone: every row count's split."""
    desc = full_descriptor("lstm", bidirectional=True, training=True)
    options = all_inputs("lstm")
    options["I"] = 9
    compare(rng, device, "lstm", dtype, desc, T=3, N=N, H=33, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize(("T", "N"), [(0, 3), (4, 0), (0, 0)], ids=["T0", "N0", "T0-N0"])
@pytest.mark.parametrize("kind", KINDS)
def test_zero_sizes_give_empty_outputs_of_the_right_shape(
    rng, device, kind, T, N, bidirectional, training, dtype
):
    skip_unsupported(device, dtype)
    H = 5
    flags = {"bidirectional": bidirectional, "training": training}
    if kind == "lstm":
        flags["produce_cell"] = True
    desc = full_descriptor(kind, **flags)
    options = all_inputs(kind)
    inputs = make_inputs(
        rng, kind, T=T, N=N, H=H, bidirectional=bidirectional, dtype=dtype, **options
    )
    result = run(rnncore, kind, inputs, desc, device=device)
    check_layout(result, kind, desc, T, N, H, dtype, f"{kind} T={T} N={N}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_default_descriptor_matches_reference(rng, device, kind, dtype):
    skip_unsupported(device, dtype)
    inputs = make_inputs(rng, kind, T=T_, N=N_, H=H_, I=I_, dtype=dtype, bias=True)
    actual = run(rnncore, kind, inputs, None, device=device)
    expected = run(reference, kind, as_float64(inputs), None)
    default = make_descriptor(kind)
    check_layout(actual, kind, default, T_, N_, H_, dtype, f"{kind} descriptor=None")
    check_close(actual, expected, kind, forward_tol(dtype), f"{kind} descriptor=None")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", KINDS)
def test_saturating_pre_activations_match_reference(rng, device, kind, bidirectional, dtype):
    """Pre-activations of about +-100: sigmoid and tanh saturate without NaN or overflow."""
    skip_unsupported(device, dtype)
    flags = {"bidirectional": bidirectional, "training": True}
    if kind == "rnn":
        flags["activation"] = "SIGMOID"
    desc = make_descriptor(kind, **flags)
    inputs = make_inputs(
        rng, kind, T=T_, N=N_, H=H_, bidirectional=bidirectional, dtype=dtype, bias=True
    )
    inputs["source"] = (inputs["source"] * 100).astype(dtype)
    inputs["source"][0, 0, :4] = [100, -100, 1000, -1000]
    actual = run(rnncore, kind, inputs, desc, device=device)
    expected = run(reference, kind, as_float64(inputs), desc)
    check_close(actual, expected, kind, forward_tol(dtype), f"{kind} saturating")

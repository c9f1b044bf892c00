"""Gradient ops against central finite differences of rnncore's OWN forward ops (float64).

The loss is the one the gradient ops differentiate (semantics.md, "Gradient operations"):
    L = sum(h·source_gradient) + sum(final h·state_gradient)
        (+ sum(final c·cell_gradient) or sum(c·cell_gradient) for the LSTM)
where the final state of each direction is the contract's. Its central differences, with
rnncore's forward, are compared with rnncore's gradient ops fed with rnncore's training
state, within 1e-6 relative per gradient.

Small layers are perturbed element by element; for large H a few random directional
derivatives (d/dε L(θ + εv) against <dL/dθ, v>) keep the cost low. Inputs are redrawn
until every pre-activation is clear of the relu / hard_sigmoid kinks. float64 is a CPU
dtype, so this suite runs on device "cpu" whatever RNNCORE_DEVICE says.
"""

import itertools
import zlib

import cases
import numpy as np
import pytest
from cases import (
    ACTIVATION_FIELDS,
    DEFAULT_ACTIVATIONS,
    FD_MODES,
    FD_SIZES,
    GRADIENT_FIELDS,
    MASK_FORMS,
    FDCases,
    all_inputs,
    cotangent_loss,
    cotangents_like,
    draw_clear_of_kinks,
    elementwise_fd,
    make_descriptor,
    make_inputs,
    other_activations,
    run,
    run_gradients,
    training_forward,
    with_fields,
)
from util import assert_rel_close

import rnncore

FD_TOL = 1e-6
KINK_CLEARANCE = 1e-4
A = rnncore.Activation
SMALL_SIZES = FD_SIZES
MODES = FD_MODES


# --------------------------------------------------------------------------------------
# The loss, its finite differences, and clearance from the activation kinks
# --------------------------------------------------------------------------------------


def loss(kind, desc, inputs, cot):
    """L(inputs) with rnncore's forward (training off; the LSTM cell produced)."""
    fields = {"training": False}
    if kind == "lstm":
        fields["produce_cell"] = True
    out = run(rnncore, kind, inputs, with_fields(desc, **fields), device="cpu")
    return cotangent_loss(out, cot, inputs["recurrent_weight"].shape[-1], desc.bidirectional)


def directional_fd(f, x, v, eps=1e-5):
    """Central difference of the scalar f() along v (x perturbed in place, restored)."""
    orig = x.copy()
    x[...] = orig + eps * v
    plus = f()
    x[...] = orig - eps * v
    minus = f()
    x[...] = orig
    return (plus - minus) / (2 * eps)


def kink_distance(kind, desc, inputs):
    out = training_forward(rnncore, kind, inputs, desc, device="cpu")
    H = inputs["recurrent_weight"].shape[-1]
    return cases.kink_distance(kind, out, H, lambda field: getattr(desc, field))


def draw(seed, kind, desc, size, options):
    """Inputs and cotangents (float64) whose pre-activations are clear of the kinks."""
    T, N, H, I = size  # noqa: E741
    bi = desc.bidirectional
    input_options = all_inputs(kind, I)
    input_options.update({k: v for k, v in options.items() if k in input_options})
    inputs, rng = draw_clear_of_kinks(
        seed,
        lambda rng: make_inputs(rng, kind, T=T, N=N, H=H, bidirectional=bi, **input_options),
        lambda inputs: kink_distance(kind, desc, inputs),
        KINK_CLEARANCE,
    )
    cot = cotangents_like(
        rng,
        kind,
        inputs,
        state_gradient=options.get("state_gradient", True),
        cell_gradient=options.get("cell_gradient", "final"),
    )
    return inputs, cot


def analytic(kind, desc, inputs, cot):
    grads, _ = run_gradients(rnncore, kind, inputs, desc, cot, device="cpu")
    for field in GRADIENT_FIELDS[kind]:
        value = getattr(grads, field)
        if field not in inputs:
            assert value is None, f"d{field}: input not given but a gradient returned"
        else:
            assert value.shape == np.shape(inputs[field]), f"d{field} shape {value.shape}"
            assert value.dtype == np.float64, f"d{field} dtype {value.dtype}"
    return grads


def differentiable(kind, inputs):
    return [f for f in GRADIENT_FIELDS[kind] if f in inputs]


# --------------------------------------------------------------------------------------
# The sweep: flags, activations, optional inputs, cotangents (small sizes, every element)
# --------------------------------------------------------------------------------------


def fd_cases():
    """(id, kind, descriptor fields, options) for the element-by-element sweep."""
    cases = FDCases()
    add = cases.add
    modes = list(MODES.values())
    forms = ("final", "steps", None)

    # Single-gate RNN: every activation in every direction mode.
    for act, mode in itertools.product(range(5), modes):
        add("rnn", {**mode, "activation": act})
    add("rnn", {"bidirectional": True, "activation": A.TANH}, I=None, bias=False, init_state=False)
    add("rnn", {"reverse": True, "activation": A.TANH}, I=None, mask=None, state_gradient=False)
    add("rnn", {"activation": A.SIGMOID}, bias=False, state_gradient=False)

    # LSTM: direction modes x gate order, cycling through the cell-gradient forms.
    for k, (mode, fgl) in enumerate(itertools.product(modes, (False, True))):
        add("lstm", {**mode, "forget_gate_last": fgl}, cell_gradient=forms[k % 3])
    for cg, mode in itertools.product(forms, (MODES["rev"], MODES["bi"])):
        add("lstm", mode, cell_gradient=cg)
    add("lstm", MODES["bi"], cell_gradient="steps", state_gradient=False)
    # Every activation on every gate (and on the cell output).
    for k, field, act in other_activations("lstm"):
        fields = {**modes[k % 4], "forget_gate_last": k % 2 == 1, field: act}
        add("lstm", fields, cell_gradient=forms[k % 3])
    # Peephole: bidirectional (MPSGraph refuses; the contract does not) and without.
    add("lstm", {"bidirectional": True, "forget_gate_last": True}, cell_gradient="steps")
    add("lstm", {"bidirectional": True}, peephole=False, I=None, init_cell=False)
    add("lstm", {"reverse": True}, peephole=False, init_state=False, cell_gradient="steps")
    add(
        "lstm",
        {},
        peephole=False,
        bias=False,
        init_state=False,
        init_cell=False,
        mask=None,
        state_gradient=False,
        cell_gradient=None,
    )

    # GRU: every combination of the three flags in every direction mode.
    for mode, rgf, ra, fz in itertools.product(modes, *[(False, True)] * 3):
        add("gru", {**mode, "reset_gate_first": rgf, "reset_after": ra, "flip_z": fz})
    for k, field, act in other_activations("gru"):
        fields = {**modes[k % 4], "reset_after": k % 2 == 0, "flip_z": k % 4 == 1}
        add("gru", {**fields, "reset_gate_first": k % 3 == 0, field: act})
    add("gru", {"reset_after": True}, secondary_bias=False)
    add("gru", {"reset_after": True, "bidirectional": True}, state_gradient=False)
    add(
        "gru",
        {"bidirectional": True, "reset_after": True},
        I=None,
        bias=False,
        init_state=False,
        secondary_bias=False,
    )
    add("gru", {"reverse": True, "flip_z": True}, I=None, mask=None, state_gradient=False)

    # Every mask form, each op, both direction modes.
    for kind, form, bi in itertools.product(("rnn", "lstm", "gru"), MASK_FORMS, (False, True)):
        fields = {"bidirectional": bi}
        if kind == "rnn":
            fields["activation"] = A.TANH
        if kind == "gru":
            fields.update(reset_after=True, reset_gate_first=bi)
        options = {"mask": form}
        if kind == "lstm":
            options["cell_gradient"] = "steps" if bi else "final"
        add(kind, fields, **options)
    return cases


FD_CASES = fd_cases()


@pytest.mark.parametrize(
    ("index", "kind", "fields", "options"),
    [(i, *c[1:]) for i, c in enumerate(FD_CASES)],
    ids=[c[0] for c in FD_CASES],
)
def test_gradients_match_finite_differences(index, kind, fields, options):
    size = SMALL_SIZES[index % len(SMALL_SIZES)]
    desc = make_descriptor(kind, **fields)
    inputs, cot = draw(index, kind, desc, size, options)
    grads = analytic(kind, desc, inputs, cot)
    for field in differentiable(kind, inputs):
        expected = elementwise_fd(lambda: loss(kind, desc, inputs, cot), inputs[field])
        assert_rel_close(getattr(grads, field), expected, FD_TOL, f"d{field}")


def test_fd_sweep_covers_every_flag_and_activation():
    """The sweep above really visits every flag, every activation on every gate, every
    optional input left out, both cell-gradient forms and every mask form."""
    seen = {kind: set() for kind in ACTIVATION_FIELDS}
    for _, kind, fields, options in FD_CASES:
        seen[kind].update((k, v) for k, v in fields.items())
        seen[kind].update((k, v) for k, v in options.items())
    for kind, acts in DEFAULT_ACTIVATIONS.items():
        for field, act in itertools.product(acts, range(5)):
            assert (field, act) in seen[kind] or act == acts[field], (kind, field, act)
        assert {("reverse", True), ("bidirectional", True), ("state_gradient", False)} <= seen[kind]
        assert {("mask", f) for f in MASK_FORMS} | {("mask", None), ("I", None)} <= seen[kind]
        assert {("bias", False), ("init_state", False)} <= seen[kind]
    assert {
        ("forget_gate_last", True),
        ("cell_gradient", "steps"),
        ("cell_gradient", "final"),
        ("cell_gradient", None),
        ("peephole", False),
        ("init_cell", False),
    } <= seen["lstm"]
    assert {
        ("reset_gate_first", True),
        ("reset_after", True),
        ("flip_z", True),
        ("secondary_bias", False),
    } <= seen["gru"]


# --------------------------------------------------------------------------------------
# Awkward sizes: random directional derivatives
# --------------------------------------------------------------------------------------

# (T, N, H, I): T = 1, N = 1, H either side of 32, I != H, no input weight (I None).
LARGE_SIZES = [(1, 2, 31, 5), (3, 1, 32, 7), (2, 2, 33, 40), (3, 2, 33, None), (4, 3, 1, 33)]
# Per op, a descriptor with the defaults and one with kinked / unusual activations.
PROFILES = {
    "rnn": [{"activation": A.TANH}, {"activation": A.RELU}],
    "lstm": [
        {},
        {
            "forget_gate_last": True,
            "input_gate_activation": A.HARD_SIGMOID,
            "cell_gate_activation": A.RELU,
            "activation": A.SIGMOID,
        },
    ],
    "gru": [
        {"reset_after": True, "reset_gate_first": True},
        {
            "flip_z": True,
            "update_gate_activation": A.HARD_SIGMOID,
            "output_gate_activation": A.RELU,
        },
    ],
}
DIRECTIONS = 3  # random directions per input


def large_cases():
    for kind, size, bi in itertools.product(("rnn", "lstm", "gru"), LARGE_SIZES, (False, True)):
        for p, profile in enumerate(PROFILES[kind]):
            T, N, H, I = size  # noqa: E741
            tag = f"{kind}-T{T}-N{N}-H{H}-I{I}-{'bi' if bi else 'uni'}-p{p}"
            yield pytest.param(kind, size, {**profile, "bidirectional": bi}, tag, id=tag)


@pytest.mark.parametrize(("kind", "size", "fields", "tag"), list(large_cases()))
def test_directional_derivatives_at_awkward_sizes(kind, size, fields, tag):
    desc = make_descriptor(kind, **fields)
    seed = zlib.crc32(tag.encode())
    options = {"cell_gradient": "steps" if size[0] % 2 else "final"}
    inputs, cot = draw(seed, kind, desc, size, options)
    grads = analytic(kind, desc, inputs, cot)
    rng = np.random.default_rng(seed)
    f = lambda: loss(kind, desc, inputs, cot)  # noqa: E731
    for field in differentiable(kind, inputs):
        x = inputs[field]
        g = getattr(grads, field)
        fd, an = [], []
        for _ in range(DIRECTIONS):
            v = rng.standard_normal(x.shape)
            v /= max(np.linalg.norm(v), 1e-300)
            fd.append(directional_fd(f, x, v))
            an.append(np.sum(g * v))
        assert_rel_close(an, fd, FD_TOL, f"d{field}")

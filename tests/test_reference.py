"""Validation of rnncore.reference itself (float64 numpy), not of the compiled library.

The reference is what every backend is compared against, so it is checked here against
independent references:

- PyTorch nn.RNN (tanh, relu), nn.LSTM and nn.GRU, forward and autograd gradients, through
  the mappings at the end of the contract (semantics.md);
- central finite differences of the reference's own forward, over the descriptor flags,
  every activation on every gate, masks, peepholes, secondary biases, missing inputs and
  both forms of the LSTM cell gradient;
- small hand-written recurrences, the wrapper's layout rules (reverse, bidirectional,
  mask broadcasting), zero sizes and the activation table.

Descriptors are plain namespaces: the reference reads any object's attributes.
"""

import copy
import itertools
from types import SimpleNamespace

import cases
import numpy as np
import pytest
from cases import (
    DEFAULT_ACTIVATIONS,
    FD_MODES,
    FD_SIZES,
    GATES,
    GRADIENT_FIELDS,
    MASK_FORMS,
    FDCases,
    cotangent_loss,
    cotangents_like,
    descriptor_class,
    draw_clear_of_kinks,
    elementwise_fd,
    final_state,
    other_activations,
    z_width,
)
from util import TORCH_LAYERS, assert_rel_close, torch_layer_of

import rnncore
from rnncore import _ops, reference

try:
    import torch
except ImportError:  # pragma: no cover - torch is a test dependency
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")

NONE, RELU, TANH, SIGMOID, HARD_SIGMOID = range(5)
FORWARD = {k: getattr(reference, kind.forward) for k, kind in _ops.KINDS.items()}
BACKWARD = {k: getattr(reference, kind.gradients) for k, kind in _ops.KINDS.items()}


def desc(**fields):
    return SimpleNamespace(**fields)


def with_fields(d, **fields):
    return SimpleNamespace(**{**vars(d), **fields})


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


def mask_value(rng, form, N, DH):
    shape = {"scalar": (), "dh": (DH,), "1dh": (1, DH), "n1": (N, 1), "ndh": (N, DH)}[form]
    if form == "scalar":
        return np.asarray(1.25)
    values = rng.uniform(0.5, 1.5, shape)
    return np.where(rng.random(shape) < 0.25, 0.0, values)  # dropout-like zeros


def make_inputs(
    rng,
    kind,
    T,
    N,
    I,  # noqa: E741 (the contract's name)
    H,
    bidirectional,
    *,
    input_weight=True,
    bias=True,
    init_state=True,
    init_cell=True,
    mask="ndh",
    peephole=True,
    secondary_bias=True,
):
    """Keyword arguments for the forward op (only the inputs that are given)."""
    D = 2 if bidirectional else 1
    G = GATES[kind]
    DH, GH = D * H, G * H
    inputs = {
        "source": rng.standard_normal((T, N, I if input_weight else D * GH)),
        "recurrent_weight": rng.standard_normal((2, GH, H) if bidirectional else (GH, H))
        * (0.8 / np.sqrt(H)),
    }
    if input_weight:
        inputs["input_weight"] = rng.standard_normal((D * GH, I)) / np.sqrt(I)
    if bias:
        inputs["bias"] = rng.standard_normal(D * GH) * 0.5
    if init_state:
        inputs["init_state"] = rng.standard_normal((N, DH)) * 0.7
    if mask is not None:
        inputs["mask"] = mask_value(rng, mask, N, DH)
    if kind == "lstm":
        if init_cell:
            inputs["init_cell"] = rng.standard_normal((N, DH))
        if peephole:
            inputs["peephole"] = rng.standard_normal((2, 4 * H) if bidirectional else 4 * H) * 0.5
    if kind == "gru" and secondary_bias:
        inputs["secondary_bias"] = rng.standard_normal(DH) * 0.5
    return inputs


def make_cotangents(rng, kind, T, N, H, bidirectional, *, state_gradient, cell_gradient):
    """dL/dh for every step, plus the optional state and cell gradients."""
    DH = (2 if bidirectional else 1) * H
    cot = {"source_gradient": rng.standard_normal((T, N, DH))}
    if state_gradient:
        cot["state_gradient"] = rng.standard_normal((N, DH))
    if kind == "lstm" and cell_gradient == "final":
        cot["cell_gradient"] = rng.standard_normal((N, DH))
    if kind == "lstm" and cell_gradient == "steps":
        cot["cell_gradient"] = rng.standard_normal((T, N, DH))
    return cot


# --------------------------------------------------------------------------------------
# The loss whose gradient the gradient ops compute, and the reference's gradients of it
# --------------------------------------------------------------------------------------


def loss(kind, d, inputs, cot):
    """sum(h·dy) + sum(final h·stateGradient) (+ the cell terms for LSTM)."""
    H = inputs["recurrent_weight"].shape[-1]
    bi = bool(getattr(d, "bidirectional", False))
    out = FORWARD[kind](**inputs, descriptor=with_fields(d, training=False, produce_cell=True))
    return cotangent_loss(out, cot, H, bi)


def reference_gradients(kind, d, inputs, cot):
    """The gradient op, fed with a training forward run (as a user would)."""
    fwd = FORWARD[kind](**inputs, descriptor=with_fields(d, training=True))
    rest = {k: v for k, v in inputs.items() if k not in ("source", "recurrent_weight")}
    extra = {"rnn": (), "lstm": (getattr(fwd, "cell", None),), "gru": (fwd.state,)}[kind]
    optional = {k: v for k, v in cot.items() if k != "source_gradient"}
    # The gradient ops ignore `training`: pass False to check that.
    return BACKWARD[kind](
        inputs["source"],
        inputs["recurrent_weight"],
        cot["source_gradient"],
        fwd.z_state,
        *extra,
        **optional,
        **rest,
        descriptor=with_fields(d, training=False),
    )


def kink_distance(kind, d, inputs):
    """How far the pre-activations are from relu's and hard_sigmoid's kinks."""
    out = FORWARD[kind](**inputs, descriptor=with_fields(d, training=True))
    defaults = DEFAULT_ACTIVATIONS[kind]
    H = inputs["recurrent_weight"].shape[-1]
    return cases.kink_distance(
        kind, out, H, lambda field: getattr(d, field, defaults.get(field, False))
    )


# --------------------------------------------------------------------------------------
# PyTorch (contract: "Mapping other frameworks onto the descriptors")
# --------------------------------------------------------------------------------------

TORCH_KINDS = tuple(TORCH_LAYERS)


def torch_layer(kind, I, H, bidirectional):  # noqa: E741
    # Larger weights than the default init: more nonlinearity.
    return torch_layer_of(kind, I, H, bidirectional, seed=7, scale=2.0)


def torch_params(layer, bidirectional):
    suffixes = ["_l0", "_l0_reverse"] if bidirectional else ["_l0"]
    return [
        {n: getattr(layer, f"{n}{s}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
        for s in suffixes
    ]


def to_contract(kind, params, H):
    """Torch parameters (per direction) -> the contract's inputs and descriptor."""
    bi = len(params) == 2
    W = np.concatenate([p["weight_ih"] for p in params])
    R = np.stack([p["weight_hh"] for p in params]) if bi else params[0]["weight_hh"]
    inputs = {"input_weight": W, "recurrent_weight": R}
    if kind == "gru":  # bias = [b_ir+b_hr, b_iz+b_hz, b_in], secondaryBias = b_hn
        inputs["bias"] = np.concatenate(
            [
                np.concatenate(
                    [p["bias_ih"][: 2 * H] + p["bias_hh"][: 2 * H], p["bias_ih"][2 * H :]]
                )
                for p in params
            ]
        )
        inputs["secondary_bias"] = np.concatenate([p["bias_hh"][2 * H :] for p in params])
        d = desc(bidirectional=bi, reset_gate_first=True, reset_after=True, flip_z=False)
    else:
        inputs["bias"] = np.concatenate([p["bias_ih"] + p["bias_hh"] for p in params])
        d = desc(bidirectional=bi)
        if kind == "rnn_tanh":
            d.activation = TANH
        if kind == "rnn_relu":
            d.activation = RELU
    return inputs, d


def torch_states(s):
    """Torch [D, N, H] -> contract [N, D·H]."""
    return np.concatenate(list(s), axis=-1)


@needs_torch
@pytest.mark.parametrize("with_init", [True, False], ids=["init", "noinit"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", TORCH_KINDS)
def test_against_torch(kind, bidirectional, with_init):
    T, N, I, H = 5, 3, 4, 6  # noqa: E741
    D = 2 if bidirectional else 1
    rng = np.random.default_rng(2024)
    layer = torch_layer(kind, I, H, bidirectional)
    tparams = torch_params(layer, bidirectional)
    ref_kind = "rnn" if kind.startswith("rnn") else kind

    x = torch.tensor(rng.standard_normal((T, N, I)), requires_grad=True)
    h0 = torch.tensor(rng.standard_normal((D, N, H)) * 0.7, requires_grad=True)
    c0 = torch.tensor(rng.standard_normal((D, N, H)), requires_grad=True)
    if kind == "lstm":
        y, (hn, cn) = layer(x, (h0, c0)) if with_init else layer(x)
    else:
        y, hn = layer(x, h0) if with_init else layer(x)
    dy = rng.standard_normal(y.shape)
    dhn = rng.standard_normal(hn.shape)
    total = (y * torch.tensor(dy)).sum() + (hn * torch.tensor(dhn)).sum()
    if kind == "lstm":
        dcn = rng.standard_normal(cn.shape)
        total = total + (cn * torch.tensor(dcn)).sum()
    total.backward()

    params = [{k: v.detach().numpy() for k, v in p.items()} for p in tparams]
    inputs, d = to_contract(kind, params, H)
    inputs["source"] = x.detach().numpy()
    if with_init:
        inputs["init_state"] = torch_states(h0.detach().numpy())
        if kind == "lstm":
            inputs["init_cell"] = torch_states(c0.detach().numpy())

    # Forward: outputs, and the final states torch returns.
    out = FORWARD[ref_kind](**inputs, descriptor=with_fields(d, training=True))
    assert_rel_close(out.state, y.detach().numpy(), 1e-12, "y")
    assert_rel_close(
        final_state(out.state, H, bidirectional), torch_states(hn.detach()), 1e-12, "hn"
    )
    if kind == "lstm":
        final_cell = final_state(out.cell, H, bidirectional)
        assert_rel_close(final_cell, torch_states(cn.detach()), 1e-12, "cn")

    # Gradients.
    cot = {"source_gradient": dy, "state_gradient": torch_states(dhn)}
    if kind == "lstm":
        cot["cell_gradient"] = torch_states(dcn)
    grads = reference_gradients(ref_kind, d, inputs, cot)
    tol = 1e-10
    assert_rel_close(grads.source, x.grad.numpy(), tol, "dsource")
    for dr, p in enumerate(tparams):
        G = GATES[ref_kind]
        rows = slice(dr * G * H, (dr + 1) * G * H)
        dR = grads.recurrent_weight[dr] if bidirectional else grads.recurrent_weight
        assert_rel_close(grads.input_weight[rows], p["weight_ih"].grad.numpy(), tol, f"dW[{dr}]")
        assert_rel_close(dR, p["weight_hh"].grad.numpy(), tol, f"dR[{dr}]")
        dbias = grads.bias[rows]
        assert_rel_close(dbias, p["bias_ih"].grad.numpy(), tol, f"db_ih[{dr}]")
        if kind == "gru":  # b_hh = [b_hr, b_hz] (summed into bias) and b_hn (secondary)
            db_hh = np.concatenate([dbias[: 2 * H], grads.secondary_bias[dr * H : (dr + 1) * H]])
        else:
            db_hh = dbias
        assert_rel_close(db_hh, p["bias_hh"].grad.numpy(), tol, f"db_hh[{dr}]")
    if with_init:
        assert_rel_close(grads.init_state, torch_states(h0.grad.numpy()), tol, "dh0")
        if kind == "lstm":
            assert_rel_close(grads.init_cell, torch_states(c0.grad.numpy()), tol, "dc0")
    else:
        assert grads.init_state is None
        if kind == "lstm":
            assert grads.init_cell is None


# --------------------------------------------------------------------------------------
# Finite differences of the reference's own forward
# --------------------------------------------------------------------------------------

MODES = FD_MODES


def fd_cases():
    """(id, kind, descriptor fields, input options) for the finite-difference sweep."""
    cases = FDCases()
    add = cases.add
    modes = list(MODES.values())
    # Single-gate RNN: every activation in every direction mode.
    for act, mode in itertools.product(range(5), modes):
        add("rnn", {**mode, "activation": act})
    # Without the input weight, and without other inputs.
    for fields, options in [
        ({"bidirectional": True}, {"bias": False, "init_state": False}),
        ({"reverse": True}, {"mask": None, "state_gradient": False}),
    ]:
        add("rnn", {**fields, "activation": TANH}, input_weight=False, **options)
    for form in ("scalar", "dh", "1dh", "n1"):
        add("rnn", {"bidirectional": True, "activation": SIGMOID}, mask=form)

    # LSTM: direction modes x gate order, cycling through the cell-gradient forms.
    forms = ("final", "steps", None)
    for k, (mode, fgl) in enumerate(itertools.product(modes, (False, True))):
        add("lstm", {**mode, "forget_gate_last": fgl}, cell_gradient=forms[k % 3])
    for cg, mode in itertools.product(forms, (MODES["rev"], MODES["bi"])):
        add("lstm", mode, cell_gradient=cg)
    # Every activation on every gate (and on the cell output).
    for k, field, act in other_activations("lstm"):
        fields = {**modes[k % len(modes)], "forget_gate_last": k % 2 == 1, field: act}
        add("lstm", fields, cell_gradient=forms[k % 3])
    add("lstm", {"bidirectional": True}, peephole=False, input_weight=False, init_cell=False)
    add(
        "lstm",
        {},
        peephole=False,
        bias=False,
        init_state=False,
        mask=None,
        state_gradient=False,
        cell_gradient=None,
    )
    for form in ("scalar", "dh", "1dh", "n1"):
        add("lstm", {"bidirectional": True}, mask=form, cell_gradient="steps")

    # GRU: every combination of the three flags in every direction mode.
    for mode, rgf, ra, fz in itertools.product(modes, *[(False, True)] * 3):
        add("gru", {**mode, "reset_gate_first": rgf, "reset_after": ra, "flip_z": fz})
    for k, field, act in other_activations("gru"):
        mode = modes[k % len(modes)]
        add("gru", {**mode, "reset_after": k % 2 == 0, "flip_z": k % 4 == 1, field: act})
    add("gru", {"reset_after": True}, secondary_bias=False)
    add(
        "gru",
        {"bidirectional": True, "reset_after": True},
        input_weight=False,
        bias=False,
        init_state=False,
        secondary_bias=False,
    )
    for form in ("scalar", "dh", "1dh", "n1"):
        add(
            "gru", {"bidirectional": True, "reset_after": True, "reset_gate_first": True}, mask=form
        )
    return cases


FD_CASES = fd_cases()


@pytest.mark.parametrize(
    "index, kind, fields, options",
    [(i, *c[1:]) for i, c in enumerate(FD_CASES)],
    ids=[c[0] for c in FD_CASES],
)
def test_gradients_finite_differences(index, kind, fields, options):
    T, N, H, I = FD_SIZES[index % len(FD_SIZES)]  # noqa: E741
    d = desc(**fields)
    bi = bool(fields.get("bidirectional", False))
    input_options = {
        k: v for k, v in options.items() if k not in ("state_gradient", "cell_gradient")
    }
    # Draw inputs whose pre-activations stay clear of relu / hard_sigmoid kinks.
    inputs, rng = draw_clear_of_kinks(
        index,
        lambda rng: make_inputs(rng, kind, T, N, I, H, bi, **input_options),
        lambda inputs: kink_distance(kind, d, inputs),
        1e-4,
    )
    cot = cotangents_like(
        rng,
        kind,
        inputs,
        state_gradient=options.get("state_gradient", True),
        cell_gradient=options.get("cell_gradient", "final"),
    )

    grads = reference_gradients(kind, d, inputs, cot)

    for field in GRADIENT_FIELDS[kind]:
        value = getattr(grads, field)
        if field not in inputs:
            assert value is None, f"{field} was not given but has a gradient"
            continue
        assert isinstance(value, np.ndarray) and value.dtype == np.float64, field
        assert value.shape == np.shape(inputs[field]), field
        expected = elementwise_fd(lambda: loss(kind, d, inputs, cot), inputs[field])
        assert_rel_close(value, expected, 1e-6, f"d{field}")


def test_fd_sweep_covers_the_flags():
    """The sweep above really visits every flag and every activation on every gate."""
    seen = {kind: set() for kind in GATES}
    for _, kind, fields, options in FD_CASES:
        seen[kind].update((k, v) for k, v in fields.items())
        seen[kind].update((k, v) for k, v in options.items())
    for kind, acts in DEFAULT_ACTIVATIONS.items():
        for field, act in itertools.product(acts, range(5)):
            assert (field, act) in seen[kind] or act == acts[field], (kind, field, act)
    assert {("reverse", True), ("bidirectional", True)} <= seen["rnn"]
    assert {
        ("forget_gate_last", True),
        ("cell_gradient", "steps"),
        ("cell_gradient", None),
        ("peephole", False),
        ("input_weight", False),
    } <= seen["lstm"]
    assert {
        ("reset_gate_first", True),
        ("reset_after", True),
        ("flip_z", True),
        ("secondary_bias", False),
    } <= seen["gru"]
    for kind in GATES:
        assert {("mask", f) for f in ("scalar", "dh", "1dh", "n1")} <= seen[kind]


# --------------------------------------------------------------------------------------
# Small recurrences written out by hand (H = N = I = 1, T = 2)
# --------------------------------------------------------------------------------------


def s(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_gru_reset_before_flip_z_by_hand():
    # Gate order [z, r, o] (reset_gate_first = false), reset_after = false, flip_z = true.
    x = [0.3, -1.1]
    w = [0.7, -0.4, 1.3]  # input weight per gate
    b = [0.1, 0.2, -0.3]
    rz, rr, ro = 0.5, -0.6, 0.9
    m, h = 0.8, 0.4  # mask, init state
    hs, zs = [], []
    for xt in x:
        hm = h * m
        a_z = w[0] * xt + b[0] + rz * hm
        a_r = w[1] * xt + b[1] + rr * hm
        r = s(a_r)
        a_o = w[2] * xt + b[2] + ro * (r * hm)
        z = s(a_z)
        h = (1 - z) * h + z * np.tanh(a_o)
        hs.append(h)
        zs.append([a_z, a_r, a_o])
    out = reference.gru(
        np.array(x).reshape(2, 1, 1),
        np.array([[rz], [rr], [ro]]),
        np.array(w).reshape(3, 1),
        np.array(b),
        np.array([[0.4]]),
        np.array([[m]]),
        np.array([5.0]),  # secondary bias: ignored without reset_after
        descriptor=desc(flip_z=True, training=True),
    )
    np.testing.assert_allclose(out.state.ravel(), hs, rtol=1e-14)
    np.testing.assert_allclose(out.z_state.reshape(2, 3), zs, rtol=1e-14)


def test_gru_reset_after_training_state_by_hand():
    # Gate order [r, z, o], reset_after = true: zState = [a_r, a_z, q, x'_o].
    x = [0.3, -1.1]
    w = [0.7, -0.4, 1.3]  # r, z, o
    b = [0.1, 0.2, -0.3]
    rr, rz, ro = 0.5, -0.6, 0.9
    b2, h = 0.25, -0.4
    hs, zs = [], []
    for xt in x:
        a_r = w[0] * xt + b[0] + rr * h
        a_z = w[1] * xt + b[1] + rz * h
        q = ro * h + b2
        xo = w[2] * xt + b[2]
        z = s(a_z)
        h = z * h + (1 - z) * np.tanh(xo + s(a_r) * q)
        hs.append(h)
        zs.append([a_r, a_z, q, xo])
    out = reference.gru(
        np.array(x).reshape(2, 1, 1),
        np.array([[rr], [rz], [ro]]),
        np.array(w).reshape(3, 1),
        np.array(b),
        np.array([[-0.4]]),
        secondary_bias=np.array([b2]),
        descriptor=desc(reset_gate_first=True, reset_after=True, training=True),
    )
    np.testing.assert_allclose(out.state.ravel(), hs, rtol=1e-14)
    np.testing.assert_allclose(out.z_state.reshape(2, 4), zs, rtol=1e-14)


def test_lstm_peephole_forget_gate_last_by_hand():
    # Gate order [i, z, f, o]; hard_sigmoid input gate, relu cell output, peephole on c[t-1].
    x = [0.3, -1.1]
    w = [0.7, -0.4, 1.3, 0.2]  # i, z, f, o
    b = [0.1, 0.2, -0.3, 0.4]
    r = [0.5, -0.6, 0.9, -0.2]
    p = [0.3, -0.1, 0.2, 0.6]
    m, h, c = 0.9, 0.4, -0.7
    hs, cs, zs = [], [], []
    for xt in x:
        a = [w[k] * xt + b[k] + r[k] * h * m + p[k] * c for k in range(4)]
        i = min(max(0.2 * a[0] + 0.5, 0.0), 1.0)
        g, f, o = np.tanh(a[1]), s(a[2]), s(a[3])
        c = f * c + i * g
        h = o * max(c, 0.0)
        hs.append(h)
        cs.append(c)
        zs.append(a)
    out = reference.lstm(
        np.array(x).reshape(2, 1, 1),
        np.array(r).reshape(4, 1),
        np.array(w).reshape(4, 1),
        np.array(b),
        np.array([[0.4]]),
        np.array([[-0.7]]),
        np.array(m),
        np.array(p),
        descriptor=desc(
            forget_gate_last=True,
            input_gate_activation=HARD_SIGMOID,
            activation=RELU,
            training=True,
        ),
    )
    np.testing.assert_allclose(out.state.ravel(), hs, rtol=1e-14)
    np.testing.assert_allclose(out.cell.ravel(), cs, rtol=1e-14)
    np.testing.assert_allclose(out.z_state.reshape(2, 4), zs, rtol=1e-14)


# --------------------------------------------------------------------------------------
# Wrapper layout rules (contract: "How every forward operation is built")
# --------------------------------------------------------------------------------------


def split_direction(kind, inputs, d, H):
    """The inputs of direction d of a bidirectional call, as a unidirectional call."""
    GH = GATES[kind] * H
    half = {
        "input_weight": lambda v: v[d * GH : (d + 1) * GH],
        "bias": lambda v: v[d * GH : (d + 1) * GH],
        "recurrent_weight": lambda v: v[d],
        "peephole": lambda v: v[d],
        "init_state": lambda v: v[..., d * H : (d + 1) * H],
        "init_cell": lambda v: v[..., d * H : (d + 1) * H],
        "secondary_bias": lambda v: v[d * H : (d + 1) * H],
        "mask": lambda v: v[..., d * H : (d + 1) * H],
        "source": lambda v: v,
    }
    return {k: half[k](v) for k, v in inputs.items()}


@pytest.mark.parametrize("kind", list(GATES))
def test_bidirectional_is_forward_plus_flipped_reverse(kind):
    T, N, I, H = 4, 2, 3, 2  # noqa: E741
    rng = np.random.default_rng(5)
    inputs = make_inputs(rng, kind, T, N, I, H, True)
    fields = {"training": True, "produce_cell": True, "activation": TANH}
    if kind == "gru":
        fields.update(reset_after=True)
    # `reverse` is ignored when bidirectional.
    both = FORWARD[kind](**inputs, descriptor=desc(bidirectional=True, reverse=True, **fields))
    fwd = FORWARD[kind](**split_direction(kind, inputs, 0, H), descriptor=desc(**fields))
    bwd = FORWARD[kind](
        **split_direction(kind, inputs, 1, H), descriptor=desc(reverse=True, **fields)
    )
    for name in both._fields:
        expected = np.concatenate([getattr(fwd, name), getattr(bwd, name)[::-1]], axis=-1)
        np.testing.assert_allclose(getattr(both, name), expected, rtol=1e-14, err_msg=name)


@pytest.mark.parametrize("kind", list(GATES))
def test_reverse_stays_in_processing_order(kind):
    T, N, I, H = 4, 2, 3, 2  # noqa: E741
    rng = np.random.default_rng(6)
    inputs = make_inputs(rng, kind, T, N, I, H, False)
    rev = FORWARD[kind](**inputs, descriptor=desc(reverse=True, training=True))
    flipped = {**inputs, "source": inputs["source"][::-1]}
    fwd = FORWARD[kind](**flipped, descriptor=desc(training=True))
    for name in rev._fields:
        np.testing.assert_array_equal(getattr(rev, name), getattr(fwd, name), err_msg=name)


@pytest.mark.parametrize("form", MASK_FORMS[:-1])
@pytest.mark.parametrize("kind", list(GATES))
def test_mask_broadcasts_to_n_dh(kind, form):
    T, N, I, H = 3, 2, 3, 2  # noqa: E741
    rng = np.random.default_rng(8)
    inputs = make_inputs(rng, kind, T, N, I, H, True, mask=form)
    full = {**inputs, "mask": np.broadcast_to(inputs["mask"], (N, 2 * H)).copy()}
    d = desc(bidirectional=True, training=True)
    a, b = FORWARD[kind](**inputs, descriptor=d), FORWARD[kind](**full, descriptor=d)
    for name in a._fields:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("kind", list(GATES))
def test_mask_with_time_axis_is_rejected(kind):
    rng = np.random.default_rng(9)
    inputs = make_inputs(rng, kind, 2, 1, 2, 1, False)
    inputs["mask"] = np.ones((2, 1, 1))
    with pytest.raises(ValueError, match="mask"):
        FORWARD[kind](**inputs)


def test_absent_outputs_are_none():
    rng = np.random.default_rng(10)
    for kind in GATES:
        out = FORWARD[kind](**make_inputs(rng, kind, 2, 1, 2, 1, False))
        assert out.z_state is None
    inputs = make_inputs(rng, "lstm", 2, 1, 2, 1, False)
    assert reference.lstm(**inputs).cell is None
    out = reference.lstm(**inputs, descriptor=desc(produce_cell=True))
    assert out.cell is not None and out.z_state is None
    out = reference.lstm(**inputs, descriptor=desc(training=True))
    assert out.cell is not None and out.z_state is not None


def test_secondary_bias_gradient_is_zero_without_reset_after():
    rng = np.random.default_rng(11)
    inputs = make_inputs(rng, "gru", 3, 2, 2, 3, True)
    cot = make_cotangents(rng, "gru", 3, 2, 3, True, state_gradient=True, cell_gradient=None)
    grads = reference_gradients("gru", desc(bidirectional=True), inputs, cot)
    np.testing.assert_array_equal(grads.secondary_bias, np.zeros(6))


# --------------------------------------------------------------------------------------
# Zero sizes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", list(GATES))
def test_zero_time_steps(kind, bidirectional):
    N, I, H = 2, 3, 2  # noqa: E741
    D = 2 if bidirectional else 1
    rng = np.random.default_rng(12)
    inputs = make_inputs(rng, kind, 0, N, I, H, bidirectional)
    d = desc(bidirectional=bidirectional, reset_after=True)
    out = FORWARD[kind](**inputs, descriptor=with_fields(d, training=True))
    assert out.state.shape == (0, N, D * H)
    assert out.z_state.shape == (0, N, D * z_width(kind, reset_after=True) * H)

    for cell_form in ("final", None):
        cot = make_cotangents(
            rng, kind, 0, N, H, bidirectional, state_gradient=True, cell_gradient=cell_form
        )
        grads = reference_gradients(kind, d, inputs, cot)
        assert grads.source.shape == (0, N, I)
        for name in ("recurrent_weight", "input_weight", "bias", "peephole", "secondary_bias"):
            if name in inputs:
                g = getattr(grads, name)
                assert g.shape == np.shape(inputs[name]) and not g.any(), name
        np.testing.assert_array_equal(grads.init_state, cot["state_gradient"])
        if kind == "lstm":
            expected = cot.get("cell_gradient", np.zeros((N, D * H)))
            np.testing.assert_array_equal(grads.init_cell, expected)
    # Without a state gradient, dinitState is zeros.
    grads = reference_gradients(kind, d, inputs, {"source_gradient": np.zeros((0, N, D * H))})
    np.testing.assert_array_equal(grads.init_state, np.zeros((N, D * H)))


@pytest.mark.parametrize("kind", list(GATES))
def test_zero_batch(kind):
    T, I, H = 3, 3, 2  # noqa: E741
    rng = np.random.default_rng(13)
    inputs = make_inputs(rng, kind, T, 0, I, H, True)
    d = desc(bidirectional=True)
    out = FORWARD[kind](**inputs, descriptor=with_fields(d, training=True))
    assert out.state.shape == (T, 0, 2 * H)
    cot = make_cotangents(rng, kind, T, 0, H, True, state_gradient=True, cell_gradient="steps")
    grads = reference_gradients(kind, d, inputs, cot)
    assert grads.source.shape == (T, 0, I)
    assert not grads.recurrent_weight.any() and not grads.input_weight.any()
    assert grads.init_state.shape == (0, 2 * H)


# Every combination of zero sizes (T, N, I, H; and no input weight), checked against the
# compiled CPU backend, which handles them. I = 0 and H = 0 used to break the reference's
# gradients ("cannot reshape array of size 0").
ZERO_SIZES = [
    (T, N, I, H)
    for T, N, I, H in itertools.product((0, 2), (0, 3), (0, 2, None), (0, 2))  # noqa: E741
    if 0 in (T, N, I, H)
]


def zero_size_inputs(rng, kind, T, N, I, H, bidirectional, full):  # noqa: E741
    """make_inputs with the optional inputs on or off; I=None: no input weight."""
    with np.errstate(divide="ignore"):  # the 1/sqrt(H), 1/sqrt(I) scales of an empty array
        return make_inputs(
            rng,
            kind,
            T,
            N,
            2 if I is None else I,
            H,
            bidirectional,
            input_weight=I is not None,
            bias=full,
            init_state=full,
            init_cell=full,
            mask="n1" if full else None,
            peephole=full,
            secondary_bias=full,
        )


def compiled_descriptor(kind, **fields):
    return descriptor_class(kind)(**fields)


def forward_and_gradients(module, kind, d, inputs, cot, **kwargs):
    """A training forward run of `module` and its gradient op fed with it."""
    fwd = getattr(module, FORWARD[kind].__name__)
    bwd = getattr(module, BACKWARD[kind].__name__)
    dt = copy.copy(d)
    dt.training = True
    out = fwd(**inputs, descriptor=dt, **kwargs)
    rest = {k: v for k, v in inputs.items() if k not in ("source", "recurrent_weight")}
    extra = {"rnn": (), "lstm": (getattr(out, "cell", None),), "gru": (out.state,)}[kind]
    optional = {k: v for k, v in cot.items() if k != "source_gradient"}
    grads = bwd(
        inputs["source"],
        inputs["recurrent_weight"],
        cot["source_gradient"],
        out.z_state,
        *extra,
        **optional,
        **rest,
        descriptor=d,
        **kwargs,
    )
    return out, grads


@pytest.mark.parametrize(
    "sizes",
    ZERO_SIZES,
    ids=[f"T{t}-N{n}-I{'x' if i is None else i}-H{h}" for t, n, i, h in ZERO_SIZES],
)
@pytest.mark.parametrize("kind", list(GATES))
def test_zero_sizes_match_the_compiled_cpu_backend(kind, sizes):
    T, N, I, H = sizes  # noqa: E741
    for bidirectional, reverse, full, cell_form in itertools.product(
        (False, True), (False, True), (False, True), ("final", "steps")
    ):
        if kind != "lstm" and cell_form == "steps":
            continue
        what = f"{kind} T={T} N={N} I={I} H={H} bi={bidirectional} rev={reverse} full={full}"
        rng = np.random.default_rng(16)
        inputs = zero_size_inputs(rng, kind, T, N, I, H, bidirectional, full)
        fields = {"bidirectional": bidirectional, "reverse": reverse}
        if kind == "gru":
            fields["reset_after"] = full
        if kind == "lstm":
            fields["produce_cell"] = True
        d = compiled_descriptor(kind, **fields)
        cot = make_cotangents(
            rng,
            kind,
            T,
            N,
            H,
            bidirectional,
            state_gradient=full,
            cell_gradient=cell_form if kind == "lstm" else None,
        )
        ref_out, ref_grads = forward_and_gradients(reference, kind, d, inputs, cot)
        out, grads = forward_and_gradients(rnncore, kind, d, inputs, cot, device="cpu")
        for field, a, e in [
            *zip(ref_out._fields, out, ref_out),
            *zip(ref_grads._fields, grads, ref_grads),
        ]:
            assert (a is None) == (e is None), f"{what}: {field}"
            if e is not None:
                assert a.shape == e.shape, f"{what}: {field} {a.shape} != {e.shape}"
                np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12, err_msg=what)
        # Gradients come back in the shape of their inputs, None for inputs not given.
        for field in ref_grads._fields:
            g = getattr(ref_grads, field)
            assert (g is None) == (field not in inputs), f"{what}: d{field}"
            if g is not None:
                assert g.shape == np.shape(inputs[field]), f"{what}: d{field}"


@pytest.mark.parametrize("kind", list(GATES))
def test_zero_input_features_project_to_the_bias(kind):
    """I = 0: x' = source · Wᵀ is zero, so x' = bias; dW is [D·G·H, 0], dsource [T, N, 0]."""
    T, N, H = 3, 2, 2  # noqa: E741
    rng = np.random.default_rng(17)
    inputs = zero_size_inputs(rng, kind, T, N, 0, H, True, True)
    no_w = {k: v for k, v in inputs.items() if k != "input_weight"}
    no_w["source"] = np.broadcast_to(inputs["bias"], (T, N, inputs["bias"].size)).copy()
    no_w["bias"] = np.zeros_like(inputs["bias"])
    d = desc(bidirectional=True, training=True)
    a = FORWARD[kind](**inputs, descriptor=d)
    b = FORWARD[kind](**no_w, descriptor=d)
    np.testing.assert_allclose(a.state, b.state, rtol=1e-14, atol=1e-15)
    cot = make_cotangents(rng, kind, T, N, H, True, state_gradient=True, cell_gradient="final")
    grads = reference_gradients(kind, desc(bidirectional=True), inputs, cot)
    same = reference_gradients(kind, desc(bidirectional=True), no_w, cot)
    assert grads.source.shape == (T, N, 0)
    assert grads.input_weight.shape == inputs["input_weight"].shape == (2 * GATES[kind] * H, 0)
    np.testing.assert_allclose(grads.recurrent_weight, same.recurrent_weight, rtol=1e-13)
    np.testing.assert_allclose(grads.bias, same.source.sum(axis=(0, 1)), rtol=1e-13)
    np.testing.assert_allclose(grads.init_state, same.init_state, rtol=1e-13)


# --------------------------------------------------------------------------------------
# The activation table
# --------------------------------------------------------------------------------------


def test_activation_values_and_derivatives():
    x = np.array([-3.0, -2.5, -0.5, 0.0, 0.5, 2.5, 3.0])
    act, der = reference.activate, reference.activate_derivative
    np.testing.assert_array_equal(act(x, NONE), x)
    np.testing.assert_array_equal(der(x, NONE), np.ones_like(x))
    np.testing.assert_array_equal(act(x, RELU), np.maximum(x, 0))
    np.testing.assert_array_equal(der(x, RELU), [0, 0, 0, 0, 1, 1, 1])
    np.testing.assert_allclose(act(x, TANH), np.tanh(x), rtol=1e-15)
    np.testing.assert_allclose(der(x, TANH), 1 / np.cosh(x) ** 2, rtol=1e-13)
    np.testing.assert_allclose(act(x, SIGMOID), 1 / (1 + np.exp(-x)), rtol=1e-15)
    np.testing.assert_allclose(der(x, SIGMOID), np.exp(-x) / (1 + np.exp(-x)) ** 2, rtol=1e-14)
    np.testing.assert_allclose(act(x, HARD_SIGMOID), [0, 0, 0.4, 0.5, 0.6, 1, 1], atol=1e-15)
    np.testing.assert_array_equal(der(x, HARD_SIGMOID), [0, 0.2, 0.2, 0.2, 0.2, 0.2, 0])


def test_sigmoid_is_stable_for_large_inputs():
    x = np.array([-1000.0, -100.0, -40.0, 40.0, 100.0, 1000.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = reference.activate(x, SIGMOID)
        dy = reference.activate_derivative(x, SIGMOID)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(dy))
    np.testing.assert_allclose(y[1], np.exp(-100.0), rtol=1e-14)
    np.testing.assert_allclose(y[2], np.exp(-40.0) / (1 + np.exp(-40.0)), rtol=1e-14)
    assert y[-2] == 1.0 and y[-1] == 1.0 and y[0] == 0.0


def test_activation_enum_and_bad_values():
    import enum

    class Activation(enum.IntEnum):
        NONE, RELU, TANH, SIGMOID, HARD_SIGMOID = range(5)

    rng = np.random.default_rng(14)
    inputs = make_inputs(rng, "rnn", 2, 1, 2, 2, False)
    a = reference.single_gate_rnn(**inputs, descriptor=desc(activation=Activation.TANH))
    b = reference.single_gate_rnn(**inputs, descriptor=desc(activation=2))
    np.testing.assert_array_equal(a.state, b.state)
    with pytest.raises(ValueError):
        reference.single_gate_rnn(**inputs, descriptor=desc(activation=5))


def test_default_descriptors():
    """descriptor=None means MPSGraph's defaults (RNN relu; LSTM/GRU as in api.md)."""
    rng = np.random.default_rng(15)
    for kind, fields in [
        ("rnn", {"activation": RELU}),
        ("lstm", DEFAULT_ACTIVATIONS["lstm"]),
        ("gru", DEFAULT_ACTIVATIONS["gru"]),
    ]:
        inputs = make_inputs(rng, kind, 3, 2, 2, 2, False)
        a = FORWARD[kind](**inputs).state
        b = FORWARD[kind](**inputs, descriptor=desc(**fields)).state
        np.testing.assert_array_equal(a, b)

"""Gradient ops against PyTorch autograd on nn.RNN / nn.LSTM / nn.GRU (contract mappings).

The loss is sum(y·dy) + sum(h_n·dh_n) (+ sum(c_n·dc_n) for LSTM), so `state_gradient`
is dh_n and the final-form `cell_gradient` is dc_n. PyTorch in float64 is the ground
truth; its parameters and every input are rounded to float32 first, so the float32 run
of rnncore sees exactly the numbers the float64 one does.

The weights map by rnncore.convert, and rnncore's gradients back to PyTorch's parameter
names by convert.gradients_to_torch (the contract's mappings, semantics.md, "Mapping other
frameworks"): both are checked here against PyTorch's own autograd.

`reverse` has no PyTorch flag, but a reverse layer is PyTorch's on the flipped sequence,
its outputs in processing order: that is checked too.
"""

import numpy as np
import pytest
from cases import DTYPES, gradient_tol, run_gradients, skip_unsupported
from test_forward_torch import torch_module
from util import BFLOAT16, assert_rel_close

import rnncore
from rnncore import convert

torch = pytest.importorskip("torch")

MODES = ("rnn_tanh", "rnn_relu", "lstm", "gru")
DIRECTIONS = ("uni", "reverse", "bi")
# (T, N, I, H): an ordinary size, and T = 1, N = 1 with H past a 32-wide block.
SIZES = [(6, 3, 5, 7), (1, 1, 4, 33), (4, 2, 3, 32)]


def f32(a):
    """Round to float32 and back: exactly representable in both dtypes."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def make_layer(mode, size, direction, rng):
    """PyTorch's layer (parameters larger than its default init: more nonlinearity), its
    parameters per direction (tensors with .grad after backward), the layer in rnncore's
    terms, and float32-representable x [T, N, I], h0 and c0 [D, N, H]."""
    T, N, I, H = size  # noqa: E741
    D = 2 if direction == "bi" else 1
    module = torch_module(mode, direction == "bi", I, H, seed=4321, scale=2.0)
    params = [
        {n: getattr(module, n + convert.torch_suffix(0, d)) for n in convert.TORCH_PARAMETERS}
        for d in range(D)
    ]
    x = f32(rng.standard_normal((T, N, I)))
    h0 = f32(0.7 * rng.standard_normal((D, N, H)))
    c0 = f32(rng.standard_normal((D, N, H)))
    return module, params, to_rnncore(mode, params, direction), x, h0, c0


def to_rnncore(mode, params, direction):
    """(kind, descriptor, weights) by rnncore.convert (the contract's mappings)."""
    kind = mode.split("_")[0]
    desc = convert.descriptor_for_torch(
        kind,
        nonlinearity=mode.split("_")[-1] if kind == "rnn" else "tanh",
        bidirectional=direction == "bi",
        reverse=direction == "reverse",
    )
    return kind, desc, convert.weights_from_torch(kind, params)


def skip_unrounded_reference(mode, dtype):
    """PyTorch runs on the unrounded inputs here: rounding them to bfloat16 (8 bits) alone
    moves a ReLU layer's gradients by 15-30% (the forward's tolerance is 5e-2). Those are
    checked against the float64 reference on the rounded inputs (test_gradients_reference)."""
    if np.dtype(dtype) == BFLOAT16 and mode == "rnn_relu":
        pytest.skip("bfloat16 input rounding exceeds the tolerance of an unrounded reference")


def torch_gradients(params):
    """PyTorch's parameter gradients under its names (``weight_ih_l0``, ...)."""
    return {
        name + convert.torch_suffix(0, d): p[name].grad.numpy()
        for d, p in enumerate(params)
        for name in convert.TORCH_PARAMETERS
    }


def to_contract_state(s):
    """PyTorch's [D, N, H] as the contract's [N, D·H]."""
    s = np.asarray(s)
    return np.ascontiguousarray(s.transpose(1, 0, 2).reshape(s.shape[1], -1))


def torch_run(module, mode, x, h0, c0, with_init, rng):
    """Forward and backward in PyTorch; returns the cotangents and the leaf tensors."""
    xt = torch.tensor(x, requires_grad=True)
    h0t = torch.tensor(h0, requires_grad=True)
    c0t = torch.tensor(c0, requires_grad=True)
    if mode == "lstm":
        y, (hn, cn) = module(xt, (h0t, c0t)) if with_init else module(xt)
    else:
        y, hn = module(xt, h0t if with_init else None)
        cn = None
    dy = f32(rng.standard_normal(tuple(y.shape)))
    dhn = f32(rng.standard_normal(tuple(hn.shape)))
    total = (y * torch.from_numpy(dy)).sum() + (hn * torch.from_numpy(dhn)).sum()
    dcn = None
    if cn is not None:
        dcn = f32(rng.standard_normal(tuple(cn.shape)))
        total = total + (cn * torch.from_numpy(dcn)).sum()
    total.backward()
    return dict(y=y.detach().numpy(), dy=dy, dhn=dhn, dcn=dcn, x=xt, h0=h0t, c0=c0t, hn=hn.detach())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "init"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("size", SIZES, ids=[f"T{t}-N{n}-I{i}-H{h}" for t, n, i, h in SIZES])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_match_torch_autograd(rng, device, mode, size, direction, with_init, dtype):
    skip_unsupported(device, dtype)
    skip_unrounded_reference(mode, dtype)
    compare_with_torch(rng, device, mode, size, direction, with_init, dtype, gradient_tol(dtype))


# Gradients of a few rows in all (T·N <= 32) at layer sizes, where the CPU's GEMMs of few rows
# (dX'·W, dX'·R) and of a short K (dX'ᵀ·x, dX'ᵀ·h) read the weights as stored: H = 150 (300
# for the single-gate RNN), I = 230, so that the GEMMs pass the kernels' threshold of 2^16
# elements. float32 (float16 storage runs the same float32 GEMMs; against an unrounded
# reference its input rounding alone reaches 5e-2 at these sizes). Measured at most 6.5e-7.
FEW_ROWS = ((1, 2), (1, 8), (2, 3), (4, 2), (1, 16), (4, 8))
FEW_ROWS_TOL = 3e-6


@pytest.mark.parametrize("direction", ("uni", "bi"))
@pytest.mark.parametrize("steps_batch", FEW_ROWS, ids=lambda s: f"T{s[0]}N{s[1]}")
@pytest.mark.parametrize("mode", MODES)
def test_few_rows_gradients_at_layer_sizes_match_torch(rng, mode, steps_batch, direction):
    T, N = steps_batch
    size = (T, N, 230, 300 if mode.startswith("rnn") else 150)
    compare_with_torch(rng, "cpu", mode, size, direction, True, np.float32, FEW_ROWS_TOL)


def compare_with_torch(rng, device, mode, size, direction, with_init, dtype, tol):
    """rnncore's gradients (and the forward they come from) against PyTorch's autograd in
    float64 on the same float32-representable layer and cotangents."""
    bidirectional = direction == "bi"
    module, params, (kind, desc, weights), x, h0, c0 = make_layer(mode, size, direction, rng)
    # A reverse layer is PyTorch's on the flipped sequence (outputs in processing order).
    x_torch = x[::-1].copy() if direction == "reverse" else x
    ref = torch_run(module, mode, x_torch, h0, c0, with_init, rng)

    inputs = {"source": x, **weights}
    if with_init:
        inputs["init_state"] = to_contract_state(h0)
        if kind == "lstm":
            inputs["init_cell"] = to_contract_state(c0)
    inputs = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in inputs.items()}
    cot = {
        "source_gradient": ref["dy"].astype(dtype),
        "state_gradient": to_contract_state(ref["dhn"]).astype(dtype),
    }
    if kind == "lstm":
        cot["cell_gradient"] = to_contract_state(ref["dcn"]).astype(dtype)
    grads, fwd = run_gradients(rnncore, kind, inputs, desc, cot, device=device)

    what = f"{mode} {direction} init={with_init} {np.dtype(dtype).name} size {size}"
    # The forward run the gradients come from is PyTorch's too.
    assert_rel_close(fwd.state, ref["y"], 10 * tol, f"{what}: forward output")

    def check(actual, expected, name):
        assert actual is not None, f"{what}: {name} is None"
        assert actual.dtype == np.dtype(dtype), f"{what}: {name} dtype {actual.dtype}"
        assert_rel_close(actual, expected, tol, f"{what}: {name}")

    dx = ref["x"].grad.numpy()
    check(grads.source, dx[::-1] if direction == "reverse" else dx, "dsource")
    # rnncore's weight gradients under PyTorch's names (the biases' by the mapping back).
    ours = convert.gradients_to_torch(kind, grads, bidirectional=bidirectional)
    theirs = torch_gradients(params)
    assert set(ours) == set(theirs), what
    for name, expected in theirs.items():
        check(ours[name], expected, f"d{name}")
    if with_init:
        check(grads.init_state, to_contract_state(ref["h0"].grad.numpy()), "dh0")
        if kind == "lstm":
            check(grads.init_cell, to_contract_state(ref["c0"].grad.numpy()), "dc0")
    else:
        assert grads.init_state is None
        if kind == "lstm":
            assert grads.init_cell is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_output_gradient_only_matches_torch_autograd(rng, device, mode, direction, dtype):
    """Without state_gradient / cell_gradient: the loss is sum(y·dy) alone."""
    skip_unsupported(device, dtype)
    skip_unrounded_reference(mode, dtype)
    bidirectional = direction == "bi"
    module, params, (kind, desc, weights), x, h0, c0 = make_layer(
        mode, (5, 2, 3, 4), direction, rng
    )
    dy = f32(rng.standard_normal((*x.shape[:2], h0.shape[0] * h0.shape[2])))

    xt = torch.tensor(x[::-1].copy() if direction == "reverse" else x)
    xt.requires_grad_(True)
    h0t = torch.tensor(h0, requires_grad=True)
    c0t = torch.tensor(c0, requires_grad=True)
    y = module(xt, (h0t, c0t))[0] if mode == "lstm" else module(xt, h0t)[0]
    (y * torch.from_numpy(dy)).sum().backward()

    inputs = {"source": x, **weights, "init_state": to_contract_state(h0)}
    if kind == "lstm":
        inputs["init_cell"] = to_contract_state(c0)
    inputs = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in inputs.items()}
    cot = {"source_gradient": dy.astype(dtype)}
    grads, _ = run_gradients(rnncore, kind, inputs, desc, cot, device=device)

    tol = gradient_tol(dtype)
    what = f"{mode} {direction} {np.dtype(dtype).name}"
    dx = xt.grad.numpy()
    assert_rel_close(grads.source, dx[::-1] if direction == "reverse" else dx, tol, what)
    ours = convert.gradients_to_torch(kind, grads, bidirectional=bidirectional)
    for name, expected in torch_gradients(params).items():
        assert_rel_close(ours[name], expected, tol, f"{what}: d{name}")
    assert_rel_close(grads.init_state, to_contract_state(h0t.grad.numpy()), tol, f"{what}: dh0")
    if kind == "lstm":
        assert_rel_close(grads.init_cell, to_contract_state(c0t.grad.numpy()), tol, f"{what}: dc0")

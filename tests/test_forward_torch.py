"""Forward ops against PyTorch's nn.RNN / nn.LSTM / nn.GRU through the contract's mappings
(rnncore.convert: what this checks is its output against PyTorch's own).

PyTorch in float64 is the ground truth. Its parameters and inputs are rounded to float32
first, so the float32 run of rnncore sees exactly the same numbers as the float64 one.
"""

import numpy as np
import pytest
from cases import DTYPES, forward_tol, skip_unsupported
from util import BFLOAT16, assert_rel_close

import rnncore
from rnncore import convert

torch = pytest.importorskip("torch")

T, N, I, H = 6, 3, 5, 7  # noqa: E741

MODES = ("rnn_tanh", "rnn_relu", "lstm", "gru")


def torch_module(mode, bidirectional, I=I, H=H, seed=1234, scale=1.0):  # noqa: E741
    """PyTorch's layer for `mode` in float64, its parameters (times `scale`) exactly
    representable in float32."""
    torch.manual_seed(seed)
    if mode.startswith("rnn"):
        nonlinearity = mode.split("_")[1]
        module = torch.nn.RNN(I, H, nonlinearity=nonlinearity, bidirectional=bidirectional)
    elif mode == "lstm":
        module = torch.nn.LSTM(I, H, bidirectional=bidirectional)
    else:
        module = torch.nn.GRU(I, H, bidirectional=bidirectional)
    module = module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_((scale * p).float().double())
    return module


def to_rnncore(mode, module):
    """(kind, descriptor, dict of weights) by rnncore.convert (the contract's mappings)."""
    (layer,) = convert.from_torch(module, **({"produce_cell": True} if mode == "lstm" else {}))
    return layer.kind, layer.descriptor, layer.weights


def to_init(h0):
    """PyTorch's [D, N, H] initial state as the contract's [N, D·H]."""
    return np.ascontiguousarray(h0.transpose(1, 0, 2).reshape(h0.shape[1], -1))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "init"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("mode", MODES)
def test_forward_matches_torch(rng, device, mode, bidirectional, with_init, dtype):
    skip_unsupported(device, dtype)
    D = 2 if bidirectional else 1
    module = torch_module(mode, bidirectional)
    kind, desc, weights = to_rnncore(mode, module)

    x = rng.standard_normal((T, N, I)).astype(np.float32).astype(np.float64)
    h0 = (0.7 * rng.standard_normal((D, N, H))).astype(np.float32).astype(np.float64)
    c0 = rng.standard_normal((D, N, H)).astype(np.float32).astype(np.float64)

    with torch.no_grad():
        if kind == "lstm":
            if with_init:
                out, (h_n, c_n) = module(
                    torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0))
                )
            else:
                out, (h_n, c_n) = module(torch.from_numpy(x))
            c_n = c_n.numpy()
        else:
            out, h_n = module(torch.from_numpy(x), torch.from_numpy(h0) if with_init else None)
    out, h_n = out.numpy(), h_n.numpy()

    args = dict(weights)
    if with_init:
        args["init_state"] = to_init(h0)
        if kind == "lstm":
            args["init_cell"] = to_init(c0)
    args = {k: v.astype(dtype) for k, v in args.items()}
    fn = {"rnn": rnncore.single_gate_rnn, "lstm": rnncore.lstm, "gru": rnncore.gru}[kind]
    rec = args.pop("recurrent_weight")
    result = fn(x.astype(dtype), rec, **args, descriptor=desc, device=device)

    tol = forward_tol(dtype)
    what = f"{mode} D={D} init={with_init} {np.dtype(dtype).name}"
    assert result.state.dtype == np.dtype(dtype)
    assert result.state.shape == (T, N, D * H)
    assert_rel_close(result.state, out, tol, f"{what}: output")
    # Final states: forward direction after x[T-1], backward direction after x[0].
    assert_rel_close(result.state[T - 1, :, 0:H], h_n[0], tol, f"{what}: h_n[0]")
    if bidirectional:
        assert_rel_close(result.state[0, :, H : 2 * H], h_n[1], tol, f"{what}: h_n[1]")
    if kind == "lstm":
        assert result.cell is not None and result.cell.shape == (T, N, D * H)
        assert_rel_close(result.cell[T - 1, :, 0:H], c_n[0], tol, f"{what}: c_n[0]")
        if bidirectional:
            assert_rel_close(result.cell[0, :, H : 2 * H], c_n[1], tol, f"{what}: c_n[1]")


# A decoder's calls: few steps of a small batch at layer sizes, T·N <= 32 rows against
# weights of 300-600 rows (the CPU's products of a few rows read the weights as stored; the
# per-step path takes T·N <= 16). H = 150 and I = 200 leave partial vectors of k.
FEW_ROWS = ((1, 2), (1, 8), (2, 3), (4, 2), (3, 5), (1, 16), (4, 8))
# (measured at most 2.8e-7, 3.7e-4 and 3.1e-3; the contract's bounds for the narrow types
# are 1e-2 and 5e-2)
FEW_ROWS_TOL = {np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1.5e-3, BFLOAT16: 1e-2}


@pytest.mark.parametrize("dtype", list(FEW_ROWS_TOL), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("steps_batch", FEW_ROWS, ids=lambda s: f"T{s[0]}N{s[1]}")
@pytest.mark.parametrize("mode", MODES)
def test_few_rows_at_layer_sizes_match_torch(rng, mode, steps_batch, dtype):
    skip_unsupported("cpu", dtype)
    steps, batch = steps_batch
    D = 2 if steps == 2 else 1
    i_size, h_size = 200, 300 if mode.startswith("rnn") else 150
    module = torch_module(mode, D == 2, I=i_size, H=h_size)
    kind, desc, weights = to_rnncore(mode, module)
    x = rng.standard_normal((steps, batch, i_size)).astype(np.float32).astype(np.float64)
    h0 = (0.7 * rng.standard_normal((D, batch, h_size))).astype(np.float32).astype(np.float64)
    c0 = rng.standard_normal((D, batch, h_size)).astype(np.float32).astype(np.float64)
    with torch.no_grad():
        init = torch.from_numpy(h0)
        if kind == "lstm":
            init = (init, torch.from_numpy(c0))
        out = module(torch.from_numpy(x), init)[0].numpy()
    args = dict(weights, init_state=to_init(h0))
    if kind == "lstm":
        args["init_cell"] = to_init(c0)
    args = {k: v.astype(dtype) for k, v in args.items()}
    fn = {"rnn": rnncore.single_gate_rnn, "lstm": rnncore.lstm, "gru": rnncore.gru}[kind]
    rec = args.pop("recurrent_weight")
    result = fn(x.astype(dtype), rec, **args, descriptor=desc, device="cpu")
    what = f"{mode} T={steps} N={batch} D={D} {np.dtype(dtype).name}"
    assert_rel_close(result.state, out, FEW_ROWS_TOL[np.dtype(dtype)], what)

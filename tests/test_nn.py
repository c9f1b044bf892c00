"""rnncore.nn layers against the frameworks whose API they have: mlx.nn (forward and mx.grad,
the MLX CPU build) and torch.nn (several layers, both directions, both layouts; forward and
autograd in float64 and float32)."""

import numpy as np
import pytest

import rnncore
import rnncore.nn as rn
from rnncore._ops import rel_err

KINDS = ("gru", "lstm", "rnn")
LAYERS = {"gru": rn.GRU, "lstm": rn.LSTM, "rnn": rn.RNN}
# Errors measured against torch in float64 are ~1e-15 and in float32 ~2e-7 relative.
TOL = {np.float64: 1e-12, np.float32: 3e-6}


def rng(seed=0):
    return np.random.default_rng(seed)


# ---- mlx.nn ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlx():
    mx = pytest.importorskip("mlx.core")
    mnn = pytest.importorskip("mlx.nn")
    return mx, mnn


MLX_NAMES = {
    "gru": ("Wx", "Wh", "b", "bhn"),
    "lstm": ("Wx", "Wh", "bias"),
    "rnn": ("Wxh", "Whh", "bias"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("H", [1, 8, 33])
def test_matches_mlx_forward(mlx, kind, bias, batched, with_state, H):
    mx, mnn = mlx
    N, L, I = 3, 5, 4  # noqa: E741
    ours = LAYERS[kind](I, H, bias)
    theirs = {"gru": mnn.GRU, "lstm": mnn.LSTM, "rnn": mnn.RNN}[kind](I, H, bias=bias)
    assert set(ours.parameters()) == set(k for k, v in theirs.parameters().items())
    for name, value in ours.parameters().items():
        assert value.shape == tuple(theirs.parameters()[name].shape)
    theirs.update({k: mx.array(v) for k, v in ours.parameters().items()})
    r = rng(H)
    x = r.standard_normal((N, L, I) if batched else (L, I)).astype(np.float32)
    state = r.standard_normal((N, H) if batched else (H,)).astype(np.float32)
    args = [x] + ([state] * (2 if kind == "lstm" else 1) if with_state else [])
    got = ours(*args)
    want = theirs(*[mx.array(a) for a in args])
    pairs = zip(got, want) if kind == "lstm" else [(got, want)]
    for g, w in pairs:
        assert g.shape == tuple(w.shape)
        assert rel_err(g, np.array(w)) < TOL[np.float32]


@pytest.mark.parametrize("kind", KINDS)
def test_matches_mlx_grad(mlx, kind):
    """backward() against mx.grad of the same loss through mlx.nn's layer."""
    mx, mnn = mlx
    N, L, I, H = 2, 6, 3, 5  # noqa: E741
    ours = LAYERS[kind](I, H)
    theirs = {"gru": mnn.GRU, "lstm": mnn.LSTM, "rnn": mnn.RNN}[kind](I, H)
    theirs.update({k: mx.array(v) for k, v in ours.parameters().items()})
    r = rng(7)
    x = r.standard_normal((N, L, I)).astype(np.float32)
    h = r.standard_normal((N, H)).astype(np.float32)
    w = r.standard_normal((N, L, H)).astype(np.float32)

    def loss(params, x_, h_):
        theirs.update(params)
        out = theirs(x_, h_)
        y = out[0] if kind == "lstm" else out
        return (y * mx.array(w)).sum()

    params = theirs.trainable_parameters()
    grads, gx, gh = mx.grad(loss, argnums=(0, 1, 2))(params, mx.array(x), mx.array(h))
    out = ours(x, h)
    got = ours.backward(w)
    for name in ours.parameters():
        assert rel_err(got[name], np.array(grads[name])) < 1e-5, name
    assert rel_err(got["x"], np.array(gx)) < 1e-5
    assert rel_err(got["hidden"], np.array(gh)) < 1e-5
    assert (out[0] if kind == "lstm" else out).shape == (N, L, H)


def test_initialisation_is_mlx():
    layer = rn.GRU(7, 16)
    for value in layer.parameters().values():
        assert value.dtype == np.float32
        assert np.abs(value).max() <= 1 / np.sqrt(16)
        assert value.std() > 0.1 / np.sqrt(16)


# ---- torch.nn -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def torch_gradients(module, kind):
    """The torch module's parameter gradients under rnncore.nn's names."""
    H = module.hidden_size
    names = MLX_NAMES[kind]
    out = {}
    for layer in range(module.num_layers):
        for d in range(2 if module.bidirectional else 1):
            ts = f"_l{layer}" + ("_reverse" if d else "")
            os_ = ("" if layer == 0 else f"_l{layer}") + ("_reverse" if d else "")

            def grad(name, ts=ts):
                return getattr(module, name + ts).grad.numpy()

            out[names[0] + os_], out[names[1] + os_] = grad("weight_ih"), grad("weight_hh")
            if module.bias:
                # b's gradient is bias_ih's; bhn's is the n block of bias_hh's.
                out[names[2] + os_] = grad("bias_ih")
                if kind == "gru":
                    out["bhn" + os_] = grad("bias_hh")[2 * H :]
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_matches_torch(torch, kind, num_layers, bidirectional, batch_first, bias, with_state):
    _check_torch(torch, kind, num_layers, bidirectional, batch_first, bias, with_state, np.float64)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batched", [True, False])
def test_matches_torch_float32(torch, kind, batched):
    _check_torch(torch, kind, 2, True, True, True, True, np.float32, batched)


def _check_torch(
    torch, kind, num_layers, bidirectional, batch_first, bias, with_state, dtype, batched=True
):
    tdtype = {np.float64: torch.float64, np.float32: torch.float32}[dtype]
    T, N, I, H = 5, 3, 4, 6  # noqa: E741
    D = 2 if bidirectional else 1
    torch.manual_seed(num_layers)
    module = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM, "rnn": torch.nn.RNN}[kind](
        I,
        H,
        num_layers=num_layers,
        bias=bias,
        batch_first=batch_first,
        bidirectional=bidirectional,
        dtype=tdtype,
    )
    ours = LAYERS[kind](
        I,
        H,
        bias,
        num_layers=num_layers,
        bidirectional=bidirectional,
        batch_first=batch_first,
        dtype=dtype,
    )
    ours.update(rn.from_torch(module).parameters())
    r = rng(num_layers * 8 + 2 * bidirectional + batch_first)
    xshape = ((N, T, I) if batch_first else (T, N, I)) if batched else (T, I)
    x = torch.tensor(r.standard_normal(xshape), dtype=tdtype, requires_grad=True)
    sshape = (num_layers * D, N, H) if batched else (num_layers * D, H)
    h0 = torch.tensor(r.standard_normal(sshape), dtype=tdtype, requires_grad=True)
    c0 = torch.tensor(r.standard_normal(sshape), dtype=tdtype, requires_grad=True)
    state = (h0, c0) if kind == "lstm" else h0
    y, _ = module(x, state) if with_state else module(x)

    def ours_state(t):
        a = t.detach().numpy()
        return a[0] if num_layers * D == 1 else a

    args = [x.detach().numpy()]
    if with_state:
        args += [ours_state(h0)] + ([ours_state(c0)] if kind == "lstm" else [])
    out = ours(*args)
    got = out[0] if kind == "lstm" else out
    tol = TOL[dtype]
    assert got.shape == tuple(y.shape)
    assert got.dtype == dtype
    assert rel_err(got, y.detach().numpy()) < tol

    dy = r.standard_normal(tuple(y.shape))
    y.backward(torch.tensor(dy, dtype=tdtype))
    grads = ours.backward(dy)
    want = torch_gradients(module, kind)
    assert set(grads) - {"x", "hidden", "cell"} == set(want)
    for name, value in want.items():
        assert rel_err(grads[name], value) < tol * 10, name
    assert rel_err(grads["x"], x.grad.numpy()) < tol * 10
    if with_state:
        assert rel_err(grads["hidden"], ours_state(h0.grad)) < tol * 10
        if kind == "lstm":
            assert rel_err(grads["cell"], ours_state(c0.grad)) < tol * 10
    else:
        assert "hidden" not in grads


def test_lstm_cell_gradient(torch):
    """d_cell: the gradient of the returned cells (a per-step cell gradient of the top layer)."""
    T, N, I, H = 4, 2, 3, 5  # noqa: E741
    ours = rn.LSTM(I, H, dtype=np.float64)
    r = rng(3)
    x = r.standard_normal((N, T, I))
    w, v = r.standard_normal((N, T, H)), r.standard_normal((N, T, H))

    def loss(params):
        ours.update(params)
        hs, cs = ours(x)
        return float((hs * w).sum() + (cs * v).sum())

    ours(x)
    grads = ours.backward(w, v)
    params = {k: v.copy() for k, v in ours.parameters().items()}
    eps = 1e-6
    for name in ("Wx", "Wh", "bias"):
        p = params[name]
        idx = (0,) * p.ndim
        up, down = dict(params), dict(params)
        up[name] = p.copy()
        up[name][idx] += eps
        down[name] = p.copy()
        down[name][idx] -= eps
        fd = (loss(up) - loss(down)) / (2 * eps)
        assert abs(grads[name][idx] - fd) < 1e-7 * max(1.0, abs(fd)), name


# ---- options and errors -----------------------------------------------------------------------


def test_device_and_eval():
    layer = rn.GRU(3, 4, device="cpu")
    x = rng().standard_normal((2, 5, 3)).astype(np.float32)
    y = layer(x)
    layer.eval()
    assert np.array_equal(layer(x), y)
    with pytest.raises(RuntimeError, match=r"\[rnncore.nn.GRU\] backward\(\) needs a forward"):
        layer.backward(np.ones_like(y))
    if "metal-emulated" in rnncore.devices():
        emu = rn.GRU(3, 4, device="metal-emulated").update(layer.parameters())
        assert rel_err(emu(x), y) < 1e-6


def test_rnn_nonlinearity():
    x = rng().standard_normal((2, 5, 3)).astype(np.float32)
    relu = rn.RNN(3, 4, nonlinearity="relu")
    assert relu.nonlinearity == rnncore.Activation.RELU
    assert (relu(x) >= 0).all()
    assert rn.RNN(3, 4, nonlinearity=np.tanh).nonlinearity == rnncore.Activation.TANH
    with pytest.raises(ValueError, match=r"\[rnncore.nn.RNN\] nonlinearity must be one of"):
        rn.RNN(3, 4, nonlinearity=np.exp)


@pytest.mark.parametrize(
    "make, call, message",
    [
        (
            lambda: rn.GRU(3, 4),
            lambda m: m(np.zeros((2, 5, 7), np.float32)),
            r"\[rnncore.nn.GRU\] x must have shape \(N, L, 3\) or \(L, 3\) but has \(2, 5, 7\)",
        ),
        (
            lambda: rn.GRU(3, 4, batch_first=False),
            lambda m: m(np.zeros((5, 2, 2), np.float32)),
            r"x must have shape \(L, N, 3\)",
        ),
        (
            lambda: rn.GRU(3, 4),
            lambda m: m(np.zeros((2, 5, 3), np.float32), np.zeros((2, 5))),
            r"\[rnncore.nn.GRU\] hidden must have shape \(2, 4\) but has \(2, 5\)",
        ),
        (
            lambda: rn.GRU(3, 4, batch_first=False),
            lambda m: m(np.zeros((2, 5, 3), np.float32), np.zeros((2, 4))),
            r"hidden must have shape \(5, 4\) but has \(2, 4\) \(is x batch-first\? this layer "
            r"has batch_first=False\)",
        ),
        (
            lambda: rn.LSTM(3, 4, num_layers=2),
            lambda m: m(np.zeros((2, 5, 3)), np.zeros((2, 4))),
            r"\[rnncore.nn.LSTM\] hidden must have shape \(2, 2, 4\) but has \(2, 4\)",
        ),
        (
            lambda: rn.LSTM(3, 4),
            lambda m: m(np.zeros((2, 5, 3), np.int32)),
            r"x must be a float array",
        ),
        (
            lambda: rn.GRU(3, 4),
            lambda m: m.update({"Wx": np.zeros((12, 4))}),
            r"parameter Wx must have shape \(12, 3\) but has \(12, 4\)",
        ),
        (
            lambda: rn.GRU(3, 4),
            lambda m: m.update({"W": np.zeros((12, 3))}),
            r"has no parameter 'W'",
        ),
        (lambda: rn.GRU(3, 0), None, r"hidden_size must be an int >= 1"),
    ],
)
def test_bad_input_names_layer_argument_and_shapes(make, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        layer = make()
        call(layer)

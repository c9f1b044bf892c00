"""rnncore.mlx layers against mlx.nn's own (the MLX CPU build): outputs, mx.grad and
nn.value_and_grad of every parameter and input, an optimizer step, mx.compile's refusal."""

import copy
import pickle

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
mnn = pytest.importorskip("mlx.nn")
optim = pytest.importorskip("mlx.optimizers")
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

import rnncore.mlx as rm  # noqa: E402
from rnncore._ops import rel_err  # noqa: E402

PAIRS = {"gru": (mnn.GRU, rm.GRU), "lstm": (mnn.LSTM, rm.LSTM), "rnn": (mnn.RNN, rm.RNN)}
# Gradients of the loss below through 6 steps: measured ~3e-7 relative in float32.
TOL = 3e-6


def pair(kind, bias=True, **kwargs):
    theirs_cls, ours_cls = PAIRS[kind]
    theirs = theirs_cls(3, 5, bias=bias, **kwargs)
    ours = ours_cls(3, 5, bias=bias, **kwargs)
    ours.update(theirs.parameters())
    return theirs, ours


def loss_fn(kind, model, weight):
    def loss(x, h):
        args = (x, h) + ((None if h is None else h * 0.5,) if kind == "lstm" else ())
        out = model(*args)
        if kind == "lstm":
            return (out[0] * weight).sum() + (out[1] * weight * 0.3).sum()
        return (out * weight).sum()

    return loss


@pytest.mark.parametrize("kind", sorted(PAIRS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_matches_mlx(kind, bias, batched, with_state):
    mx.random.seed(4)
    theirs, ours = pair(kind, bias)
    x = mx.random.normal((2, 6, 3) if batched else (6, 3))
    h = mx.random.normal((2, 5) if batched else (5,)) if with_state else None
    w = mx.random.normal((2, 6, 5) if batched else (6, 5))
    values = {}
    for name, model in (("theirs", theirs), ("ours", ours)):
        loss = loss_fn(kind, model, w)
        value, grads = mnn.value_and_grad(model, loss)(x, h)
        argnums = (0, 1) if with_state else 0
        inputs = mx.grad(loss, argnums=argnums)(x, h)
        values[name] = (value, dict(tree_flatten(grads)), inputs)
    (v_t, g_t, i_t), (v_o, g_o, i_o) = values["theirs"], values["ours"]
    assert abs(v_o.item() - v_t.item()) <= TOL * abs(v_t.item())
    assert set(g_o) == set(g_t)
    for k in g_t:
        assert rel_err(np.array(g_o[k]), np.array(g_t[k])) < TOL, k
    for a, b in zip(i_o if with_state else [i_o], i_t if with_state else [i_t]):
        assert rel_err(np.array(a), np.array(b)) < TOL


def test_optimizer_steps_match_mlx():
    mx.random.seed(5)
    theirs, ours = pair("lstm")
    x = mx.random.normal((4, 7, 3))
    target = mx.random.normal((4, 7, 5))
    for model in (theirs, ours):
        opt = optim.Adam(learning_rate=0.01)

        def loss(m):
            return ((m(x)[0] - target) ** 2).mean()

        step = mnn.value_and_grad(model, loss)
        for _ in range(5):
            _, grads = step(model)
            opt.update(model, grads)
            mx.eval(model.parameters())
    for (k, a), (_, b) in zip(tree_flatten(theirs.parameters()), tree_flatten(ours.parameters())):
        assert rel_err(np.array(b), np.array(a)) < 1e-5, k


def test_compile_is_refused_clearly():
    layer = rm.GRU(3, 4)
    compiled = mx.compile(lambda x: layer(x))
    with pytest.raises(RuntimeError, match=r"\[rnncore.mlx.GRU\] cannot run under mx.compile"):
        compiled(mx.zeros((2, 3, 3)))


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: rm.GRU(3, 4)(mx.zeros((2, 5, 6))),
            ValueError,
            r"\[rnncore.mlx.GRU\] x must have shape \(N, L, 3\) or \(L, 3\) but has \(2, 5, 6\)",
        ),
        (
            lambda: rm.LSTM(3, 4)(mx.zeros((2, 5, 3)), mx.zeros((2, 5))),
            ValueError,
            r"\[rnncore.mlx.LSTM\] hidden must have shape \(2, 4\) but has \(2, 5\)",
        ),
        (
            lambda: rm.GRU(3, 4)(mx.zeros((2, 5, 3), dtype=mx.int32)),
            TypeError,
            r"must be float32, float16 or bfloat16 but one has dtype mlx.core.int32",
        ),
        (lambda: rm.RNN(3, 4, nonlinearity=mx.exp), ValueError, r"nonlinearity must be one of"),
    ],
)
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


# float16 and bfloat16 layers (storage types, float32 arithmetic) against the float32 layer
# on the same rounded weights and inputs: measured up to 2.5e-4 (float16) and 2.3e-3
# (bfloat16) relative, outputs and gradients.
NARROW_TOL = {"float16": 1e-3, "bfloat16": 8e-3}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["GRU", "LSTM", "RNN"])
def test_narrow_storage_layers(name, dtype):
    dt = getattr(mx, dtype)
    cls = getattr(rm, name)
    mx.random.seed(3)
    ours, ref = cls(4, 8), cls(4, 8)
    ours.set_dtype(dt)
    ref.update(ours.parameters())
    ref.set_dtype(mx.float32)
    x = mx.random.normal((2, 5, 4)).astype(dt)

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    def loss(layer, xx):
        return first(layer(xx)).astype(mx.float32).sum()

    out, want = first(ours(x)), first(ref(x.astype(mx.float32)))
    assert out.dtype == dt
    tol = NARROW_TOL[dtype]
    assert rel_err(np.array(out.astype(mx.float32)), np.array(want)) < tol
    got = mnn.value_and_grad(ours, lambda xx: loss(ours, xx))(x)[1]
    expected = mnn.value_and_grad(ref, lambda xx: loss(ref, xx))(x.astype(mx.float32))[1]
    expected = dict(tree_flatten(expected))
    for key, g in tree_flatten(got):
        assert g.dtype == dt, key
        assert rel_err(np.array(g.astype(mx.float32)), np.array(expected[key])) < tol, key


# Measured: float16 gradients up to 4.8e-4, bfloat16 1.9e-3 (a unit in the last place).
MIXED_TOL = {"float16": 1.5e-3, "bfloat16": 6e-3}


@pytest.mark.parametrize(
    "x_dtype, weights", [("float16", "float32"), ("bfloat16", "float32"), ("bfloat16", "float16")]
)
@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_mixed_types_promote_as_mlx_nn(kind, x_dtype, weights):
    """A 16-bit x and state into float32 weights, and bfloat16 ones into float16 weights:
    the types promote as mlx.nn's arithmetic does (to float32), outputs and every gradient as
    mlx.nn's, each gradient in its own array's type (16-bit ones: float32's rounded, so
    within a unit or so of the last place)."""
    dt, wt = getattr(mx, x_dtype), getattr(mx, weights)
    mx.random.seed(5)
    theirs, ours = pair(kind)
    theirs.set_dtype(wt)
    ours.set_dtype(wt)
    ours.update(theirs.parameters())
    x = mx.random.normal((2, 6, 3)).astype(dt)
    h = mx.random.normal((2, 5)).astype(dt)
    weight = mx.random.normal((2, 6, 5))
    want_out, out = theirs(x, h), ours(x, h)
    for a, b in zip(out, want_out) if kind == "lstm" else [(out, want_out)]:
        assert a.dtype == b.dtype == mx.float32
        assert rel_err(np.array(a), np.array(b)) < TOL
    ours_loss, theirs_loss = loss_fn(kind, ours, weight), loss_fn(kind, theirs, weight)
    got = mx.grad(ours_loss, argnums=(0, 1))(x, h)
    want = mx.grad(theirs_loss, argnums=(0, 1))(x, h)
    got_p = dict(tree_flatten(mnn.value_and_grad(ours, lambda: ours_loss(x, h))()[1]))
    want_p = dict(tree_flatten(mnn.value_and_grad(theirs, lambda: theirs_loss(x, h))()[1]))
    pairs = [("x", got[0], want[0]), ("h", got[1], want[1])]
    pairs += [(key, got_p[key], g) for key, g in want_p.items()]
    for key, a, b in pairs:
        assert a.dtype == b.dtype == (dt if key in ("x", "h") else wt), key
        tol = MIXED_TOL.get(str(a.dtype).split(".")[-1], TOL)
        assert rel_err(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))) < tol, key


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_call_forms_in_turn_and_copies(kind):
    """One layer called in every form in turn (its custom function is kept per form), its
    parameters changed between calls, then copied and pickled: mlx.nn's results each time."""
    mx.random.seed(5)
    theirs, ours = pair(kind)
    first = lambda out: out[0] if kind == "lstm" else out  # noqa: E731
    for _ in range(2):
        for batched in (True, False):
            for with_state in (False, True):
                x = mx.random.normal((2, 4, 3) if batched else (4, 3))
                h = mx.random.normal((2, 5) if batched else (5,)) if with_state else None
                w = mx.random.normal((2, 4, 5) if batched else (4, 5))
                args = (x, h) + ((None,) if kind == "lstm" else ())
                assert rel_err(np.array(first(ours(*args))), np.array(first(theirs(*args)))) < TOL
                got = mnn.value_and_grad(ours, loss_fn(kind, ours, w))(x, h)
                want = mnn.value_and_grad(theirs, loss_fn(kind, theirs, w))(x, h)
                g_o, g_t = dict(tree_flatten(got[1])), dict(tree_flatten(want[1]))
                for k in g_t:
                    assert rel_err(np.array(g_o[k]), np.array(g_t[k])) < TOL, (k, batched)
        new = {k: v * 0.9 + 0.01 for k, v in tree_flatten(theirs.parameters())}
        theirs.update(tree_unflatten(list(new.items())))
        ours.update(theirs.parameters())
    x = mx.random.normal((2, 4, 3))
    want = np.array(first(theirs(x)))
    for other in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert rel_err(np.array(first(other(x))), want) < TOL


def test_a_training_loop_faults_in_no_fresh_pages():
    """Steps of a T=1 training loop reuse the memory of the last ones: the gradients of a
    GRU(256)'s weights (768 KiB each) once came from fresh pages at every step, about 140
    page faults a step beside MLX's allocations (0.02 since)."""
    resource = pytest.importorskip("resource")
    layer = rm.GRU(256, 256)
    x = mx.random.normal((1, 1, 256))
    step = mnn.value_and_grad(layer, lambda x: layer(x).sum())
    for _ in range(50):
        mx.eval(step(x))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(600):
        mx.eval(step(x))
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 600 < 2

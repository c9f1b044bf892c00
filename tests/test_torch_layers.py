"""rnncore.torch modules against torch.nn's own: outputs, h_n / c_n and every parameter and
input gradient (autograd), state_dict both ways, gradcheck, training steps and errors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import rnncore.torch as rt  # noqa: E402
from rnncore._ops import rel_err  # noqa: E402

PAIRS = {
    "gru": (torch.nn.GRU, rt.GRU),
    "lstm": (torch.nn.LSTM, rt.LSTM),
    "rnn": (torch.nn.RNN, rt.RNN),
}
# Measured against torch.nn: float64 ~1e-15, float32 ~2e-7 relative.
TOL = {torch.float64: 1e-12, torch.float32: 3e-6}
# Gradients (through the layers and every step): float32 measured up to ~3e-6.
GRAD_TOL = {torch.float64: 1e-11, torch.float32: 1e-5}


def pair(kind, *args, dtype=torch.float64, **kwargs):
    theirs_cls, ours_cls = PAIRS[kind]
    theirs = theirs_cls(*args, dtype=dtype, **kwargs)
    ours = ours_cls(*args, dtype=dtype, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def loss_of(output, state, weight):
    """A loss that reaches every output: the sequence (weighted) and the final states."""
    total = (output * weight).sum()
    for s in state if isinstance(state, tuple) else (state,):
        total = total + (s**2).sum()
    return total


def check(
    kind,
    num_layers,
    bidirectional,
    batch_first,
    bias,
    with_state,
    batched,
    dtype=torch.float64,
    nonlinearity=None,
):
    extra = {"nonlinearity": nonlinearity} if nonlinearity else {}
    torch.manual_seed(num_layers + 4 * bidirectional)
    theirs, ours = pair(
        kind,
        4,
        5,
        num_layers,
        bias=bias,
        batch_first=batch_first,
        bidirectional=bidirectional,
        dtype=dtype,
        **extra,
    )
    D = 2 if bidirectional else 1
    shape = ((3, 6, 4) if batch_first else (6, 3, 4)) if batched else (6, 4)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    sshape = (num_layers * D, 3, 5) if batched else (num_layers * D, 5)
    h = torch.randn(sshape, dtype=dtype, requires_grad=True)
    c = torch.randn(sshape, dtype=dtype, requires_grad=True)
    state = ((h, c) if kind == "lstm" else h) if with_state else None
    out_t, st_t = theirs(x, state)
    out_o, st_o = ours(x, state)
    tol = TOL[dtype]
    assert out_o.shape == out_t.shape and out_o.dtype == dtype
    assert rel_err(out_o.detach(), out_t.detach()) < tol
    for a, b in zip(st_o if kind == "lstm" else (st_o,), st_t if kind == "lstm" else (st_t,)):
        assert a.shape == b.shape
        assert rel_err(a.detach(), b.detach()) < tol
    weight = torch.randn(out_t.shape, dtype=dtype)
    inputs = [x] + ([h] + ([c] if kind == "lstm" else []) if with_state else [])
    g_t = torch.autograd.grad(loss_of(out_t, st_t, weight), inputs + list(theirs.parameters()))
    g_o = torch.autograd.grad(loss_of(out_o, st_o, weight), inputs + list(ours.parameters()))
    names = ["input", "h", "c"][: len(inputs)] + [n for n, _ in theirs.named_parameters()]
    for name, a, b in zip(names, g_o, g_t):
        assert rel_err(a, b) < GRAD_TOL[dtype], name


@pytest.mark.parametrize("kind", sorted(PAIRS))
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_matches_torch_float64(kind, num_layers, bidirectional, batch_first, bias, with_state):
    check(kind, num_layers, bidirectional, batch_first, bias, with_state, True)


@pytest.mark.parametrize("kind", sorted(PAIRS))
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_state", [True, False])
def test_unbatched(kind, bidirectional, with_state):
    check(kind, 2, bidirectional, False, True, with_state, False)


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_float32(kind):
    check(kind, 2, True, True, True, True, True, dtype=torch.float32)


def test_relu_rnn():
    check("rnn", 2, True, False, True, True, True, nonlinearity="relu")


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_gradcheck(kind):
    torch.manual_seed(0)
    _, ours = pair(kind, 3, 4, 2, bidirectional=True)
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    h = torch.randn(4, 2, 4, dtype=torch.float64, requires_grad=True)

    def f(x, h):
        state = (h, h * 0.5) if kind == "lstm" else h
        out, st = ours(x, state)
        return out, *(st if kind == "lstm" else (st,))

    assert torch.autograd.gradcheck(f, (x, h))


def test_state_dict_both_ways():
    torch.manual_seed(1)
    ours = rt.LSTM(4, 5, 2, bidirectional=True, batch_first=True)
    theirs = torch.nn.LSTM(4, 5, 2, bidirectional=True, batch_first=True)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 6, 4)
    assert rel_err(ours(x)[0].detach(), theirs(x)[0].detach()) < TOL[torch.float32]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert isinstance(ours, torch.nn.LSTM)


def test_training_steps_match_torch():
    """A few Adam steps on a 2-layer bidirectional GRU give torch.nn.GRU's weights."""
    torch.manual_seed(2)
    theirs, ours = pair("gru", 3, 6, 2, bidirectional=True, batch_first=True)
    opt_t = torch.optim.Adam(theirs.parameters(), lr=0.01)
    opt_o = torch.optim.Adam(ours.parameters(), lr=0.01)
    x = torch.randn(4, 7, 3, dtype=torch.float64)
    target = torch.randn(4, 7, 12, dtype=torch.float64)
    for _ in range(5):
        for model, opt in ((theirs, opt_t), (ours, opt_o)):
            opt.zero_grad()
            out, _ = model(x)
            torch.nn.functional.mse_loss(out, target).backward()
            opt.step()
    for (name, a), b in zip(theirs.named_parameters(), ours.parameters()):
        assert rel_err(b.detach(), a.detach()) < 1e-10, name


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_parameters_changed_between_calls(kind):
    """A module keeps numpy views of its parameters between calls: every way of changing a
    parameter is seen by the next call, layer by layer."""
    torch.manual_seed(5)
    theirs, ours = pair(kind, 3, 4, 2)
    x = torch.randn(5, 2, 3, dtype=torch.float64)

    def agree():
        with torch.no_grad():
            assert rel_err(ours(x)[0], theirs(x)[0]) < TOL[torch.float64]
        assert rel_err(ours(x)[0].detach(), theirs(x)[0].detach()) < TOL[torch.float64]

    agree()
    changes = [
        lambda m: m.bias_hh_l1.data.mul_(3),  # in place, unseen by the version counter
        lambda m: m.weight_hh_l0.data.add_(0.5),
        lambda m: setattr(m.weight_hh_l1, "data", m.weight_hh_l1.data * -1),  # new memory
        lambda m: setattr(m.bias_ih_l0, "data", m.bias_ih_l0.data.flip(0).contiguous()),
        lambda m: m.weight_ih_l0.data.copy_(m.weight_ih_l0.data.flip(0)),
    ]
    for change in changes:
        for m in (theirs, ours):
            change(m)
        agree()
    ours.load_state_dict(
        torch.nn.GRU(3, 4, 2).double().state_dict()
        if kind == "gru"
        else type(theirs)(3, 4, 2).double().state_dict()
    )
    theirs.load_state_dict(ours.state_dict())
    agree()


def test_dropout_between_layers():
    torch.manual_seed(3)
    theirs, ours = pair("gru", 3, 4, 2, dropout=0.5)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    ours.eval()
    theirs.eval()
    assert rel_err(ours(x)[0].detach(), theirs(x)[0].detach()) < TOL[torch.float64]
    ours.train()
    assert rel_err(ours(x)[0].detach(), theirs(x)[0].detach()) > 1e-3


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: rt.LSTM(3, 4, proj_size=2), ValueError, r"proj_size > 0 is not supported"),
        (
            lambda: rt.GRU(3, 4)(torch.zeros(5, 2, 6)),
            ValueError,
            r"\[rnncore.torch.GRU\] input must have shape \(L, N, 3\) or \(L, 3\) "
            r"but has \(5, 2, 6\)",
        ),
        (
            lambda: rt.GRU(3, 4)(torch.zeros(5, 2, 3), torch.zeros(1, 2, 5)),
            ValueError,
            r"\[rnncore.torch.GRU\] hx must have shape \(1, 2, 4\) but has \(1, 2, 5\)",
        ),
        (
            lambda: rt.GRU(3, 4)(torch.zeros(2, 5, 3), torch.zeros(1, 2, 4)),
            ValueError,
            r"hx must have shape \(1, 5, 4\) but has \(1, 2, 4\) \(is input batch-first\? "
            r"this module has batch_first=False\)",
        ),
        (
            lambda: rt.LSTM(3, 4)(torch.zeros(5, 2, 3), (torch.zeros(1, 2, 4), torch.zeros(2, 4))),
            ValueError,
            r"c_0 must have shape \(1, 2, 4\) but has \(2, 4\)",
        ),
        (
            lambda: rt.GRU(3, 4)(torch.zeros(5, 2, 3, dtype=torch.float64)),
            TypeError,
            r"input has dtype torch.float64 and the parameters torch.float32",
        ),
    ],
)
def test_errors_name_module_argument_and_shapes(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_outputs_are_usable_tensors():
    _, ours = pair("lstm", 3, 4, dtype=torch.float32)
    out, (h, c) = ours(torch.randn(5, 2, 3))
    assert out.requires_grad and h.requires_grad and c.requires_grad
    assert np.isfinite(out.detach().numpy()).all()
    with torch.no_grad():
        out, _ = ours(torch.randn(5, 2, 3))
    assert not out.requires_grad


def test_raw_functions_refuse_tensors_in_a_graph():
    """A tensor that needs a gradient never leaves autograd silently."""
    x = torch.zeros(2, 1, 3, requires_grad=True)
    r = torch.zeros(3, 3)
    with pytest.raises(
        TypeError, match=r"\[single_gate_rnn\] source requires grad: .*rnncore.torch"
    ):
        rt.rnncore.single_gate_rnn(x, r)
    out = rt.rnncore.single_gate_rnn(x.detach(), r)  # detached: computed
    assert out.state.shape == (2, 1, 3)


# float16 and bfloat16 modules (storage types, float32 arithmetic) against the float64
# torch.nn module on the same rounded weights and inputs: measured up to 8.4e-4 (float16) and
# 5.1e-3 (bfloat16) relative, outputs and gradients (the gradients are rounded too).
NARROW_TOL = {torch.float16: 2.5e-3, torch.bfloat16: 1.5e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_narrow_storage_modules(kind, dtype):
    torch.manual_seed(7)
    theirs_cls, ours_cls = PAIRS[kind]
    ours = ours_cls(4, 5, 2, bidirectional=True, dtype=dtype)
    theirs = theirs_cls(4, 5, 2, bidirectional=True, dtype=torch.float64)
    theirs.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x = torch.randn(6, 3, 4).to(dtype)
    x64 = x.double().requires_grad_(True)
    x = x.requires_grad_(True)
    out_o, st_o = ours(x)
    out_t, st_t = theirs(x64)
    assert out_o.dtype == dtype
    weight = torch.randn(out_t.shape, dtype=torch.float64)
    g_o = torch.autograd.grad(
        loss_of(out_o.double(), tuple(s.double() for s in st_o) if kind == "lstm"
                else st_o.double(), weight),
        [x] + list(ours.parameters()),
    )  # fmt: skip
    g_t = torch.autograd.grad(loss_of(out_t, st_t, weight), [x64] + list(theirs.parameters()))
    tol = NARROW_TOL[dtype]
    assert rel_err(out_o.detach().double(), out_t.detach()) < tol
    names = ["input"] + [n for n, _ in theirs.named_parameters()]
    for name, a, b in zip(names, g_o, g_t):
        assert a.dtype == dtype, name
        assert rel_err(a.double(), b) < tol, name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_autocast_runs_the_layers_in_its_type(kind, dtype):
    """Under torch.autocast("cpu") to a 16-bit type the modules run in its storage (as
    torch.nn.LSTM and RNN do on the CPU; its GRU keeps float32): a float32 model, and the
    16-bit output of a Linear before it, give outputs and states of that type, and the
    float32 parameters get float32 gradients, those of the float64 reference on the
    parameters cast to the type (the casts are in the graph). Outside autocast: float32."""
    torch.manual_seed(11)
    theirs_cls, ours_cls = PAIRS[kind]
    ours = ours_cls(4, 5, 2, bidirectional=True)
    linear = torch.nn.Linear(4, 4)
    theirs = theirs_cls(4, 5, 2, bidirectional=True, dtype=torch.float64)
    theirs.load_state_dict({k: v.to(dtype).double() for k, v in ours.state_dict().items()})
    x = torch.randn(6, 3, 4)
    with torch.autocast("cpu", dtype=dtype):
        z = linear(x)
        out_o, st_o = ours(z)
    assert z.dtype == dtype and out_o.dtype == dtype
    for s in st_o if kind == "lstm" else (st_o,):
        assert s.dtype == dtype
    z64 = z.detach().double().requires_grad_(True)
    out_t, st_t = theirs(z64)
    weight = torch.randn(out_t.shape, dtype=torch.float64)
    states_o = tuple(s.double() for s in st_o) if kind == "lstm" else st_o.double()
    g_o = torch.autograd.grad(loss_of(out_o.double(), states_o, weight), list(ours.parameters()))
    g_t = torch.autograd.grad(loss_of(out_t, st_t, weight), list(theirs.parameters()))
    tol = NARROW_TOL[dtype]
    assert rel_err(out_o.detach().double(), out_t.detach()) < tol
    names = [n for n, _ in theirs.named_parameters()]
    for name, a, b in zip(names, g_o, g_t):
        assert a.dtype == torch.float32, name
        assert rel_err(a.double(), b) < tol, name
    assert ours(x)[0].dtype == torch.float32


def test_a_training_loop_faults_in_no_fresh_pages():
    """Steps of a T=1 training loop reuse the memory of the last ones: the gradients of a
    GRU(256)'s weights (768 KiB each) once came from fresh pages, 7-25 page faults a step
    beside torch's allocations (0.03 since)."""
    resource = pytest.importorskip("resource")
    layer = rt.GRU(256, 256)
    x = torch.randn(1, 1, 256)

    def step():
        layer.zero_grad()
        layer(x)[0].sum().backward()

    for _ in range(50):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(600):
        step()
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 600 < 1


def test_no_leak_warnings_at_exit_with_live_modules_and_graphs():
    """A script that ends with its modules and outputs (their autograd graphs) alive, as most
    do at module level: the interpreter's exit printed nanobind's "leaked instances" warnings
    while the modules kept their descriptors."""
    import subprocess
    import sys

    script = (
        "import torch, rnncore.torch as rt\n"
        "kept = []\n"
        "for cls in (rt.GRU, rt.LSTM, rt.RNN):\n"
        "    for dtype in (torch.float32, torch.bfloat16):\n"
        "        m = cls(4, 3, num_layers=2, bidirectional=True).to(dtype)\n"
        "        x = torch.randn(2, 1, 4, dtype=dtype, requires_grad=True)\n"
        "        y = m(x)[0]\n"
        "        kept += [m, x, y, m(x)[0].sum()]\n"
        "        y.sum().backward(retain_graph=True)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "leaked" not in run.stderr, run.stderr

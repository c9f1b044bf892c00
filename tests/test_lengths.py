"""sequence_lengths (docs/semantics.md, "Sequence lengths"): every operation, forward and
gradients, equals each row run alone on its own truncated sequence, with zeros past each
row's length; lengths all equal to T are the op without lengths, bit for bit."""

import numpy as np
import pytest
from cases import (
    KINDS,
    all_inputs,
    flag_cases,
    full_descriptor,
    gradient_op,
    make_cotangents,
    make_inputs,
    op,
    result_fields,
    run,
    run_gradients,
    training_forward,
)
from util import devices_under_test

import rnncore

DEVICES = devices_under_test()
# How the rows' steps are cut into backend calls: the library's choice, a call for every
# distinct length (the longest chains), and one call (rows run on past their ends).
SEGMENTS = {"default": None, "every-length": "0", "one-call": "1e12"}
# Measured: float64 agrees to 1.0e-15, float32 on metal-emulated to 7.8e-7.
TOL = {np.float64: 4e-15, np.float32: 3e-6}
WEIGHTS = ("recurrent_weight", "input_weight", "bias", "peephole", "secondary_bias")
PER_ROW = ("init_state", "init_cell")


def dtype_on(device):
    return np.float64 if device == "cpu" else np.float32


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b), initial=0.0) / max(np.max(np.abs(b), initial=0.0), 1e-30))


def row_inputs(inputs, n, L):  # noqa: E741
    """The forward inputs of row n alone, truncated to its first L steps."""
    N = inputs["source"].shape[1]
    out = {}
    for k, v in inputs.items():
        v = np.asarray(v)
        if k == "source":
            out[k] = v[:L, n : n + 1]
        elif k in PER_ROW or (k == "mask" and v.ndim == 2 and v.shape[0] == N):
            out[k] = v[n : n + 1]
        else:
            out[k] = v
    return out


def row_cotangents(cot, n, L):  # noqa: E741
    out = {"source_gradient": cot["source_gradient"][:L, n : n + 1]}
    if "state_gradient" in cot:
        out["state_gradient"] = cot["state_gradient"][n : n + 1]
    if "cell_gradient" in cot:
        c = cot["cell_gradient"]
        out["cell_gradient"] = c[n : n + 1] if c.ndim == 2 else c[:L, n : n + 1]
    return out


def check_forward(kind, inputs, descriptor, lengths, device, tol):
    full = run(rnncore, kind, inputs, descriptor, sequence_lengths=lengths, device=device)
    for n, L in enumerate(lengths):  # noqa: E741
        alone = (
            run(rnncore, kind, row_inputs(inputs, n, L), descriptor, device=device) if L else None
        )
        for field in result_fields(kind):
            got = getattr(full, field)
            if got is None:
                continue
            got = got[:, n]
            assert not np.any(got[L:]), f"{field} of row {n} past its length {L}"
            if L:
                err = rel(got[:L], getattr(alone, field)[:, 0])
                assert err <= tol, f"{field} of row {n} (length {L}): {err:.2e}"
    return full


def check_gradients(kind, inputs, descriptor, cot, lengths, device, tol):
    forward = training_forward(
        rnncore, kind, inputs, descriptor, sequence_lengths=lengths, device=device
    )
    got, _ = run_gradients(
        rnncore,
        kind,
        inputs,
        descriptor,
        cot,
        forward=forward,
        sequence_lengths=lengths,
        device=device,
    )
    expected = {
        f: np.zeros_like(np.asarray(getattr(got, f), np.float64))
        for f in got._fields
        if getattr(got, f) is not None
    }
    for n, L in enumerate(lengths):  # noqa: E741
        if L == 0:  # nothing ran: the initial state is the final state
            if "init_state" in expected and "state_gradient" in cot:
                expected["init_state"][n] = cot["state_gradient"][n]
            c = cot.get("cell_gradient")
            if "init_cell" in expected and c is not None and c.ndim == 2:
                expected["init_cell"][n] = c[n]
            continue
        alone, _ = run_gradients(
            rnncore,
            kind,
            row_inputs(inputs, n, L),
            descriptor,
            row_cotangents(cot, n, L),
            device=device,
        )
        for f in expected:
            a = np.asarray(getattr(alone, f), np.float64)
            if f == "source":
                expected[f][:L, n] = a[:, 0]
            elif f in PER_ROW:
                expected[f][n] = a[0]
            else:
                expected[f] += a
    for f, e in expected.items():
        err = rel(getattr(got, f), e)
        assert err <= tol, f"gradient of {f}: {err:.2e}"


def lengths_for(rng, T, N):  # noqa: E741
    """Random lengths in random order, with an empty row and a full one when N allows."""
    L = rng.integers(0, T + 1, N)
    if N >= 3:
        L[rng.permutation(N)[:2]] = (0, T)
    if np.all(L == T):
        L[0] = T - 1
    return L


def options(kind, k):
    """Every optional input, the mask in each of its forms in turn, with and without an
    input weight."""
    opts = all_inputs(kind, 4 if k % 3 else None)
    opts["mask"] = ("ndh", "n1", "dh", "scalar", "1dh")[k % 5]
    return opts


@pytest.fixture(params=list(SEGMENTS))
def segments(request, monkeypatch):
    if SEGMENTS[request.param] is not None:
        monkeypatch.setenv("RNNCORE_SEGMENT_COST", SEGMENTS[request.param])
    return request.param


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, flags, k", list(flag_cases(with_index=True)))
def test_forward_and_gradients_equal_rows_alone(device, kind, flags, k, segments):
    dtype = dtype_on(device)
    rng = np.random.default_rng(100 + k)
    T, N, H = 6, 5, 3  # noqa: N806
    inputs = make_inputs(
        rng,
        kind,
        T=T,
        N=N,
        H=H,
        bidirectional=flags.get("bidirectional", False),
        dtype=dtype,
        **options(kind, k),
    )
    descriptor = full_descriptor(kind, **flags)
    lengths = lengths_for(rng, T, N)
    check_forward(kind, inputs, descriptor, lengths, device, TOL[dtype])
    cot = make_cotangents(
        rng,
        kind,
        T=T,
        N=N,
        H=H,
        bidirectional=flags.get("bidirectional", False),
        dtype=dtype,
        state_gradient=True,
        cell_gradient=("final", "steps")[k % 2],
    )
    check_gradients(kind, inputs, descriptor, cot, lengths, device, TOL[dtype])


AWKWARD = {
    "all-empty": (4, [0, 0, 0]),
    "one-long-among-ones": (7, [1, 1, 7, 1, 1]),
    "N1": (5, [3]),
    "N1-empty": (5, [0]),
    "T1": (1, [1, 0, 1, 0]),
    "random-order": (9, [2, 9, 5, 0, 7, 1, 9, 3]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("case", list(AWKWARD))
@pytest.mark.parametrize("kind", KINDS)
def test_awkward_lengths(device, kind, case, bidirectional, segments):
    dtype = dtype_on(device)
    T, lengths = AWKWARD[case]  # noqa: N806
    lengths = np.array(lengths)
    N, H = len(lengths), 33  # noqa: N806
    rng = np.random.default_rng(7)
    inputs = make_inputs(
        rng,
        kind,
        T=T,
        N=N,
        H=H,
        I=6,
        bidirectional=bidirectional,
        dtype=dtype,
        bias=True,
        init_state=True,
        init_cell=kind == "lstm",
    )
    descriptor = full_descriptor(kind, bidirectional=bidirectional)
    check_forward(kind, inputs, descriptor, lengths, device, TOL[dtype])
    cot = make_cotangents(
        rng,
        kind,
        T=T,
        N=N,
        H=H,
        bidirectional=bidirectional,
        dtype=dtype,
        state_gradient=True,
        cell_gradient="final",
    )
    check_gradients(kind, inputs, descriptor, cot, lengths, device, TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, flags", list(flag_cases()))
def test_full_lengths_are_bitwise_no_lengths(device, kind, flags):
    dtype = dtype_on(device)
    rng = np.random.default_rng(3)
    T, N, H = 4, 3, 5  # noqa: N806
    bi = flags.get("bidirectional", False)
    inputs = make_inputs(
        rng, kind, T=T, N=N, H=H, I=6, bidirectional=bi, dtype=dtype, bias=True, init_state=True
    )
    descriptor = full_descriptor(kind, **with_training(flags))
    full = np.full(N, T, np.int32)
    a = run(rnncore, kind, inputs, descriptor, device=device)
    b = run(rnncore, kind, inputs, descriptor, sequence_lengths=full, device=device)
    for x, y in zip(a, b):
        assert (x is None and y is None) or np.array_equal(x, y)
    cot = make_cotangents(
        rng, kind, T=T, N=N, H=H, bidirectional=bi, dtype=dtype, state_gradient=True
    )
    ga, _ = run_gradients(rnncore, kind, inputs, descriptor, cot, device=device)
    gb, _ = run_gradients(
        rnncore, kind, inputs, descriptor, cot, device=device, sequence_lengths=full
    )
    for x, y in zip(ga, gb):
        assert (x is None and y is None) or np.array_equal(x, y)


def with_training(flags):
    return {**flags, "training": True}


# ---- bad lengths -------------------------------------------------------------------------


def gru_inputs(T=4, N=3):  # noqa: N803
    rng = np.random.default_rng(0)
    return make_inputs(rng, "gru", T=T, N=N, H=2, I=3, dtype=np.float32)


@pytest.mark.parametrize(
    "lengths, error, message",
    [
        (
            [1, 2],
            ValueError,
            r"\[gru\] sequence_lengths must have shape \(N,\) = \(3,\) but has shape \(2,\)",
        ),
        (
            [[1], [2], [3]],
            ValueError,
            r"\[gru\] sequence_lengths must have shape \(N,\) but has shape \(3, 1\)",
        ),
        (
            [1, -1, 2],
            ValueError,
            r"\[gru\] sequence_lengths\[1\] = -1 is negative; "
            r"each length must lie in \[0, T\] = \[0, 4\]",
        ),
        ([1, 5, 2], ValueError, r"\[gru\] sequence_lengths\[1\] = 5 is above T = 4"),
        (
            [1.0, 2.0, 3.0],
            TypeError,
            r"\[gru\] sequence_lengths must hold integers but has dtype float64",
        ),
        (
            [True, False, True],
            TypeError,
            r"\[gru\] sequence_lengths must hold integers but has dtype bool",
        ),
        ("abc", TypeError, r"\[gru\] sequence_lengths must hold integers"),
        (
            np.array([1, 2**64 - 1, 2], np.uint64),
            ValueError,
            r"\[gru\] sequence_lengths holds 18446744073709551615, above any T",
        ),
    ],
)
def test_bad_lengths(lengths, error, message):
    with pytest.raises(error, match=message):
        run(rnncore, "gru", gru_inputs(), None, sequence_lengths=lengths)


def test_bad_lengths_in_gradients():
    inputs = gru_inputs()
    d = rnncore.GRUDescriptor(training=True)
    fwd = run(rnncore, "gru", inputs, d)
    with pytest.raises(
        ValueError, match=r"\[gru_gradients\] sequence_lengths\[2\] = 9 is above T = 4"
    ):
        rnncore.gru_gradients(
            inputs["source"],
            inputs["recurrent_weight"],
            fwd.state,
            fwd.z_state,
            fwd.state,
            input_weight=inputs["input_weight"],
            sequence_lengths=[1, 2, 9],
            descriptor=d,
        )


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64])
def test_any_integer_type(dtype):
    inputs = gru_inputs()
    a = run(rnncore, "gru", inputs, None, sequence_lengths=np.array([1, 4, 0], dtype))
    b = run(rnncore, "gru", inputs, None, sequence_lengths=[1, 4, 0])
    assert np.array_equal(a.state, b.state)


# ---- against PyTorch's packed sequences and ONNX Runtime's sequence_lens ------------------

TORCH_MODES = ("rnn_tanh", "rnn_relu", "lstm", "gru")


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("mode", TORCH_MODES)
def test_matches_torch_packed_sequences(mode, bidirectional):
    """Forward (output, h_n, c_n) and every gradient against torch's packed sequences, with
    lengths in random order (enforce_sorted=False), float64."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    from util import torch_layer_of

    from rnncore.convert import (
        descriptor_for_torch,
        gradients_to_torch,
        torch_directions,
        weights_from_torch,
    )

    T, N, I, H = 7, 5, 4, 6  # noqa: E741, N806
    D = 2 if bidirectional else 1  # noqa: N806
    lengths = np.array([3, 7, 1, 5, 7])
    layer = torch_layer_of(mode, I, H, bidirectional, seed=1)
    kind = mode.split("_")[0]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((D, N, H)) * 0.5
    c0 = rng.standard_normal((D, N, H)) * 0.5
    dy = rng.standard_normal((T, N, D * H))
    dh = rng.standard_normal((D, N, H))
    dc = rng.standard_normal((D, N, H))

    xt = torch.tensor(x, requires_grad=True)
    h0t = torch.tensor(h0, requires_grad=True)
    c0t = torch.tensor(c0, requires_grad=True)
    packed = pack_padded_sequence(xt, torch.tensor(lengths), enforce_sorted=False)
    out, hn = layer(packed, (h0t, c0t) if kind == "lstm" else h0t)
    out, _ = pad_packed_sequence(out, total_length=T)
    hn, cn = hn if kind == "lstm" else (hn, None)
    loss = (out * torch.tensor(dy)).sum() + (hn * torch.tensor(dh)).sum()
    if cn is not None:
        loss = loss + (cn * torch.tensor(dc)).sum()
    loss.backward()

    def flat(s):  # [D, N, H] -> [N, D*H]
        return np.ascontiguousarray(np.asarray(s).transpose(1, 0, 2).reshape(N, D * H))

    nonlinearity = "relu" if mode == "rnn_relu" else "tanh"
    desc = descriptor_for_torch(
        kind, nonlinearity=nonlinearity, bidirectional=bidirectional, training=True
    )
    weights = weights_from_torch(kind, torch_directions(layer.state_dict(), 0, bidirectional))
    inits = {"init_state": flat(h0)}
    if kind == "lstm":
        inits["init_cell"] = flat(c0)
    fwd = op(rnncore, kind)(x, sequence_lengths=lengths, descriptor=desc, **weights, **inits)
    tol = 3e-15  # measured: 7.2e-16
    assert rel(fwd.state, out.detach().numpy()) <= tol
    finals = [fwd.state[lengths - 1, np.arange(N), :H]]
    if bidirectional:
        finals.append(fwd.state[0, :, H:])
    assert rel(np.stack(finals), hn.detach().numpy()) <= tol
    if cn is not None:
        cells = [fwd.cell[lengths - 1, np.arange(N), :H]] + (
            [fwd.cell[0, :, H:]] if bidirectional else []
        )
        assert rel(np.stack(cells), cn.detach().numpy()) <= tol

    rest = dict(weights)
    R = rest.pop("recurrent_weight")  # noqa: N806
    extra = {"rnn": (), "lstm": (getattr(fwd, "cell", None),), "gru": (fwd.state,)}[kind]
    more = {"cell_gradient": flat(dc)} if kind == "lstm" else {}
    g = gradient_op(rnncore, kind)(
        x,
        R,
        dy,
        fwd.z_state,
        *extra,
        state_gradient=flat(dh),
        sequence_lengths=lengths,
        descriptor=desc,
        **rest,
        **inits,
        **more,
    )
    assert rel(g.source, xt.grad.numpy()) <= tol
    assert rel(g.init_state, flat(h0t.grad.numpy())) <= tol
    if kind == "lstm":
        assert rel(g.init_cell, flat(c0t.grad.numpy())) <= tol
    theirs = dict(layer.named_parameters())
    for name, ours in gradients_to_torch(kind, g, bidirectional=bidirectional).items():
        assert rel(ours, theirs[name].grad.numpy()) <= tol, name


# ---- layers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
def test_torch_module_takes_packed_sequences(kind, bidirectional, batch_first):
    """rnncore.torch with a PackedSequence: the same packed output, h_n (c_n) at each row's
    last step, and the same gradients as torch.nn, 2 layers, float64."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils.rnn import pack_padded_sequence

    import rnncore.torch as rt

    torch.manual_seed(4)
    theirs = getattr(torch.nn, kind)(
        3, 5, 2, batch_first=batch_first, bidirectional=bidirectional
    ).double()
    ours = getattr(rt, kind)(3, 5, 2, batch_first=batch_first, bidirectional=bidirectional)
    ours = ours.double()
    ours.load_state_dict(theirs.state_dict())
    lengths = torch.tensor([4, 7, 1, 7, 2])
    T, N = 7, 5  # noqa: N806
    x = torch.randn((N, T, 3) if batch_first else (T, N, 3), dtype=torch.float64)
    D = 2 if bidirectional else 1  # noqa: N806
    h0 = torch.randn(2 * D, N, 5, dtype=torch.float64)
    results = []
    for module in (ours, theirs):
        xi = x.clone().requires_grad_(True)
        hi = h0.clone().requires_grad_(True)
        packed = pack_padded_sequence(xi, lengths, batch_first=batch_first, enforce_sorted=False)
        out, hn = module(packed, (hi, hi * 0.5) if kind == "LSTM" else hi)
        assert isinstance(out, torch.nn.utils.rnn.PackedSequence)
        hs = hn if kind == "LSTM" else (hn,)
        loss = (out.data * torch.cos(out.data)).sum() + sum((h * h).sum() for h in hs)
        module.zero_grad()
        loss.backward()
        grads = [xi.grad, hi.grad] + [p.grad.clone() for p in module.parameters()]
        results.append((out, hs, grads))
    (o1, h1, g1), (o2, h2, g2) = results
    assert torch.equal(o1.batch_sizes, o2.batch_sizes)
    assert torch.equal(o1.sorted_indices, o2.sorted_indices)
    tol = 1e-14
    assert rel(o1.data.detach(), o2.data.detach()) <= tol
    for a, b in zip(h1, h2):
        assert rel(a.detach(), b.detach()) <= tol
    for a, b in zip(g1, g2):
        assert rel(a, b) <= tol


@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
def test_nn_layer_lengths(kind, bidirectional, batch_first):
    """rnncore.nn layers with lengths= against torch.nn on packed sequences: outputs (zero
    past each length) and backward()'s gradients, 2 layers, float64."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    import rnncore.nn as rn

    torch.manual_seed(5)
    theirs = getattr(torch.nn, kind)(
        3, 4, 2, batch_first=batch_first, bidirectional=bidirectional
    ).double()
    layer = rn.from_torch(theirs)
    assert layer.batch_first == batch_first
    T, N = 6, 4  # noqa: N806
    lengths = np.array([6, 2, 5, 1])
    x = torch.randn((N, T, 3) if batch_first else (T, N, 3), dtype=torch.float64)
    xi = x.clone().requires_grad_(True)
    packed = pack_padded_sequence(xi, torch.tensor(lengths), batch_first, enforce_sorted=False)
    out, _ = theirs(packed)
    out, _ = pad_packed_sequence(out, batch_first, total_length=T)
    dy = torch.randn(out.shape, dtype=torch.float64)
    (out * dy).sum().backward()
    got = layer(x.numpy(), lengths=lengths)
    got = got[0] if kind == "LSTM" else got
    tol = 1e-14
    assert rel(got, out.detach().numpy()) <= tol
    grads = layer.backward(dy.numpy())
    assert rel(grads["x"], xi.grad.numpy()) <= tol
    for name, p in theirs.named_parameters():
        assert rel(torch_gradient(layer, grads, name), p.grad.numpy()) <= tol, name


def torch_gradient(layer, grads, torch_name):
    """The gradient of torch's parameter `torch_name` from rnncore.nn's backward() (a summed
    bias passes its gradient to both parts; the GRU's b_hh is [d b (r, z), d bhn])."""
    base, rest = torch_name.split("_l")
    index, _, reverse = rest.partition("_")
    sfx = ("" if index == "0" else f"_l{index}") + ("_reverse" if reverse else "")
    w = layer._weights
    if base in ("weight_ih", "weight_hh"):
        return grads[w[base == "weight_hh"] + sfx]
    if base == "bias_hh" and len(w) == 4:
        H = layer.hidden_size  # noqa: N806
        return np.concatenate([grads[w[2] + sfx][: 2 * H], grads[w[3] + sfx]])
    return grads[w[2] + sfx]


def test_layer_lengths_errors():
    import rnncore.nn as rn

    layer = rn.GRU(3, 4)
    x = np.zeros((2, 5, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[rnncore.nn.GRU\] lengths must have shape \(2,\)"):
        layer(x, lengths=[1, 2, 3])
    with pytest.raises(ValueError, match=r"\[rnncore.nn.GRU\] lengths must lie in \[0, 5\]"):
        layer(x, lengths=[1, 6])
    with pytest.raises(TypeError, match=r"\[rnncore.nn.GRU\] lengths must hold integers"):
        layer(x, lengths=[1.0, 2.0])
    assert layer(x[0], lengths=3).shape == (5, 4)  # unbatched: one length


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "cpu"])
@pytest.mark.parametrize("kind", KINDS)
def test_float16_storage_with_lengths(device, kind):
    """float16 storage with lengths (Metal devices) agrees with float32 to float16's
    precision, forward and gradients."""
    rng = np.random.default_rng(9)
    T, N, H = 6, 4, 8  # noqa: N806
    lengths = np.array([3, 6, 0, 2])
    inputs = make_inputs(
        rng,
        kind,
        T=T,
        N=N,
        H=H,
        I=5,
        bidirectional=True,
        bias=True,
        init_state=True,
        dtype=np.float32,
    )
    descriptor = full_descriptor(kind, bidirectional=True)
    cot = make_cotangents(
        rng, kind, T=T, N=N, H=H, bidirectional=True, dtype=np.float32, state_gradient=True
    )
    results = []
    for dtype in (np.float32, np.float16):
        inp = {k: v.astype(dtype) for k, v in inputs.items()}
        c = {k: v.astype(dtype) for k, v in cot.items()}
        g, f = run_gradients(
            rnncore, kind, inp, descriptor, c, device=device, sequence_lengths=lengths
        )
        assert f.state.dtype == np.dtype(dtype) and g.source.dtype == np.dtype(dtype)
        results.append((f, g))
    (f32, g32), (f16, g16) = results
    assert rel(f16.state, f32.state) < 1e-2
    for field in g32._fields:
        if getattr(g32, field) is not None:
            assert rel(getattr(g16, field), getattr(g32, field)) < 1e-2, field

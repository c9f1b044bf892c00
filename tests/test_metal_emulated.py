"""The "metal-emulated" device itself: how it is listed and chosen, what it refuses, that
its results (forward and gradients) depend neither on the order the emulator runs the GPU
threads of a threadgroup in (RNNCORE_EMULATOR_SCHEDULE) nor on the order threadgroups start
in (RNNCORE_EMULATOR_ORDER), and that concurrent calls are safe. (Its numerical results are
checked by every forward and gradient suite, which run on all devices.)"""

import threading

import ml_dtypes
import numpy as np
import pytest

import rnncore

pytestmark = pytest.mark.skipif(
    "metal-emulated" not in rnncore.devices(), reason="build without the host emulator"
)

G = {"single_gate_rnn": 1, "lstm": 4, "gru": 3}


def inputs(op, rng, T=4, N=5, I=3, H=33, D=2):  # noqa: E741
    """Every optional input of `op`, float32."""
    g = G[op]
    a = {
        "source": rng.standard_normal((T, N, I)),
        "recurrent_weight": rng.standard_normal((D, g * H, H)) * 0.3,
        "input_weight": rng.standard_normal((D * g * H, I)) * 0.5,
        "bias": rng.standard_normal(D * g * H),
        "init_state": rng.standard_normal((N, D * H)),
        "mask": (rng.random((N, D * H)) > 0.3) * 1.0,
    }
    if op == "lstm":
        a["init_cell"] = rng.standard_normal((N, D * H))
        a["peephole"] = rng.standard_normal((D, 4 * H))
    if op == "gru":
        a["secondary_bias"] = rng.standard_normal(D * H)
    return {k: v.astype(np.float32) for k, v in a.items()}


DESCRIPTORS = {
    "single_gate_rnn": rnncore.RNNDescriptor(bidirectional=True, training=True),
    "lstm": rnncore.LSTMDescriptor(bidirectional=True, training=True, produce_cell=True),
    "gru": rnncore.GRUDescriptor(bidirectional=True, training=True),
    "gru_reset_after": rnncore.GRUDescriptor(
        bidirectional=True, training=True, reset_after=True, flip_z=True
    ),
}


def run(name, args, device="metal-emulated"):
    op = "gru" if name.startswith("gru") else name
    return getattr(rnncore, op)(**args, descriptor=DESCRIPTORS[name], device=device)


def test_listed_last_and_never_the_default(monkeypatch):
    """It is a testing device: listed after the CPU, picked only when asked for."""
    monkeypatch.delenv("RNNCORE_DEVICE", raising=False)
    devices = rnncore.devices()
    assert devices.index("metal-emulated") > devices.index("cpu")
    # float64 works with the default device, so the default is not a Metal device.
    x = np.ones((2, 1, 3))
    assert rnncore.single_gate_rnn(x, np.eye(3)).state.dtype == np.float64


@pytest.mark.parametrize("kernels", ["never", "always"])
@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_shuffled_schedule_gives_identical_results(name, kernels, monkeypatch, rng):
    """Threads of each threadgroup run in random orders: the kernels (per-step, and
    persistent: RNNCORE_METAL_PERSISTENT) synchronise correctly, so every output is
    bit-identical to the in-order run."""
    op = "gru" if name.startswith("gru") else name
    monkeypatch.setenv("RNNCORE_METAL_PERSISTENT", kernels)
    args = inputs(op, rng)
    monkeypatch.setenv("RNNCORE_EMULATOR_SCHEDULE", "ordered")
    ordered = run(name, args)
    for seed in (1, 2):
        monkeypatch.setenv("RNNCORE_EMULATOR_SCHEDULE", f"shuffle:{seed}")
        shuffled = run(name, args)
        for a, b in zip(ordered, shuffled):
            if a is not None:
                np.testing.assert_array_equal(a, b)


def forward_and_gradients(name, args, rng, device="metal-emulated"):
    """Every output of the op's forward (training) and gradient calls on the emulator: the
    real kernels of the op (steps, projection GEMM, R^T, gradient steps, weight-gradient
    GEMMs, column sums)."""
    op = "gru" if name.startswith("gru") else name
    dtype = args["source"].dtype
    fwd = run(name, args, device)
    grad_args = dict(args, z_state=fwd.z_state)
    grad_args["source_gradient"] = rng.standard_normal(fwd.state.shape).astype(dtype)
    grad_args["state_gradient"] = rng.standard_normal(args["init_state"].shape).astype(dtype)
    if op == "gru":
        grad_args["output_fwd"] = fwd.state
    if op == "lstm":
        grad_args["cell_output_fwd"] = fwd.cell
        grad_args["cell_gradient"] = rng.standard_normal(fwd.cell.shape).astype(dtype)
    grads = getattr(rnncore, op + "_gradients")(
        **grad_args, descriptor=DESCRIPTORS[name], device=device
    )
    return [a for a in (*fwd, *grads) if a is not None]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_threadgroup_order_gives_identical_results(name, dtype, monkeypatch):
    """Threadgroups started in reverse and in random orders: no kernel of any op relies on
    another threadgroup of its dispatch having run (which the GPU does not promise), so
    every forward and gradient output is bit-identical to the forward order's."""
    op = "gru" if name.startswith("gru") else name
    args = {k: v.astype(dtype) for k, v in inputs(op, np.random.default_rng(5)).items()}
    monkeypatch.setenv("RNNCORE_EMULATOR_ORDER", "forward")
    expected = forward_and_gradients(name, args, np.random.default_rng(6))
    for order in ("reverse", "random:1", "random:2"):
        monkeypatch.setenv("RNNCORE_EMULATOR_ORDER", order)
        got = forward_and_gradients(name, args, np.random.default_rng(6))
        assert len(got) == len(expected)
        for a, b in zip(expected, got):
            np.testing.assert_array_equal(a, b, err_msg=order)


# Awkward sizes for the step kernels: T = 1, N = 1, H = 1, H and N off multiples of 8 and 32.
AWKWARD = [(1, 1, 1), (3, 1, 31), (4, 5, 33), (2, 8, 32), (2, 9, 7)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_persistent_kernels_match_the_per_step_kernels(name, dtype, monkeypatch):
    """A persistent kernel runs the per-step kernels' bodies for every step and grid position
    in one threadgroup: every forward and gradient output is bit-identical to the per-step
    plan's (one dispatch a step), with every optional input, at awkward sizes; and with a
    pipeline that allows fewer threads (a GPU's limit for a kernel with many registers) the
    persistent kernel takes fewer simdgroups, with the same results."""
    op = "gru" if name.startswith("gru") else name
    for T, N, H in AWKWARD:
        rng = np.random.default_rng(T * 100 + N * 10 + H)
        args = {k: v.astype(dtype) for k, v in inputs(op, rng, T=T, N=N, H=H).items()}
        runs = {}
        for mode, max_threads in (("never", "1024"), ("always", "1024"), ("always", "288")):
            monkeypatch.setenv("RNNCORE_METAL_PERSISTENT", mode)
            monkeypatch.setenv("RNNCORE_EMULATOR_MAX_THREADS", max_threads)
            runs[mode, max_threads] = forward_and_gradients(name, args, np.random.default_rng(6))
        expected = runs["never", "1024"]
        for key, got in runs.items():
            assert len(got) == len(expected)
            for a, b in zip(expected, got):
                np.testing.assert_array_equal(a, b, err_msg=f"{key} T={T} N={N} H={H}")


def test_pipeline_thread_limit_refuses_fixed_threadgroups(monkeypatch, rng):
    """Kernels planned for a fixed threadgroup (the GEMMs: 256 threads) are refused, by name,
    where the pipeline allows fewer, as the metal-cpp executor refuses them."""
    monkeypatch.setenv("RNNCORE_EMULATOR_MAX_THREADS", "128")
    with pytest.raises(RuntimeError, match=r"gemm_fff' needs 256 threads .* allows 128"):
        run("single_gate_rnn", inputs("single_gate_rnn", rng))
    monkeypatch.setenv("RNNCORE_EMULATOR_MAX_THREADS", "lots")
    with pytest.raises(ValueError, match="RNNCORE_EMULATOR_MAX_THREADS"):
        run("single_gate_rnn", inputs("single_gate_rnn", rng))


def test_bad_persistent_setting_is_refused(monkeypatch, rng):
    monkeypatch.setenv("RNNCORE_METAL_PERSISTENT", "sometimes")
    with pytest.raises(ValueError, match="RNNCORE_METAL_PERSISTENT"):
        run("single_gate_rnn", inputs("single_gate_rnn", rng))


def test_bad_order_setting_is_refused(monkeypatch, rng):
    monkeypatch.setenv("RNNCORE_EMULATOR_ORDER", "sideways")
    with pytest.raises(ValueError, match="RNNCORE_EMULATOR_ORDER"):
        run("single_gate_rnn", inputs("single_gate_rnn", rng))


def test_bad_schedule_setting_is_refused(monkeypatch, rng):
    monkeypatch.setenv("RNNCORE_EMULATOR_SCHEDULE", "sometimes")
    with pytest.raises(ValueError, match="RNNCORE_EMULATOR_SCHEDULE"):
        run("single_gate_rnn", inputs("single_gate_rnn", rng))


@pytest.mark.parametrize("op", sorted(G))
def test_float64_is_a_type_error_naming_op_and_device(op, rng):
    args = {k: v.astype(np.float64) for k, v in inputs(op, rng, D=1).items()}
    args["recurrent_weight"] = args["recurrent_weight"][0]
    if "peephole" in args:
        args["peephole"] = args["peephole"][0]
    with pytest.raises(TypeError, match=rf"\[{op}\] device 'metal-emulated' computes float32"):
        getattr(rnncore, op)(**args, device="metal-emulated")


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_shuffled_schedule_gives_identical_gradients(name, monkeypatch, rng):
    """The gradient kernels (steps, R^T, GEMMs, column sums) are schedule-independent too."""
    op = "gru" if name.startswith("gru") else name
    args = inputs(op, rng)
    fwd = run(name, args)
    grad_args = dict(args, source_gradient=rng.standard_normal(fwd.state.shape).astype(np.float32))
    grad_args["z_state"] = fwd.z_state
    grad_args["state_gradient"] = rng.standard_normal(args["init_state"].shape).astype(np.float32)
    if op == "gru":
        grad_args["output_fwd"] = fwd.state
    if op == "lstm":
        grad_args["cell_output_fwd"] = fwd.cell
        grad_args["cell_gradient"] = rng.standard_normal(fwd.cell.shape).astype(np.float32)
    fn = getattr(rnncore, op + "_gradients")
    results = []
    for schedule in ("ordered", "shuffle:3"):
        monkeypatch.setenv("RNNCORE_EMULATOR_SCHEDULE", schedule)
        results.append(fn(**grad_args, descriptor=DESCRIPTORS[name], device="metal-emulated"))
    for a, b in zip(*results):
        if a is not None:
            np.testing.assert_array_equal(a, b)


def test_concurrent_calls_match_serial(rng):
    """The emulator keeps its scheduler and function constants per thread."""
    args = [inputs("lstm", rng, T=3, N=3, H=17) for _ in range(4)]
    serial = [run("lstm", a).state for a in args]
    results = [None] * len(args)

    def work(i):
        for _ in range(3):
            results[i] = run("lstm", args[i]).state

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(serial, results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_split_reductions_match_float64(name):
    """Long reductions after the gradient loop (K = T*N = 400: dR and dW split along K into
    partials; the bias, secondary-bias and peephole gradients summed in row blocks, then
    their partials summed) give the float64 CPU results to float32 accuracy: within 3e-6 of
    each output's largest value (measured: at most 1.4e-6), or twice the CPU's own float32
    error where that is larger (the peephole gradient's sums cancel: 2.1e-5 on both)."""
    op = "gru" if name.startswith("gru") else name
    args = inputs(op, np.random.default_rng(11), T=50, N=8, I=5, H=9)
    got = forward_and_gradients(name, args, np.random.default_rng(6))
    f64 = {k: v.astype(np.float64) for k, v in args.items()}
    want = forward_and_gradients(name, f64, np.random.default_rng(6), device="cpu")
    cpu32 = forward_and_gradients(name, args, np.random.default_rng(6), device="cpu")
    assert len(got) == len(want) == len(cpu32)
    for a, b, c in zip(got, want, cpu32):
        scale = max(1.0, float(np.abs(b).max()))
        tolerance = max(3e-6 * scale, 2 * float(np.abs(c - b).max()))
        np.testing.assert_allclose(a, b, rtol=0, atol=tolerance)

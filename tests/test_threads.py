"""Threads never change results: rnncore promises the same bits for the same inputs
whatever set_num_threads / RNNCORE_NUM_THREADS says and whatever runs beside the call
(README, "How the CPU backend works"). Every operation, forward and gradients, is
compared bit for bit across thread counts and with calls made from 8 Python threads at
once (the GIL is released while rnncore computes; a call that finds the thread pool busy
runs on its own thread), on every device. No timing here."""

import concurrent.futures
import threading

import numpy as np
import pytest
from cases import (
    BFLOAT16,
    GRADIENT_FIELDS,
    KINDS,
    make_cotangents,
    make_descriptor,
    make_inputs,
    result_fields,
    run,
    run_gradients,
    supported,
    with_fields,
)
from util import devices_under_test

import rnncore

THREAD_COUNTS = (1, 2, 3, 8, 0)  # 0: the default (every usable core)

# (T, N, I, H, bidirectional): N = 1 and 32, H in {1, 31, 33, 64, 128, 256}, T = 1, bidirectional;
# the larger ones split their work into several chunks (hidden-unit panels, batch slices
# of the gradients, GEMM blocks) on the CPU. I = None: no input weight.
CPU_SHAPES = (
    (6, 1, 8, 1, False),
    (1, 32, 16, 128, False),
    (7, 32, 20, 31, False),
    (5, 32, 20, 33, True),
    (6, 1, None, 256, False),
    (9, 1, 24, 128, True),
    (12, 48, 64, 128, True),
    (20, 32, 64, 128, False),
    (2, 1, 160, 256, False),  # a few rows' products halved by columns (parallel_gemm)
    (7, 1, 20, 64, False),  # a small step split because its panels outgrow L1
    (1, 8, 160, 256, False),  # products of a few rows on the weights as stored (gemm_nt)
    (3, 5, 200, 150, True),  # ... the projection's 15 rows; partial vectors of k
)
# The Metal emulator runs every GPU thread as a fiber: smaller sizes.
EMULATED_SHAPES = (
    (6, 1, 8, 1, False),
    (1, 32, 16, 128, False),
    (5, 32, 12, 31, False),
    (4, 32, 12, 33, True),
)


def shapes_for(device):
    return CPU_SHAPES if device == "cpu" else EMULATED_SHAPES


def dtypes_for(device):
    return [dt for dt in (np.float32, np.float64, np.float16, BFLOAT16) if supported(device, dt)]


def variants(kind):
    """Descriptor fields and optional inputs: every op's options in a few combinations."""
    if kind == "rnn":
        return [
            ({"activation": "TANH"}, {"bias": True, "init_state": True, "mask": "ndh"}),
            ({"activation": "RELU", "reverse": True}, {}),
        ]
    if kind == "lstm":
        return [
            ({}, {"bias": True, "init_state": True, "init_cell": True, "peephole": True}),
            ({"forget_gate_last": True}, {"mask": "n1"}),
        ]
    return [
        ({"reset_after": True, "reset_gate_first": True}, {"bias": True, "secondary_bias": True}),
        ({"flip_z": True}, {"init_state": True, "mask": "dh"}),
    ]


def make_case(kind, shape, variant, dtype, seed):
    T, N, I, H, bidirectional = shape  # noqa: E741 (the contract's names)
    fields, options = variants(kind)[variant]
    rng = np.random.default_rng(seed)
    sizes = {"T": T, "N": N, "H": H, "bidirectional": bidirectional, "dtype": dtype}
    inputs = make_inputs(rng, kind, I=I, **sizes, **options)
    desc = make_descriptor(kind, bidirectional=bidirectional, **fields)
    cell_gradient = "steps" if variant else "final"
    cot = make_cotangents(rng, kind, **sizes, state_gradient=True, cell_gradient=cell_gradient)
    return kind, inputs, desc, cot


def outputs(case, device):
    """Every output of the inference forward, the training forward and the gradients."""
    kind, inputs, desc, cot = case
    out = {}
    inference = run(rnncore, kind, inputs, with_fields(desc, training=False), device=device)
    out["inference state"] = inference.state
    grads, forward = run_gradients(rnncore, kind, inputs, desc, cot, device=device)
    for field in result_fields(kind):
        out[f"training {field}"] = getattr(forward, field)
    for field in GRADIENT_FIELDS[kind]:
        if getattr(grads, field) is not None:
            out[f"d{field}"] = getattr(grads, field)
    return {k: np.array(v, copy=True) for k, v in out.items()}


def assert_same_bits(actual, expected, what):
    assert actual.keys() == expected.keys(), what
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=f"{what}: {name}")


def cases_for(device, kind, dtype):
    return [
        make_case(kind, shape, variant, dtype, seed=1000 * i + variant)
        for i, shape in enumerate(shapes_for(device))
        for variant in range(len(variants(kind)))
    ]


@pytest.fixture
def restore_threads():
    yield
    rnncore.set_num_threads(0)


@pytest.mark.parametrize("device", devices_under_test())
@pytest.mark.parametrize("kind", KINDS)
def test_thread_count_does_not_change_bits(device, kind, restore_threads):
    # The emulator's GPU threads are fibers on the pool: 1, 3 and 8 of its threads (the
    # default is 2 on CI's 2 cores).
    counts = THREAD_COUNTS[1:] if device == "cpu" else (3, 8)
    for dtype in dtypes_for(device):
        cases = cases_for(device, kind, dtype)
        rnncore.set_num_threads(1)
        expected = [outputs(c, device) for c in cases]
        for n in counts:
            rnncore.set_num_threads(n)
            for i, c in enumerate(cases):
                what = f"{device} {kind} {np.dtype(dtype).name} case {i} with {n} threads"
                assert_same_bits(outputs(c, device), expected[i], what)


def run_together(jobs):
    """Runs every job (a callable) on its own Python thread, all released at once."""
    start = threading.Barrier(len(jobs))

    def call(job):
        start.wait()
        return job()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(call, jobs))


@pytest.mark.parametrize("device", devices_under_test())
@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_calls_match_serial_calls(device, kind, restore_threads):
    rnncore.set_num_threads(0)
    for dtype in dtypes_for(device):
        cases = cases_for(device, kind, dtype)
        serial = [outputs(c, device) for c in cases]
        name = np.dtype(dtype).name
        # Shared inputs: 8 threads make the same call on the same arrays (on the emulator,
        # whose calls take a hundred times as long, the first shape's two variants).
        shared = cases if device == "cpu" else cases[:2]
        for i, c in enumerate(shared):
            for got in run_together([lambda c=c: outputs(c, device)] * 8):
                assert_same_bits(got, serial[i], f"{device} {kind} {name} case {i}, shared")
        # Separate inputs: 8 threads make 8 different calls.
        order = [i % len(cases) for i in range(8)]
        for shift in (0, 3):
            picked = [(i + shift) % len(cases) for i in order]
            results = run_together([lambda c=cases[i]: outputs(c, device) for i in picked])
            for i, got in zip(picked, results):
                assert_same_bits(got, serial[i], f"{device} {kind} {name} case {i}, separate")


def test_bidirectional_lstm_from_8_threads_matches_alone(restore_threads):
    """Issue 10, defect 6: a bidirectional LSTM forward (float32, CPU, T=30 N=32 I=64
    H=128) from 8 threads at once gave other last bits than the same call alone."""
    rng = np.random.default_rng(6)
    T, N, I, H = 30, 32, 64, 128  # noqa: E741 (the contract's names)
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    W = (rng.standard_normal((2 * 4 * H, I)) / np.sqrt(I)).astype(np.float32)
    R = (0.8 * rng.standard_normal((2, 4 * H, H)) / np.sqrt(H)).astype(np.float32)
    b = (0.2 * rng.standard_normal(2 * 4 * H)).astype(np.float32)
    d = rnncore.LSTMDescriptor(bidirectional=True)

    def call():
        return rnncore.lstm(x, R, W, b, descriptor=d, device="cpu").state.copy()

    alone = call()
    for n in THREAD_COUNTS:
        rnncore.set_num_threads(n)
        for _ in range(3):
            for y in run_together([call] * 8):
                np.testing.assert_array_equal(y, alone)
        np.testing.assert_array_equal(call(), alone)


IDLE_SCRIPT = """
import time
import numpy as np
import rnncore
rng = np.random.default_rng(0)
x = rng.random((10, 32, 64), dtype=np.float32)  # split between two threads
R = rng.random((768, 256), dtype=np.float32) * 0.1
W = rng.random((768, 64), dtype=np.float32) * 0.1
rnncore.set_num_threads(2)
time.sleep(0.5)  # the imports' own helper threads settle
for _ in range(20):
    rnncore.gru(x, R, W)
time.sleep(0.05)
t0 = time.process_time()
time.sleep(0.3)
print(time.process_time() - t0)
"""


def test_idle_helpers_sleep():
    """A helper stays awake for 1 ms after a call (yielding its core), then sleeps: a process
    whose calls have ended uses no CPU (measured 0.05-0.08 ms of CPU time in 300 ms here; a
    helper spinning on would take 300). A fresh process, so that no other library's threads
    spin; the calls are large enough to be split between two threads."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", IDLE_SCRIPT], capture_output=True, text=True, check=True
    )
    busy = float(out.stdout.strip())
    assert busy < 0.03, f"{busy * 1e3:.1f} ms of CPU time in 300 ms idle"


def _cpu_limited_group(tmp_name, quota_us, period_us=100000):
    """A new control group under this process's own allowing quota/period CPUs: its
    directory and the file a process writes its pid into to join it; None where this
    machine does not let the test make one (not root, no cpu controller, a v2 group with
    processes of its own). cgroup v1's cpu hierarchy, else v2's."""
    import os
    from pathlib import Path

    mounts = {}  # "v1" or "v2": mount point
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        rest = fields[fields.index("-") + 1 :]
        if len(rest) < 3:
            continue
        point = fields[4]
        if rest[0] == "cgroup" and "cpu" in rest[2].split(","):
            mounts["v1"] = point
        elif rest[0] == "cgroup2":
            mounts.setdefault("v2", point)
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        ident, controllers, path = line.split(":", 2)
        if ident == "0" and not controllers:
            own["v2"] = path
        elif "cpu" in controllers.split(","):
            own["v1"] = path
    for version in ("v1", "v2"):
        if version not in mounts or version not in own:
            continue
        parent = Path(mounts[version] + own[version])
        if version == "v2" and "cpu" not in (parent / "cgroup.subtree_control").read_text().split():
            continue
        group = parent / f"{tmp_name}_{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            if version == "v1":
                (group / "cpu.cfs_period_us").write_text(str(period_us))
                (group / "cpu.cfs_quota_us").write_text(str(quota_us))
            else:
                (group / "cpu.max").write_text(f"{quota_us} {period_us}")
            return group, group / "cgroup.procs"
        except OSError:
            group.rmdir()
    return None


THREADS_IN_GROUP = """
import sys
open(sys.argv[1], "w").write(str(__import__("os").getpid()))
import rnncore
default = rnncore.num_threads()
rnncore.set_num_threads(8)
rnncore.set_num_threads(0)
print(default, rnncore.num_threads(), rnncore.build_info()["cpu_quota"])
"""


@pytest.mark.parametrize("quota_cpus", [1.0, 1.5, 0.3])
def test_default_threads_fit_the_cpu_quota(quota_cpus):
    """A process whose control group allows fewer CPUs than it may run on (a container's
    --cpus) uses as many threads as the quota has whole CPUs (at least one) by default, and
    again after set_num_threads(0); build_info() reports the quota; RNNCORE_NUM_THREADS
    still says otherwise. Made for real in a new group where this machine allows it."""
    import os
    import subprocess
    import sys

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if cpus < 2:
        pytest.skip("one usable CPU: no quota can lower the default")
    made = _cpu_limited_group("rnncore_quota", int(quota_cpus * 100000))
    if made is None:
        pytest.skip("this machine does not let the test make a control group with a CPU quota")
    group, procs = made
    try:
        env = {k: v for k, v in os.environ.items() if k != "RNNCORE_NUM_THREADS"}
        run = [sys.executable, "-c", THREADS_IN_GROUP, str(procs)]
        out = subprocess.run(run, capture_output=True, text=True, check=True, env=env)
        expected = max(1, int(quota_cpus))
        default, restored, quota = out.stdout.split()
        assert [default, restored] == [str(expected)] * 2, out.stdout
        assert float(quota) == pytest.approx(quota_cpus), out.stdout
        env["RNNCORE_NUM_THREADS"] = "2"
        out = subprocess.run(run, capture_output=True, text=True, check=True, env=env)
        assert out.stdout.split()[0] == "2", out.stdout
    finally:
        group.rmdir()

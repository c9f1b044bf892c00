"""The benchmark: time rnncore against PyTorch, ONNX Runtime, MLX and a numpy loop.

Both ``python -m rnncore bench`` and ``python bench/run.py`` run this bench (the same
arguments). Per configuration and mode (inference: the forward;
training: the forward plus the gradients of the input and of every weight), every
implementation (rnncore on ``--device`` and each installed peer, rnncore.bench.peers) is first
checked against a float64 reference on the same numbers (PyTorch's autograd on the CPU, or
the numpy loop without torch) and timed only if it agrees: warm-up, then repetitions until
both a minimum count and a minimum time are reached; the median and the minimum are kept.
Full runs time the implementations of a configuration and mode in 3 rounds, taking turns
(each time is the median of its rounds'), so that a shared machine's changes of speed fall
on all of them alike. A GPU peer's device is synchronised before the clock stops. In float16
and bfloat16 configurations ONNX Runtime, whose CPU operators have neither type, runs float32
on the same values: the time narrow storage is measured against, in the same rounds.

Without ``--threads`` everything runs in this process with each library's default thread
count. ``--threads 1 2`` runs each count in its own process with RNNCORE_NUM_THREADS,
OPENBLAS_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS set to it,
torch.set_num_threads(n) and ONNX Runtime's intra-op threads = n.

The loaded-machine guard: every measurement records the CPU time this process used per
wall second and the cores other processes kept busy meanwhile (Linux /proc/stat); one
disturbed by them is repeated (full runs: after waiting for them to calm down), and what
stays disturbed is marked ``*`` and counted in a warning. Before and after a run, a busy
loop pinned to each usable CPU measures the share of the time each ran and its speed
(cpu_availability): what other processes, a quota or a VM's host take, and uneven cores;
and two pinned processes time a round trip between the first two CPUs (cpu_round_trip_ns):
a host that moves a VM's CPUs far apart slows every hand-off between threads.
``--loaded`` instead times rnncore at its default thread count and at 1 thread beside a
competing busy loop; ``--targets`` times the CPU speed targets as paired ratios in
alternating rounds (rnncore.bench.targets).

A run prints its tables; it writes files only where asked (``--out DIR``: results.json,
results.md and, with matplotlib, chart.png; ``--json FILE``) and never replaces an
existing file unless ``--force`` is given. The exit status is 1 if rnncore or a peer
disagrees with the reference, or rnncore fails.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from . import cost, report
from .peers import (
    BY_NAME,
    CONFIGS,
    EMULATED_QUICK,
    MODES,
    QUICK,
    NotSupported,
    Problem,
    RnncoreImpl,
    compare,
    make_peers,
    numpy_reference,
)

# Agreement with the float64 reference: relative error (norm of the difference / norm of
# the reference). float16 is a storage type: implementations round differently.
TOLERANCE = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 1e-4, "float64": 1e-10}
# On a GPU float32 sums run in other orders and partly in hardware approximations.
GPU_FLOAT32_TOLERANCE = 1e-3

# Warm-up calls, then at least `min_reps` calls and `min_time` seconds; a disturbed
# measurement is repeated up to `retries` times, after waiting up to `quiet_wait` seconds
# for the other processes to calm down (--quick does not wait: it must stay short).
# An implementation's time is the median of `rounds` measurements of min_time / rounds
# seconds each, the implementations of a configuration and mode taking turns (calls of up to
# ROUND_CALL_S; slower ones are measured once): a shared machine's speed moves within
# seconds (the same call measured 1.7x slower for a while), and taking turns puts each
# implementation in the same moments rather than rnncore in one and a peer in the next.
TIMING = {
    "full": {
        "warmup": 2,
        "min_reps": 5,
        "min_time": 0.5,
        "retries": 3,
        "quiet_wait": 60.0,
        "rounds": 3,
        "settle": 0.25,
    },
    "quick": {
        "warmup": 1,
        "min_reps": 5,
        "min_time": 0.05,
        "retries": 1,
        "quiet_wait": 0.0,
        "rounds": 1,
        "settle": 0.05,
    },
}
ROUND_CALL_S = 0.5
# Other processes keeping more than this many cores busy disturb a measurement (on top of
# the cores a measurement leaves free: a 1-thread run on 2 cores tolerates one more).
DISTURBED = 0.3
# A call slower than this is timed with SLOW_REPS calls after one warm-up (MLX's per-step
# Python loop takes minutes per call on the large layers); the records show the reps.
SLOW_CALL_S, SLOW_REPS = 5.0, 2
# rnncore's own thread pool reads RNNCORE_NUM_THREADS; its OpenBLAS, numpy's OpenBLAS and
# PyTorch's OpenMP pool read the others.
THREAD_ENV = ("RNNCORE_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Variables that override OpenBLAS's choice of kernels and blocking for this processor:
# recorded, and unset for the worker processes, so times are those of the processor's own.
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
RECORDED_ENV = re.compile(r"^(OPENBLAS|GOTO|OMP|MKL|KMP|RNNCORE|ORT|MLX|TORCH)_")


def add_arguments(parser):
    """The bench's arguments (both entry points take the same ones)."""
    parser.add_argument(
        "--device",
        metavar="NAME",
        help="the rnncore device: cpu, metal or metal-emulated (default: the best available); "
        "the peers run on the matching torch device (mps for metal) and MLX stream; ONNX "
        "Runtime and the numpy loop only beside cpu",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer reps and a subset of the configurations (tiny layers on metal-emulated)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        metavar="N",
        help="run each thread count in its own process with the thread variables set "
        "(default: this process, each library's default)",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=sorted(BY_NAME),
        metavar="NAME",
        help="configurations to run (default: all; with --quick, a subset): " + ", ".join(BY_NAME),
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write results.json, results.md and chart.png (loaded.json and loaded.md with "
        "--loaded) into DIR",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results to FILE")
    parser.add_argument("--force", action="store_true", help="replace existing result files")
    parser.add_argument(
        "--loaded",
        action="store_true",
        help="time rnncore (cpu) at its default thread count and at 1 thread beside one "
        "competing CPU-bound process",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="--loaded: alternating rounds (default 7; 3 with --quick); --targets: rounds "
        "(default 15; 2 with --quick)",
    )
    parser.add_argument(
        "--layers",
        action="store_true",
        help="the layer section: a training step of 2-layer LSTM and GRU layers through "
        "rnncore.torch / rnncore.mlx beside torch.nn / mlx.nn, and the modules' overhead over "
        "the raw operations",
    )
    parser.add_argument(
        "--lengths",
        action="store_true",
        help="the lengths section: GRU and LSTM over sequences of different lengths, rnncore "
        "with sequence_lengths beside rnncore padded, PyTorch's packed sequences and ONNX "
        "Runtime's sequence_lens",
    )
    parser.add_argument(
        "--targets",
        action="store_true",
        help="the targets section: each CPU speed target as rnncore against the peers it names "
        "in alternating short windows, the median of the rounds' paired ratios (targets.json "
        "and targets.md with --out)",
    )
    # Internal: one worker process (one thread count, or the loaded run) writing JSON.
    parser.add_argument("--worker-threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-loaded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker-section", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-command", help=argparse.SUPPRESS)
    parser.add_argument("--worker-checkout", help=argparse.SUPPRESS)
    return parser


def add_parser(sub):
    """Register ``bench`` on the command line's subparsers."""
    p = sub.add_parser(
        "bench",
        help="time rnncore against PyTorch, ONNX Runtime, MLX and numpy, after checking them",
        description=__doc__.split("\n\n")[1],
    )
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def main(argv=None, checkout=None):
    """``python bench/run.py``: parse `argv` and run; `checkout` is the repository whose
    commit the results record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    args = add_arguments(parser).parse_args(argv)
    args.checkout = checkout
    return run(args)


def checkout_of(args):
    """The checkout whose commit the results record: bench/run.py's, or, in a section's
    process, the one its parent ran from."""
    checkout = getattr(args, "checkout", None)
    worker = getattr(args, "worker_checkout", None)
    return checkout or (Path(worker) if worker else None)


# ---- the loaded-machine guard and timing --------------------------------------------------


def busy_cpu_seconds():
    """CPU seconds the whole machine has spent busy (Linux /proc/stat; None elsewhere).
    Steal time counts as busy: the hypervisor gave the core to someone else."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def usable_cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# One busy Python loop per CPU (cpu_availability): pinned, started together, it counts the
# wall time lost in gaps over 0.1 ms (descheduled) and its iterations while it ran.
CPU_PROBE = """
import os, sys, time
cpu, start, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
os.sched_setaffinity(0, {cpu})
while time.time() < start:
    pass
clock = time.perf_counter
t0 = prev = clock()
end, lost, loops = t0 + seconds, 0.0, 0
while prev < end:
    now = clock()
    if now - prev > 1e-4:
        lost += now - prev
    prev = now
    loops += 1
print(1 - lost / (prev - t0), loops / max(prev - t0 - lost, 1e-9))
"""


def cpu_availability(seconds=0.5):
    """How much of each usable CPU this machine gets when all of them are busy at once: a
    pinned busy loop on each, for `seconds`, measures the share of wall time it ran (other
    processes on it, a cgroup quota, or a host that overcommits a VM's cores stop it for
    milliseconds at a time; the last is not in /proc/stat where the host reports no steal
    time) and its speed while running, relative to the fastest CPU's (a core shared with
    another guest's thread runs slower). {"cpus": [...], "ran": [...], "speed": [...]}, or
    None off Linux or when a probe fails."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))[:64]
    start = time.time() + 0.3 + 0.02 * len(cpus)  # after every probe has started
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CPU_PROBE, str(c), repr(start), repr(seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for c in cpus
        ]
        outs = [p.communicate(timeout=30 + seconds)[0].split() for p in procs]
        ran, rate = [float(o[0]) for o in outs], [float(o[1]) for o in outs]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return {
        "cpus": cpus,
        "ran": [round(r, 3) for r in ran],
        "speed": [round(r / max(rate), 3) for r in rate],
        "round_trip_ns": cpu_round_trip_ns(),
    }


# Two Python processes pinned to two CPUs bounce a byte through a shared page
# (cpu_round_trip_ns): a round trip is two cache-line transfers between the cores. A host
# that moves a VM's CPUs far apart (another core complex or socket) makes it several times
# longer, and with it every hand-off between rnncore's threads (the batch-1 steps hand off
# 100 times a call).
ROUND_TRIP_PROBE = """
import mmap, os, sys, time
path, cpu, n, leader = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
os.sched_setaffinity(0, {cpu})
with open(path, "r+b") as f:
    b = mmap.mmap(f.fileno(), 4096)
mine, theirs = (0, 64) if leader else (64, 0)
b[mine] = 1
deadline = time.time() + 10
while b[theirs] == 0:
    if time.time() > deadline:
        sys.exit(1)
t0 = time.perf_counter()
for i in range(2, n + 2):
    v = i & 127
    if leader:
        b[mine] = v
        while b[theirs] != v:
            pass
    else:
        while b[theirs] != v:
            pass
        b[mine] = v
if leader:
    print((time.perf_counter() - t0) / n * 1e9)
"""


def cpu_round_trip_ns(n=3000):
    """Nanoseconds a round trip between the first two usable CPUs takes (ROUND_TRIP_PROBE,
    the interpreter's loop included: report.FAR_ROUND_TRIP_NS), or None with fewer than two
    CPUs, off Linux, or when a probe fails."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix="rnncore-rtt-") as f:
            f.write(bytes(4096))
            f.flush()
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", ROUND_TRIP_PROBE, f.name, str(cpu), str(n), lead],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for cpu, lead in ((cpus[1], "0"), (cpus[0], "1"))
            ]
            outs = [p.communicate(timeout=30)[0] for p in procs]
            if any(p.returncode for p in procs):
                return None
            return round(float(outs[1]))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def allowed_other_cpu(threads):
    """How many cores other processes may keep busy without disturbing `threads` threads."""
    return DISTURBED + max(0.0, usable_cpus() - threads - 0.5)


def others_busy(seconds=0.5):
    """Cores the machine's processes (this one is idle) keep busy over `seconds`."""
    busy0 = busy_cpu_seconds()
    if busy0 is None:
        return None
    time.sleep(seconds)
    return (busy_cpu_seconds() - busy0) / seconds


def wait_for_quiet(limit, allowed):
    """Wait (up to `limit` seconds) until other processes keep fewer than `allowed` cores
    busy over half a second; returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        busy = others_busy()
        if busy is None or busy < allowed:
            break
    return time.perf_counter() - started


def measure_once(fn, sync, warmup, min_reps, min_time):
    for i in range(warmup):
        t0 = time.perf_counter()
        fn()
        sync()
        if i == 0 and time.perf_counter() - t0 > SLOW_CALL_S:
            min_reps = min(min_reps, SLOW_REPS)
            break
    gc.collect()
    times = []
    busy0, cpu0, wall0 = busy_cpu_seconds(), time.process_time(), time.perf_counter()
    while len(times) < min_reps or sum(times) < min_time:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - wall0
    own = time.process_time() - cpu0
    busy1 = busy_cpu_seconds()
    return {
        "median_s": float(np.median(times)),
        "min_s": float(np.min(times)),
        "reps": len(times),
        "cpu_use": round(own / wall, 2),
        "other_cpu": None if busy0 is None else round(max(busy1 - busy0 - own, 0.0) / wall, 2),
    }


def disturbed(m, allowed):
    """Whether other processes kept more than `allowed` cores busy, allowing for the
    10 ms resolution of /proc/stat over a short measurement."""
    if m["other_cpu"] is None:
        return False
    wall = m["median_s"] * m["reps"]
    return m["other_cpu"] > allowed + 2 / os.sysconf("SC_CLK_TCK") / max(wall, 1e-3)


def measure(fn, timing, allowed, sync=lambda: None):
    """Median and minimum wall time of fn() (seconds), the CPU time this process used per
    wall second ("cpu_use": about 1 for one busy core) and the cores other processes kept
    busy meanwhile ("other_cpu"). A measurement disturbed by them (more than `allowed`
    cores) is repeated, keeping the least disturbed one."""
    # Let the previous implementation's worker threads stop spinning (OpenBLAS waits about
    # 0.1 s, OpenMP and ONNX Runtime less) before this one is timed beside them (--quick,
    # whose times are only indicative, waits less).
    time.sleep(timing["settle"])
    best = None
    for attempt in range(1 + timing["retries"]):
        if attempt:
            wait_for_quiet(timing["quiet_wait"], allowed)
        warmup = timing["warmup"] if attempt == 0 else 1
        result = measure_once(fn, sync, warmup, timing["min_reps"], timing["min_time"])
        if best is None or (result["other_cpu"] or 0) < (best["other_cpu"] or 0):
            best = result
        if not disturbed(best, allowed):
            break
    best["attempts"] = attempt + 1
    best["disturbed"] = disturbed(best, allowed)
    return best


# [m, k] · [k, n]: the usual 2048² peak, and the products of the LSTM T=100 N=32 I=H=256 layer
# (its input projection, x [T·N, I] · Wᵀ, and one step's h [N, H] · Rᵀ), where the peak that
# matters is the one at these shapes, and ONNX Runtime's own GEMM (MLAS, B prepacked as its
# LSTM's weights are) may run faster than OpenBLAS's.
GEMM_SHAPES = {"projection": (3200, 256, 1024), "step": (32, 256, 1024)}


def onnx_matmul(b, threads):
    """C = A · b by ONNX Runtime's MatMul (MLAS) with b a constant (prepacked), or None."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])],
        "gemm",
        [helper.make_tensor_value_info("A", elem[b.dtype], [None, b.shape[0]])],
        [helper.make_tensor_value_info("C", elem[b.dtype], [None, b.shape[1]])],
        initializer=[numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception:  # noqa: BLE001 (a type it has no MatMul for: not measured)
        return None
    return lambda a: session.run(None, {"A": a})[0]


def gemm_candidates(a, b, threads):
    """The libraries' products a · b, each checked against numpy's before it is timed."""
    out = {"numpy": lambda: a @ b}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        out["torch"] = lambda: torch.mm(ta, tb)
    ort_mm = onnx_matmul(b, threads)
    if ort_mm is not None:
        out["onnxruntime"] = lambda: ort_mm(a)
    want = a @ b
    scale = np.abs(want).max()
    tol = 1e-4 if a.dtype == np.float32 else 1e-10
    return {
        name: fn
        for name, fn in out.items()
        if np.abs(np.asarray(fn(), dtype=np.float64) - want).max() <= tol * scale
    }


def gemm_peak(timing, allowed, threads=None):
    """GFLOP/s of a 2048² matrix product in float32 and float64 by numpy (OpenBLAS), torch
    and ONNX Runtime (MLAS), and of float32 products at the layer's shapes (GEMM_SHAPES);
    bfloat16 2048² by torch (oneDNN) where it multiplies bfloat16."""
    rng = np.random.default_rng(0)
    out = {}
    timing = {**timing, "warmup": 1}
    n = 2048
    for dtype, prefix in ((np.float32, "sgemm"), (np.float64, "dgemm")):
        a = rng.standard_normal((n, n)).astype(dtype)
        b = rng.standard_normal((n, n)).astype(dtype)
        for name, fn in gemm_candidates(a, b, threads).items():
            t = measure(fn, timing, allowed)
            out[f"{prefix}_{name}_gflops"] = round(2 * n**3 / t["median_s"] / 1e9, 1)
        out[f"{prefix}_peak_gflops"] = max(
            v for k, v in out.items() if k.startswith(prefix + "_") and k.endswith("_gflops")
        )
    shapes = {}
    for label, (m, k, cols) in GEMM_SHAPES.items():
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, cols)).astype(np.float32)
        shapes[label] = {"m": m, "k": k, "n": cols}
        for name, fn in gemm_candidates(a, b, threads).items():
            t = measure(fn, timing, allowed)
            shapes[label][f"{name}_gflops"] = round(2 * m * k * cols / t["median_s"] / 1e9, 1)
    out["sgemm_shapes"] = shapes
    try:
        import torch

        a = torch.randn(n, n).to(torch.bfloat16)
        b = torch.randn(n, n).to(torch.bfloat16)
        t = measure(lambda: torch.mm(a, b), timing, allowed)
        out["bf16gemm_torch_gflops"] = round(2 * n**3 / t["median_s"] / 1e9, 1)
    except ImportError:
        pass
    return out


# ---- one worker: check then time every implementation --------------------------------------


def tolerance(dtype, device):
    if dtype == "float32" and device == "metal":
        return GPU_FLOAT32_TOLERANCE
    return TOLERANCE[dtype]


def one_line(e):
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text if len(text) <= 200 else text[:197] + "..."


def run_one(impl, problem, mode, threads, expected, timing, device):
    """Check, then (if it agrees) time one implementation; returns its record."""
    config = problem.config
    record = {"config": config.name, "mode": mode, "threads": threads, "impl": impl.name}
    record["where"] = impl.where(config) if hasattr(impl, "where") else impl.label
    tol = tolerance(config.dtype, device)
    try:
        prepared = impl.prepare(problem, mode, threads)
        out = prepared.run()
        prepared.sync()
        errors = compare(prepared.result(out), expected)
    except NotSupported as e:
        return {**record, "status": "n/a", "note": str(e)}
    except Exception as e:  # noqa: BLE001 (recorded; rnncore's errors fail the run)
        return {**record, "status": "error", "note": one_line(e)}
    field = max(errors, key=lambda k: (np.nan_to_num(errors[k], nan=np.inf), k))
    max_err = float(np.nan_to_num(errors[field], nan=np.inf))
    passed = bool(max_err <= tol)
    record["check"] = {
        "max_rel_err": max_err,
        "field": field,
        "tolerance": tol,
        "passed": passed,
        "fields": errors,
    }
    if not passed:
        note = f"disagrees with the reference: {field} relative error {max_err:.2e} > {tol:.0e}"
        return {**record, "status": "FAILED-CHECK", "note": note}
    record.update(measure(prepared.run, round_timing(timing), allowed_other_cpu(threads),
                          prepared.sync))  # fmt: skip
    record["status"] = "ok"
    record["gflops"] = round(config.flops(mode) / record["median_s"] / 1e9, 2)
    if impl.name == "rnncore" and device in ("metal", "metal-emulated"):
        record.update(cost.model_record(config, mode, device))
    # (for the further rounds: measure_rounds; dropped before the record is written)
    record["_prepared"] = prepared
    return record


def round_timing(timing):
    """The timing of one round: min_time shared among the rounds."""
    return {**timing, "min_time": timing["min_time"] / timing.get("rounds", 1)}


def measure_rounds(records, config, mode, timing, device):
    """Rounds 2.. of the timed records of one configuration and mode (run_one measured the
    first), the implementations taking turns; each record's times become the median of its
    rounds' medians (and the least of their minimums)."""
    timed = [r for r in records if r.get("_prepared") and r["median_s"] <= ROUND_CALL_S]
    for _ in range(timing.get("rounds", 1) - 1):
        for r in timed:
            p = r["_prepared"]
            m = measure(p.run, round_timing(timing), allowed_other_cpu(r["threads"]), p.sync)
            r.setdefault("rounds", [dict((k, r[k]) for k in m if k in r)]).append(m)
    for r in records:
        r.pop("_prepared", None)
        rounds = r.get("rounds")
        if not rounds:
            continue
        r["round_medians_s"] = [m["median_s"] for m in rounds]
        r["median_s"] = float(np.median(r["round_medians_s"]))
        r["min_s"] = min(m["min_s"] for m in rounds)
        r["reps"] = sum(m["reps"] for m in rounds)
        r["cpu_use"] = round(float(np.mean([m["cpu_use"] for m in rounds])), 2)
        others = [m["other_cpu"] for m in rounds if m.get("other_cpu") is not None]
        r["other_cpu"] = max(others) if others else None
        r["attempts"] = sum(m.get("attempts", 1) for m in rounds)
        r["disturbed"] = any(m.get("disturbed") for m in rounds)
        r["gflops"] = round(config.flops(mode) / r["median_s"] / 1e9, 2)
        del r["rounds"]


def configs_of(args, device):
    if args.configs:
        return [BY_NAME[n] for n in args.configs]
    chosen = CONFIGS
    if args.quick:
        chosen = EMULATED_QUICK if device == "metal-emulated" else [BY_NAME[n] for n in QUICK]
    # Unless named, only the configurations whose dtype the device computes (float64: the CPU).
    return [c for c in chosen if computes(device, c.dtype)]


def computes(device, dtype):
    """Whether rnncore computes `dtype` on `device` (asked of the library, not assumed)."""
    import rnncore

    x = np.zeros((1, 1, 1), dtype)
    try:
        rnncore.single_gate_rnn(x, x[0], device=device or None)
    except TypeError:
        return False
    return True


def rnncore_build(rc):
    """Which compiled rnncore was loaded (the package may be reinstalled while a
    benchmark runs): path, size, modification time and a hash of the extension module."""
    path = Path(rc._core.__file__)
    data = path.read_bytes()
    return {
        "path": str(path),
        "size": len(data),
        "mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(path.stat().st_mtime)),
        "sha256": hashlib.sha256(data).hexdigest()[:16],
    }


def thread_settings(threads, rc, peers):
    """What each library reports for its thread count, to verify the limits took effect."""
    info = {"requested": threads, "env": {k: os.environ.get(k) for k in THREAD_ENV}}
    info["rnncore_num_threads"] = rc.num_threads()
    for peer in peers:
        if peer.name == "torch":
            info["torch_threads"] = peer.torch.get_num_threads()
    try:
        from threadpoolctl import threadpool_info

        info["threadpools"] = [
            {k: p.get(k) for k in ("internal_api", "prefix", "version", "num_threads", "filepath")}
            for p in threadpool_info()
        ]
    except ImportError:
        info["threadpools"] = "threadpoolctl not installed"
    return info


def progress(total, desc):
    """A tqdm bar on stderr (a no-op without tqdm)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    # disable=None: no bar when stderr is not a terminal (a log gets the tables only).
    return tqdm(total=total, desc=desc, unit="run", leave=False, file=sys.stderr, disable=None)


def worker(args, device, threads):
    """Check and time every configuration, mode and implementation at `threads` (None:
    the libraries' defaults); prints a table per configuration; returns the records."""
    import rnncore as rc

    timing = TIMING["quick" if args.quick else "full"]
    ours = RnncoreImpl(device)
    peers, missing = make_peers(device)
    if threads is not None:
        rc.set_num_threads(threads)
        for peer in peers:
            if hasattr(peer, "set_threads"):
                peer.set_threads(threads)
    count = threads if threads is not None else rc.num_threads()
    allowed = allowed_other_cpu(count)
    out = {
        "threads": count,
        "threads_set": threads is not None,
        "thread_settings": thread_settings(threads, rc, peers),
        "missing_peers": missing,
        "peers": {p.name: p.label for p in peers},
        "rnncore_build": rnncore_build(rc),
        "allowed_other_cpu": allowed,
        "records": [],
    }
    if not args.quick and device == "cpu":
        out["gemm"] = gemm_peak(timing, allowed, count)
    torch_peer = next((p for p in peers if p.name == "torch"), None)
    out["reference"] = "torch float64 autograd" if torch_peer else "numpy float64 loop"
    configs = configs_of(args, device)
    bar = progress(len(configs) * len(args.modes) * (1 + len(peers)), f"{count} thread(s)")
    for config in configs:
        problem = Problem(config)
        ref = torch_peer.reference(problem) if torch_peer else numpy_reference(problem)
        records = []
        for mode in args.modes:
            expected = ref if mode == "training" else {"y": ref["y"]}
            own = run_one(ours, problem, mode, count, expected, timing, device)
            in_mode = [own]
            for impl in peers:
                if own["status"] == "n/a":  # what rnncore's device cannot compute: no ratio
                    in_mode.append({**own, "impl": impl.name, "where": impl.label})
                    continue
                in_mode.append(run_one(impl, problem, mode, count, expected, timing, device))
                if bar is not None:
                    bar.update()
                gc.collect()
            measure_rounds(in_mode, config, mode, timing, device)
            records += in_mode
        report.add_ratios(records)
        text = report.config_table(config.describe(), records, len(args.threads or ()) > 1)
        (bar.write if bar is not None else print)(text)
        sys.stdout.flush()
        out["records"] += records
        if args.worker_out is not None:  # what is done survives a crash of this process
            args.worker_out.write_text(json.dumps(out, indent=1))
    if bar is not None:
        bar.close()
    return out


# ---- the run: workers, guard, reports --------------------------------------------------------


def machine_info():
    """The processor (on macOS: the Apple chip, whose GPU "metal" runs on), its CPUs and
    the OpenBLAS overrides in the environment."""
    model = None
    try:
        if sys.platform == "darwin":
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            model = out.stdout.strip() or None
        else:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except (OSError, subprocess.SubprocessError):
        pass
    info = {
        "cpu_model": model or platform.processor() or platform.machine(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "openblas_overrides": {k: os.environ.get(k) for k in OPENBLAS_OVERRIDES},
    }
    try:
        flags = re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
        wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
        info["cpu_flags"] = [f for f in wanted if f in flags.group(1).split()]
    except (OSError, AttributeError):
        pass
    info.update(cpu_identity())
    return info


# x86 families whose microarchitecture the family number alone names (AMD's).
AMD_FAMILIES = {0x17: "Zen 1/2", 0x19: "Zen 3/4", 0x1A: "Zen 5"}


def cpu_identity(cpuinfo=None, cache_dir="/sys/devices/system/cpu/cpu0/cache"):
    """What tells two processors of one marketing name apart (an "AMD EPYC" may be a Zen 4
    or a Zen 5, whose FMA and conversion rates differ): vendor, family and model numbers
    (and AMD's microarchitecture by family), and the per-core caches. Empty off Linux."""
    try:
        text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first CPU's block
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    out = {}
    if "vendor_id" in fields:
        out["cpu_vendor"] = fields["vendor_id"]
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        family = model = None
    if family is not None:
        out["cpu_family"], out["cpu_model_number"] = family, model
        if out.get("cpu_vendor") == "AuthenticAMD" and family in AMD_FAMILIES:
            out["cpu_microarchitecture"] = AMD_FAMILIES[family]
    caches = {}
    for index in sorted(Path(cache_dir).glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        name = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        caches[name] = size
    if caches:
        out["cpu_caches"] = caches
    return out


def versions():
    out = {}
    for dist in ("rnncore", "numpy", "torch", "onnxruntime", "onnx", "mlx", "scipy-openblas32"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def repository(checkout):
    """The commit of `checkout` (a directory in a git repository), and whether it has
    local changes; None when there is none."""
    if checkout is None:
        return None

    def git(*cmd):
        return subprocess.run(
            ["git", *cmd], cwd=checkout, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.CalledProcessError):
        return None


def worker_env(threads=None):
    """The environment of a worker process: no OpenBLAS overrides, the thread variables set
    to `threads` (None: unset, each library's default)."""
    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_OVERRIDES + THREAD_ENV}
    if threads is not None:
        env.update({k: str(threads) for k in THREAD_ENV})
    return env


def run_worker_process(args, device, flags, threads=None):
    """Run one worker (`flags`) in a new process, the thread variables set to `threads`;
    returns its JSON, or when it failed what it wrote before (marked "failed")."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "worker.json"
        cmd = [sys.executable, "-c", "import sys; from rnncore.bench import main; sys.exit(main())"]
        cmd += [*flags, "--worker-out", str(path), "--device", device, "--modes", *args.modes]
        if args.configs:
            cmd += ["--configs", *args.configs]
        if args.quick:
            cmd.append("--quick")
        if args.rounds:
            cmd += ["--rounds", str(args.rounds)]
        proc = subprocess.run(cmd, env=worker_env(threads), check=False)
        if proc.returncode == 0 and path.exists():
            return json.loads(path.read_text())
        # A crash keeps the configurations done before it (the worker writes after each).
        done = json.loads(path.read_text()) if path.exists() else {"records": []}
        names = list(dict.fromkeys(r["config"] for r in done["records"]))
        print(f"bench worker {' '.join(flags)} failed with exit code {proc.returncode}"
              f" after {len(names)} configuration(s)"
              + (f" (the last done: {names[-1]})" if names else ""))  # fmt: skip
        return {**done, "failed": True, "exit_code": proc.returncode, "configs_done": len(names)}


def run_section_process(args, device):
    """--layers, --lengths or --targets in a process of its own, as the configurations'
    workers run:
    the OpenBLAS overrides unset and, with --threads, the thread variables set to its first
    count (an OPENBLAS_CORETYPE=Haswell left in the environment made rnncore's 2-layer LSTM
    training step 1.37x slower on an AMD Zen 5, through OpenBLAS's older kernels)."""
    threads = args.threads[0] if args.threads else None
    cmd = [sys.executable, "-c", "import sys; from rnncore.bench import main; sys.exit(main())"]
    section = "--layers" if args.layers else "--lengths" if args.lengths else "--targets"
    cmd += [section, "--worker-section", "--device", device]
    if args.quick:
        cmd.append("--quick")
    if args.targets:
        cmd += ["--rounds", str(args.rounds)] if args.rounds else []
        cmd += ["--out", str(args.out)] if args.out is not None else []
        cmd += ["--force"] if args.force else []
        cmd += ["--worker-command", " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])]
    if checkout_of(args) is not None:
        cmd += ["--worker-checkout", str(checkout_of(args))]
    if threads is not None:
        print(f"{threads} thread(s), in a process with the thread variables set", flush=True)
    return subprocess.run(cmd, env=worker_env(threads), check=False).returncode


def writable(path, force):
    """Whether `path` may be written: it does not exist, or --force says to replace it."""
    if path.exists() and not force:
        print(f"not replacing {path} (exists; --force replaces it)", file=sys.stderr)
        return False
    return True


def header(device, machine, timing_name):
    import rnncore as rc

    info = rc.build_info()
    lines = [
        f"rnncore {rc.__version__} bench on device {device!r}: {report.cpu_description(machine)}, "
        f"{machine['usable_cpus']} usable CPUs",
        f"build: devices {', '.join(info.get('devices', []))}; CPU kernels "
        f"{info.get('kernels', '?')}; {info.get('threads', '?')} threads",
        f"python {platform.python_version()}, numpy {np.__version__}; {timing_name} run",
    ]
    overrides = {k: v for k, v in machine["openblas_overrides"].items() if v is not None}
    if overrides:
        lines.append(
            "OpenBLAS overrides recorded and unset for worker processes (--threads): "
            + ", ".join(f"{k}={v}" for k, v in overrides.items())
        )
    if device == "metal-emulated":
        lines.append("metal-emulated: the times measure the host emulator of the Metal kernels")
    lines.append(
        "ratio = rnncore's time / the peer's (below 1: rnncore is faster); a peer is timed "
        "only after agreeing with the float64 reference within "
        + ", ".join(f"{k} {tolerance(k, device):.0e}" for k in TOLERANCE)
    )
    return "\n".join(lines)


def guard(threads_list):
    """The loaded-machine guard before a run: a warning when other processes already keep
    more cores busy than a measurement tolerates."""
    busy = others_busy(1.0)
    allowed = allowed_other_cpu(max(threads_list or [1]))
    if busy is not None and busy > allowed:
        print(
            f"warning: the machine is loaded: other processes keep {busy:.1f} of "
            f"{usable_cpus()} cores busy (a measurement tolerates {allowed:.1f}); times and "
            "ratios are unreliable, disturbed measurements are marked *"
        )
    return busy


def run(args):
    """Run the bench as `args` (add_arguments) say; returns the exit status."""
    import rnncore as rc

    if args.worker_out is not None:  # inside a worker process
        device = args.device
        if args.worker_loaded:
            data = loaded_worker(args)
        else:
            data = worker(args, device, args.worker_threads)
        args.worker_out.write_text(json.dumps(data, indent=1))
        return 0

    device = args.device or rc.devices()[0]
    if args.loaded or (args.targets and args.device is None):
        device = "cpu"
    if device not in rc.devices():
        print(
            f"device {device!r} is not available here (this build has: {', '.join(rc.devices())})",
            file=sys.stderr,
        )
        return 2
    outputs = []
    if args.out is not None:
        names = (
            ("loaded.json", "loaded.md")
            if args.loaded
            else ("targets.json", "targets.md")
            if args.targets
            else ("results.json", "results.md")
        )
        outputs += [args.out / n for n in names]
    if args.json is not None:
        outputs.append(args.json)
    if not args.worker_section and not all(writable(p, args.force) for p in outputs):
        return 2

    started = time.perf_counter()
    machine = machine_info()
    timing_name = "quick" if args.quick else "full"
    if (args.layers or args.lengths or args.targets) and not args.worker_section:
        if args.targets and device != "cpu":
            print("--targets times the CPU backend: --device cpu", file=sys.stderr)
            return 2
        print(header(device, machine, timing_name), flush=True)
        return run_section_process(args, device)
    if not args.worker_section:
        print(header(device, machine, timing_name), flush=True)
    busy_before = guard(args.threads)
    availability = cpu_availability() if not args.worker_section else None
    if availability:
        print(report.availability_line(availability), flush=True)
    results = {
        "command": args.worker_command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "run": timing_name,
        "device": device,
        "machine": machine,
        "others_busy_before": busy_before,
        "cpu_availability_before": availability,
        "versions": versions(),
        "build_info": rc.build_info(),
        "repository": repository(checkout_of(args)),
        "env": {k: v for k, v in sorted(os.environ.items()) if RECORDED_ENV.match(k)},
    }
    if args.loaded:
        return finish_loaded(args, results, started)
    if args.layers:
        from . import layers

        allowed = allowed_other_cpu(usable_cpus())
        rows = layers.run_layers(args.quick, measure, TIMING[timing_name], allowed)
        print(layers.table(rows))
        return 0
    if args.lengths:
        from . import lengths

        allowed = allowed_other_cpu(usable_cpus())
        rows, size = lengths.run_lengths(args.quick, measure, TIMING[timing_name], allowed)
        print(lengths.table(rows, size))
        return 1 if any(r[4] is None for r in rows) else 0
    if args.targets:
        return run_targets_section(args, results)

    configs = configs_of(args, device)
    if args.threads:
        if max(args.threads) > usable_cpus():
            print(f"warning: {max(args.threads)} threads requested, {usable_cpus()} CPUs usable")
        workers = []
        for threads in args.threads:
            print(f"--- {threads} thread(s)", flush=True)
            data = run_worker_process(args, device, ["--worker-threads", str(threads)], threads)
            workers.append({**data, "threads": threads})
    else:
        workers = [worker(args, device, None)]

    records = [r for w in workers for r in w["records"]]
    results.update(
        {
            "settings": {
                "threads": args.threads,
                "modes": args.modes,
                "timing": TIMING[timing_name],
                "tolerance": {k: tolerance(k, device) for k in TOLERANCE},
                "thread_env_set_per_worker": list(THREAD_ENV) if args.threads else [],
            },
            "configs": [
                {
                    "name": c.name,
                    **{k: getattr(c, k) for k in ("kind", "T", "N", "I", "H", "D", "dtype")},
                    "flops": {m: c.flops(m) for m in MODES},
                }
                for c in configs
            ],
            "workers": [{k: v for k, v in w.items() if k != "records"} for w in workers],
            "results": records,
        }
    )
    failures = [
        r
        for r in records
        if r["status"] == "FAILED-CHECK" or (r["impl"] == "rnncore" and r["status"] == "error")
    ]
    failures += [w for w in workers if w.get("failed")]
    results["passed"] = not failures
    results["cpu_availability_after"] = after = cpu_availability()
    if after:
        print("after the run: " + report.availability_line(after))
    results["seconds"] = round(time.perf_counter() - started, 1)
    print(report.summary(results))
    write_outputs(args, results, "results")
    return 0 if results["passed"] else 1


def write_outputs(args, results, stem):
    """results as JSON (--json, --out) and Markdown (--out), and the chart of a timing run
    (--out, when matplotlib is installed)."""
    text = json.dumps(results, indent=1) + "\n"
    if args.json is not None:
        args.json.write_text(text)
        print(f"wrote {args.json}")
    if args.out is None:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(text)
    markdown = report.loaded_markdown(results) if stem == "loaded" else report.markdown(results)
    (args.out / f"{stem}.md").write_text(markdown)
    written = [f"{stem}.json", f"{stem}.md"]
    if stem == "results":
        try:
            report.chart(results, args.out / "chart.png")
            written.append("chart.png")
        except ImportError:
            print("no chart.png: matplotlib is not installed")
        except ValueError as e:
            print(f"no chart.png: {e}")
    print(f"wrote {', '.join(written)} into {args.out}")


# ---- --loaded ----------------------------------------------------------------------------


def run_targets_section(args, results):
    """--targets in its section process (targets.py); exits 1 if an implementation fails."""
    import rnncore as rc

    from . import targets

    threads = rc.num_threads()
    allowed = allowed_other_cpu(threads)
    results["cpu_availability_before"] = before = cpu_availability()
    if before:
        print(report.availability_line(before), flush=True)
    if targets.reference_peer_missing():
        print("--targets needs PyTorch (its float64 reference): pip install \".[bench]\"",
              file=sys.stderr)  # fmt: skip
        return 2
    print(targets.heading(threads), flush=True)
    rows, missing = targets.run_targets(
        args.quick, measure, run_one, TIMING["quick" if args.quick else "full"], allowed,
        threads, args.rounds, lambda row: print(targets.line(row), flush=True),
        round_trip=cpu_round_trip_ns if threads > 1 else None,
    )  # fmt: skip
    text = targets.table(rows, threads)
    results["cpu_availability_after"] = after = cpu_availability()
    if after:
        print("after the run: " + report.availability_line(after))
    if args.out is not None:
        info = {**results, "threads": threads, "missing_peers": missing}
        targets.write(args.out, rows, text, info)
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


def busy_loop():
    """One competing CPU-bound process (a Python busy loop); the caller kills it."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def loaded_worker(args):
    """Times rnncore at the default thread count and at 1 thread, alternating, beside a busy
    loop; returns the records."""
    import rnncore as rc

    timing = TIMING["quick" if args.quick else "full"]
    rounds = args.rounds or (3 if args.quick else 7)
    impl = RnncoreImpl("cpu")
    rc.set_num_threads(0)
    default_threads = rc.num_threads()
    settings = {"default": 0, "single": 1}
    records = []
    competitor = busy_loop()
    try:
        time.sleep(0.2)
        for config in configs_of(args, "cpu"):
            problem = Problem(config)
            for mode in args.modes:
                try:
                    prepared = impl.prepare(problem, mode)
                except NotSupported as e:  # a dtype the CPU does not compute
                    print(f"  {config.name:24} {mode:9} n/a: {e}", flush=True)
                    continue
                outputs = {}
                for key, n in settings.items():
                    rc.set_num_threads(n)
                    outputs[key] = prepared.result(prepared.run())
                same = all(
                    np.array_equal(outputs["default"][k], outputs["single"][k])
                    for k in outputs["default"]
                )
                rounds_s = {key: [] for key in settings}
                other = []
                for r in range(rounds):
                    order = list(settings) if r % 2 == 0 else list(settings)[::-1]
                    for key in order:
                        rc.set_num_threads(settings[key])
                        m = measure_once(
                            prepared.run, prepared.sync, 1, timing["min_reps"], timing["min_time"]
                        )
                        rounds_s[key].append(m["median_s"])
                        if m["other_cpu"] is not None:
                            other.append(m["other_cpu"])
                med = {key: float(np.median(v)) for key, v in rounds_s.items()}
                record = {
                    "config": config.name,
                    "mode": mode,
                    "impl": "rnncore",
                    "default_threads": default_threads,
                    "default_median_s": med["default"],
                    "single_median_s": med["single"],
                    "ratio": med["default"] / med["single"],
                    "round_ratios": [
                        a / b for a, b in zip(rounds_s["default"], rounds_s["single"])
                    ],
                    "rounds": rounds,
                    "same_bits": bool(same),
                    "other_cpu": round(float(np.median(other)), 2) if other else None,
                }
                records.append(record)
                print(report.loaded_line(record), flush=True)
                gc.collect()
    finally:
        competitor.kill()
        competitor.wait()
        rc.set_num_threads(0)
    return {
        "default_threads": default_threads,
        "rnncore_build": rnncore_build(rc),
        "timing": timing,
        "records": records,
    }


def finish_loaded(args, results, started):
    """--loaded: one worker process with rnncore's own default thread count (no thread
    variables set), then loaded.json and loaded.md."""
    data = run_worker_process(args, "cpu", ["--worker-loaded"])
    if data.get("failed"):
        return 1
    results.update(data)
    results["competitor"] = "one Python busy loop (while True: pass) for the whole run"
    results["seconds"] = round(time.perf_counter() - started, 1)
    print("\n" + report.loaded_markdown(results))
    write_outputs(args, results, "loaded")
    return 0

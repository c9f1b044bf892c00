"""Benchmark rnncore against PyTorch, ONNX Runtime, MLX (if installed) and a numpy loop.

    python bench/run.py [--quick] [--threads 1 2] [--configs NAME ...] [--out DIR]
                        [--modes inference training] [--loaded]

Each thread count n runs in its own subprocess, with RNNCORE_NUM_THREADS,
OPENBLAS_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS set to n (rnncore's thread pool,
rnncore's and numpy's OpenBLAS, PyTorch's OpenMP pool), torch.set_num_threads(n) and ONNX
Runtime's intra-op threads = n. The CPU time each measurement used per wall second is
recorded, which shows whether the limits took effect.
Per configuration, every implementation is first checked against PyTorch in float64 on
the same numbers (outputs, and for training the gradients of input, weights and biases),
then timed: warm-up, then repetitions until both a minimum count and a minimum time are
reached; the median and the minimum are kept.

Writes results.json, results.md (ratios rnncore / fastest peer) and chart.png into
bench/results/ (or --out). This is a measurement, not a test: nothing here asserts speed.

--loaded measures rnncore on a busy machine instead: one competing CPU-bound process (a
Python busy loop) runs throughout, and every configuration and mode is timed at rnncore's
default thread count and at 1 thread in the same process, in alternating rounds, so both
see the same load; the ratio default / 1 thread shows what the threads cost or gain when
a core is taken (target: at most 1.3). It also checks that both give the same bits.
Writes loaded.json and loaded.md.
"""

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
from configs import BY_NAME, CONFIGS, QUICK
from impls import NotSupported, available_impls
from numpy_loop import NumpyLayer
from problem import Problem, compare

HERE = Path(__file__).resolve().parent
MODES = ("inference", "training")

# Agreement tolerance: relative error (norm of the difference / norm of the reference).
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}

# Timing settings: warm-up calls, then at least `min_reps` calls and `min_time` seconds.
TIMING = {
    "full": {"warmup": 2, "min_reps": 5, "min_time": 0.5},
    "quick": {"warmup": 1, "min_reps": 3, "min_time": 0.05},
}
# Other processes keeping more than this many cores busy disturb a measurement (on top of
# the cores a measurement leaves free: a 1-thread run on 2 cores tolerates one more).
DISTURBED = 0.3
RETRIES = 3
QUIET_WAIT = 60.0  # seconds to wait for the other processes to calm down before a retry
# rnncore's own thread pool reads RNNCORE_NUM_THREADS; its OpenBLAS, numpy's OpenBLAS and
# PyTorch's OpenMP pool read the others.
THREAD_ENV = ("RNNCORE_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
RECORDED_ENV = re.compile(r"^(OPENBLAS|GOTO|OMP|MKL|KMP|RNNCORE|ORT|MLX|TORCH)_")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer reps and configurations")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=sorted(BY_NAME),
        metavar="NAME",
        help="configurations to run (default: all; with --quick, a subset): " + ", ".join(BY_NAME),
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--loaded",
        action="store_true",
        help="time rnncore at its default thread count and at 1 thread beside one competing "
        "CPU-bound process (writes loaded.json, loaded.md)",
    )
    parser.add_argument(
        "--rounds", type=int, help="--loaded: alternating rounds (default 7; 3 with --quick)"
    )
    parser.add_argument("--worker-loaded", type=Path, help=argparse.SUPPRESS)
    # Internal: run one thread count and write its records to a JSON file.
    parser.add_argument("--worker-threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.configs is None:
        args.configs = QUICK if args.quick else [c.name for c in CONFIGS]
    return args


# ---------------------------------------------------------------------------- timing


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


def allowed_other_cpu(threads):
    """How many cores other processes may keep busy without disturbing `threads` threads."""
    return DISTURBED + max(0.0, usable_cpus() - threads - 0.5)


def wait_for_quiet(limit, allowed):
    """Wait (up to `limit` seconds) until the machine's other processes keep fewer than
    `allowed` cores busy over half a second; returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        busy0 = busy_cpu_seconds()
        if busy0 is None:
            break
        time.sleep(0.5)
        if (busy_cpu_seconds() - busy0) / 0.5 < allowed:
            break
    return time.perf_counter() - started


# A call slower than this is timed with SLOW_REPS calls after one warm-up (MLX's per-step
# Python loop takes minutes per call on the large layers); the report shows the reps.
SLOW_CALL_S, SLOW_REPS = 5.0, 2


def measure_once(fn, warmup, min_reps, min_time):
    for i in range(warmup):
        t0 = time.perf_counter()
        fn()
        if i == 0 and time.perf_counter() - t0 > SLOW_CALL_S:
            min_reps = min(min_reps, SLOW_REPS)
            break
    gc.collect()
    times = []
    busy0, cpu0, wall0 = busy_cpu_seconds(), time.process_time(), time.perf_counter()
    while len(times) < min_reps or sum(times) < min_time:
        t0 = time.perf_counter()
        fn()
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


def measure(fn, warmup, min_reps, min_time, allowed=DISTURBED):
    """Median and minimum wall time of fn() (seconds) after `warmup` calls, over at least
    `min_reps` calls and `min_time` seconds. Also the CPU time this process used per wall
    second ("cpu_use": about 1 for one busy core, 2 for two) and the cores that other
    processes kept busy meanwhile ("other_cpu"); a measurement disturbed by them (more
    than `allowed` cores) is repeated, up to RETRIES times after waiting for them to calm
    down, keeping the least disturbed one."""
    best = None
    for attempt in range(1 + RETRIES):
        if attempt:
            wait_for_quiet(QUIET_WAIT, allowed)
        result = measure_once(fn, warmup if attempt == 0 else 1, min_reps, min_time)
        if best is None or (result["other_cpu"] or 0) < (best["other_cpu"] or 0):
            best = result
        if not disturbed(best, allowed):
            break
    best["attempts"] = attempt + 1
    best["disturbed"] = disturbed(best, allowed)
    return best


def disturbed(m, allowed):
    """Whether other processes kept more than `allowed` cores busy, allowing for the
    10 ms resolution of /proc/stat over a short measurement."""
    if m["other_cpu"] is None:
        return False
    wall = m["median_s"] * m["reps"]
    return m["other_cpu"] > allowed + 2 / os.sysconf("SC_CLK_TCK") / max(wall, 1e-3)


def gemm_peak(torch, timing, allowed):
    """GFLOP/s of a 2048² matrix product in float32 and float64, by numpy and by torch."""
    n = 2048
    rng = np.random.default_rng(0)
    out = {}
    for dtype, prefix in ((np.float32, "sgemm"), (np.float64, "dgemm")):
        a = rng.standard_normal((n, n)).astype(dtype)
        b = rng.standard_normal((n, n)).astype(dtype)
        candidates = {"numpy": lambda a=a, b=b: a @ b}
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            candidates["torch"] = lambda ta=ta, tb=tb: torch.mm(ta, tb)
        for name, fn in candidates.items():
            t = measure(fn, 1, timing["min_reps"], timing["min_time"], allowed)
            out[f"{prefix}_{name}_gflops"] = round(2 * n**3 / t["median_s"] / 1e9, 1)
        out[f"{prefix}_peak_gflops"] = max(
            v for k, v in out.items() if k.startswith(prefix + "_") and k.endswith("_gflops")
        )
    return out


# ---------------------------------------------------------------------------- worker


def thread_settings(threads, impls):
    """What each library reports for its thread count, to verify the limits took effect."""
    info = {"requested": threads, "env": {k: os.environ.get(k) for k in THREAD_ENV}}
    rnncore_impl = impls["rnncore"]
    info["rnncore_build_info"] = rnncore_impl.rc.build_info()
    found = re.search(r"(\d+) threads", info["rnncore_build_info"].get("blas", ""))
    info["rnncore_blas_threads"] = int(found.group(1)) if found else None
    for name in ("num_threads", "get_num_threads"):
        value = getattr(rnncore_impl.rc, name, None)
        if callable(value):
            info[f"rnncore_{name}"] = value()
    if "torch" in impls:
        torch = impls["torch"].torch
        info["torch_threads"] = torch.get_num_threads()
        info["torch_mkldnn"] = torch.backends.mkldnn.is_available()
    if "onnxruntime" in impls:
        info["onnxruntime_intra_op_threads"] = threads
    try:
        from threadpoolctl import threadpool_info

        info["threadpools"] = [
            {k: p.get(k) for k in ("internal_api", "prefix", "version", "num_threads", "filepath")}
            for p in threadpool_info()
        ]
    except ImportError:
        info["threadpools"] = "threadpoolctl not installed"
    return info


def rnncore_build(rc):
    """Which compiled rnncore this worker loaded (the package may be reinstalled while a
    benchmark runs): path, size, modification time and a hash of the extension module."""
    path = Path(rc._core.__file__)
    data = path.read_bytes()
    return {
        "path": str(path),
        "size": len(data),
        "mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(path.stat().st_mtime)),
        "sha256": hashlib.sha256(data).hexdigest()[:16],
    }


def reference(problem, impls):
    """Float64 outputs and gradients: PyTorch autograd, or the numpy loop without torch."""
    if "torch" in impls:
        return "torch float64 autograd", impls["torch"].reference(problem)
    weights = {k: v.astype(np.float64) for k, v in problem.rnncore_weights().items()}
    layer = NumpyLayer(problem.config, weights)
    x, dy = problem.x.astype(np.float64), problem.dy.astype(np.float64)
    return "numpy float64 loop", layer.forward_backward(x, dy)


def run_one(impl, problem, mode, threads, expected, timing):
    """Check then time one implementation; returns its record."""
    config = problem.config
    record = {"config": config.name, "mode": mode, "threads": threads, "impl": impl.name}
    try:
        run, result = impl.prepare(problem, mode, threads)
    except NotSupported as e:
        return {**record, "status": "n/a", "note": str(e)}
    try:
        errors = compare(result(run()), expected)
        max_err = max(errors.values())
        tol = TOLERANCE[config.dtype]
        record["check"] = {
            "max_rel_err": max_err,
            "tolerance": tol,
            "passed": bool(max_err <= tol),
            "fields": errors,
        }
        record.update(measure(run, **timing, allowed=allowed_other_cpu(threads)))
    except Exception as e:  # noqa: BLE001 (a peer failing is recorded, not fatal)
        return {**record, "status": "error", "note": f"{type(e).__name__}: {e}"[:300]}
    record["status"] = "ok" if record["check"]["passed"] else "FAILED-CHECK"
    record["gflops"] = round(config.flops(mode) / record["median_s"] / 1e9, 2)
    return record


def worker(args):
    threads = args.worker_threads
    timing = TIMING["quick" if args.quick else "full"]
    impl_list, missing = available_impls()
    impls = {impl.name: impl for impl in impl_list}
    if "torch" in impls:
        impls["torch"].set_threads(threads)
    torch = impls["torch"].torch if "torch" in impls else None
    allowed = allowed_other_cpu(threads)
    waited = wait_for_quiet(QUIET_WAIT, allowed)
    if waited > 1:
        print(f"[{threads} thread(s)] waited {waited:.0f} s for other processes", flush=True)
    out = {
        "threads": threads,
        "thread_settings": thread_settings(threads, impls),
        "missing_peers": missing,
        "rnncore_build": rnncore_build(impls["rnncore"].rc),
        "allowed_other_cpu": allowed,
        "gemm": gemm_peak(torch, timing, allowed),
        "records": [],
    }
    print(f"[{threads} thread(s)] GEMM 2048²: {out['gemm']}", flush=True)
    for name in args.configs:
        config = BY_NAME[name]
        problem = Problem(config)
        ref_name, ref = reference(problem, impls)
        out["reference"] = ref_name
        for mode in args.modes:
            expected = ref if mode == "training" else {"y": ref["y"]}
            for impl in impl_list:
                record = run_one(impl, problem, mode, threads, expected, timing)
                out["records"].append(record)
                print(progress_line(record), flush=True)
                gc.collect()
    args.worker_out.write_text(json.dumps(out, indent=1))


def progress_line(r):
    head = f"  {r['config']:24} {r['mode']:9} {r['threads']}t {r['impl']:12}"
    if r["status"] in ("n/a", "error"):
        return f"{head} {r['status']}: {r['note']}"
    return (
        f"{head} median {1e3 * r['median_s']:10.3f} ms  min {1e3 * r['min_s']:10.3f} ms"
        f"  reps {r['reps']:4}  cpu {r['cpu_use']:.2f}  others {r['other_cpu']}"
        f"  err {r['check']['max_rel_err']:.1e} {r['status']}"
        + ("  DISTURBED" if r["disturbed"] else "")
    )


# ---------------------------------------------------------------------------- loaded


def busy_loop():
    """One competing CPU-bound process (a Python busy loop); the caller kills it."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def loaded_worker(args):
    """Times rnncore at the default thread count and at 1 thread, alternating, beside a busy
    loop; writes the records to args.worker_loaded."""
    timing = TIMING["quick" if args.quick else "full"]
    rounds = args.rounds or (3 if args.quick else 7)
    from impls import RnncoreImpl

    impl = RnncoreImpl()
    rc = impl.rc
    rc.set_num_threads(0)
    default_threads = rc.num_threads()
    settings = {"default": 0, "single": 1}
    records = []
    competitor = busy_loop()
    try:
        time.sleep(0.2)
        for name in args.configs:
            problem = Problem(BY_NAME[name])
            for mode in args.modes:
                run, result = impl.prepare(problem, mode, default_threads)
                outputs = {}
                for key, n in settings.items():
                    rc.set_num_threads(n)
                    outputs[key] = result(run())
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
                        m = measure_once(run, 1, timing["min_reps"], timing["min_time"])
                        rounds_s[key].append(m["median_s"])
                        if m["other_cpu"] is not None:
                            other.append(m["other_cpu"])
                med = {key: float(np.median(v)) for key, v in rounds_s.items()}
                record = {
                    "config": name,
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
                print(
                    f"  {name:24} {mode:9} default ({default_threads}t) "
                    f"{1e3 * med['default']:10.3f} ms  1t {1e3 * med['single']:10.3f} ms  "
                    f"ratio {record['ratio']:.2f}  others {record['other_cpu']}  "
                    f"{'same bits' if same else 'BITS DIFFER'}",
                    flush=True,
                )
                gc.collect()
    finally:
        competitor.kill()
        competitor.wait()
        rc.set_num_threads(0)
    out = {
        "default_threads": default_threads,
        "rnncore_build": rnncore_build(rc),
        "rnncore_build_info": rc.build_info(),
        "timing": timing,
        "records": records,
    }
    args.worker_loaded.write_text(json.dumps(out, indent=1))


def run_loaded(args, started):
    """The parent of --loaded: one worker with rnncore's own default thread count (no
    thread variables set), then loaded.json and loaded.md."""
    import report

    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    print(f"configs: {' '.join(args.configs)}\nmodes: {' '.join(args.modes)}; loaded run")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "loaded.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-loaded", str(path)]
        cmd += ["--configs", *args.configs, "--modes", *args.modes]
        if args.quick:
            cmd.append("--quick")
        if args.rounds:
            cmd += ["--rounds", str(args.rounds)]
        proc = subprocess.run(cmd, env=env, check=False)
        if proc.returncode != 0 or not path.exists():
            print(f"loaded worker failed with exit code {proc.returncode}")
            return 1
        worker_out = json.loads(path.read_text())
    results = {
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "run": "quick" if args.quick else "full",
        "machine": machine_info(),
        "versions": versions(),
        "repository": repository(),
        "competitor": "one Python busy loop (while True: pass) for the whole run",
        **worker_out,
    }
    results["seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loaded.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = report.loaded_markdown(results)
    (args.out / "loaded.md").write_text(markdown)
    print("\n" + markdown)
    print(f"wrote {args.out / 'loaded.json'}, loaded.md in {results['seconds']:.0f} s")
    return 0


# ---------------------------------------------------------------------------- parent


def machine_info():
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu_model": model or platform.processor(),
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }
    if hasattr(os, "sched_getaffinity"):
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    try:
        flags = re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
        wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
        info["cpu_flags"] = [f for f in wanted if f in flags.group(1).split()]
    except (OSError, AttributeError):
        pass
    return info


def versions():
    out = {}
    for dist in (
        "rnncore",
        "numpy",
        "torch",
        "onnxruntime",
        "onnx",
        "mlx",
        "scipy-openblas32",
        "threadpoolctl",
        "matplotlib",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def repository():
    """The commit of the checkout this script is in, and whether it has local changes."""

    def git(*cmd):
        return subprocess.run(
            ["git", *cmd], cwd=HERE, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.CalledProcessError):
        return None


def run_worker(args, threads, path):
    env = dict(os.environ)
    env.update({k: str(threads) for k in THREAD_ENV})
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker-threads",
        str(threads),
        "--worker-out",
        str(path),
        "--configs",
        *args.configs,
        "--modes",
        *args.modes,
    ]
    if args.quick:
        cmd.append("--quick")
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0 or not path.exists():
        print(f"worker for {threads} thread(s) failed with exit code {proc.returncode}")
        return {"threads": threads, "failed": proc.returncode, "records": [], "seconds": elapsed}
    data = json.loads(path.read_text())
    data["seconds"] = round(elapsed, 1)
    return data


def main(argv=None):
    args = parse_args(argv)
    if args.worker_threads is not None:
        return worker(args)
    if args.worker_loaded is not None:
        return loaded_worker(args)

    import report  # matplotlib is needed only here

    started = time.perf_counter()
    if args.loaded:
        return run_loaded(args, started)
    cpus = usable_cpus()
    if max(args.threads) > cpus:
        print(f"warning: {max(args.threads)} threads requested but only {cpus} CPUs usable")
    print(
        f"configs: {' '.join(args.configs)}\nmodes: {' '.join(args.modes)}; "
        f"threads: {args.threads}; {'quick' if args.quick else 'full'} run",
        flush=True,
    )
    workers = []
    with tempfile.TemporaryDirectory() as tmp:
        for threads in args.threads:
            print(f"--- {threads} thread(s)", flush=True)
            workers.append(run_worker(args, threads, Path(tmp) / f"worker{threads}.json"))

    results = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "run": "quick" if args.quick else "full",
        "machine": machine_info(),
        "versions": versions(),
        "repository": repository(),
        "env": {k: v for k, v in sorted(os.environ.items()) if RECORDED_ENV.match(k)},
        "settings": {
            "threads": args.threads,
            "modes": args.modes,
            "timing": TIMING["quick" if args.quick else "full"],
            "tolerance": TOLERANCE,
            "thread_env_set_per_worker": list(THREAD_ENV),
        },
        "configs": [
            {
                "name": n,
                **{k: getattr(BY_NAME[n], k) for k in ("kind", "T", "N", "I", "H", "D", "dtype")},
                "flops": {m: BY_NAME[n].flops(m) for m in MODES},
            }
            for n in args.configs
        ],
        "workers": [{k: v for k, v in w.items() if k != "records"} for w in workers],
        "results": [r for w in workers for r in w["records"]],
    }
    results["seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = report.markdown(results)
    (args.out / "results.md").write_text(markdown)
    report.chart(results, args.out / "chart.png")
    print("\n" + markdown)
    print(f"wrote {args.out / 'results.json'}, results.md, chart.png in {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

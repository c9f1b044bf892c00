"""The cost model of the Metal backend: for an op and a shape, what each dispatch of its plans
reads and writes in device memory and how many FLOPs it does, counted by the host emulator
(every load and store of an instrumented copy of the kernels; rnncore.set_metal_counting),
turned into an expected time on named Apple GPUs.

A dispatch takes the largest of its bandwidth bound (bytes / memory bandwidth), its compute
bound (FLOPs / FP32 peak) and its latency bound (the threadgroup barriers one threadgroup
passes, each a phase whose loads wait for the last phase's stores), plus a fixed cost per
dispatch; a dispatch of fewer threadgroups than the GPU has cores gets only that many cores'
bandwidth and FLOPs (a persistent kernel: one). A plan's command buffers (64 dispatches each,
rnncore's executor) add a fixed cost each. Bytes are the kernels' loads and stores of device
memory, so data a kernel reads twice counts twice (what a cache does not absorb); FLOPs count
the products' multiply-adds (2 each), not the elementwise gate math.

GPU figures (FP32 peak = GPU cores x 128 FP32 lanes x 2 x clock):

- M1 (8-core GPU, 1.278 GHz): 2.6 TFLOPS, 68.25 GB/s (LPDDR4X-4266, 128-bit; Apple,
  "Apple unleashes M1", 2020-11-10).
- M2 (10-core GPU, 1.398 GHz): 3.6 TFLOPS, 100 GB/s (Apple, "Apple unveils M2",
  2022-06-06).
- M3 Max (40-core GPU, ~1.38 GHz): ~14.1 TFLOPS, 400 GB/s (Apple, "Apple unveils M3,
  M3 Pro, and M3 Max", 2023-10-30: 400 GB/s for the 40-core GPU model).
- M4 (10-core GPU, ~1.47 GHz): ~3.8 TFLOPS, 120 GB/s (Apple, "Apple introduces M4 chip",
  2024-05-07: 120 GB/s).
- Per core: 32 bytes a clock of memory traffic (a GPU core's load/store path is as wide as
  a CPU core's: P. Turner, "metal-benchmarks", github.com/philipturner/metal-benchmarks) and
  256 FLOPs a clock.
- Per barrier-separated phase 0.5 us: about a round trip to the GPU's L2 and back through a
  threadgroup barrier; an assumption like the next two.
- Per dispatch 5 us and per command buffer 50 us: back-to-back compute dispatches in one
  encoder take a few microseconds each on these GPUs, and a command buffer's trip through
  the driver tens to thousands of microseconds (Apple, Metal Performance Shaders "Tuning
  Hints": up to 2.5 ms to get an empty command buffer through waitUntilCompleted). These
  three are the model's least certain figures; the bench prints the model beside measured times
  so that a Mac run calibrates them.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from .._ops import KINDS


@dataclass(frozen=True)
class Gpu:
    name: str
    bandwidth: float  # bytes / s
    flops: float  # FP32 FLOP / s
    cores: int = 10
    clock: float = 1.4e9  # Hz
    dispatch_s: float = 5e-6
    command_buffer_s: float = 50e-6
    phase_s: float = 0.5e-6  # a barrier-separated phase of one threadgroup

    def usable(self, threadgroups):
        """Bandwidth and FLOP/s a dispatch of `threadgroups` threadgroups can use."""
        k = min(threadgroups, self.cores)
        return min(self.bandwidth, k * 32 * self.clock), min(self.flops, k * 256 * self.clock)


GPUS = {
    g.name: g
    for g in (
        Gpu("M1", 68.25e9, 2.6e12, cores=8, clock=1.278e9),
        Gpu("M2", 100e9, 3.6e12, cores=10, clock=1.398e9),
        Gpu("M3 Max", 400e9, 14.1e12, cores=40, clock=1.38e9),
        Gpu("M4", 120e9, 3.8e12, cores=10, clock=1.47e9),
    )
}
DISPATCHES_PER_COMMAND_BUFFER = 64  # the executor's (apple_executor.cpp)


def count(kind, T, N, H, I=None, training=False, bidirectional=False, dtype="float32"):  # noqa: N803, E741
    """The counted dispatches of one forward call (and, with training, its gradient call)
    of `kind` on device 'metal-emulated': a list of dicts (rnncore.take_metal_counts)."""
    import rnncore
    from rnncore import _core

    I = I or H  # noqa: E741
    G, D = KINDS[kind].gates, 2 if bidirectional else 1  # noqa: N806
    rng = np.random.default_rng(0)
    dt = np.dtype(dtype)
    x = (rng.standard_normal((T, N, I)) * 0.5).astype(dt)
    W = (rng.standard_normal((D * G * H, I)) / math.sqrt(I)).astype(dt)  # noqa: N806
    R = rng.standard_normal((G * H, H)) / math.sqrt(H)  # noqa: N806
    R = (np.stack([R, R]) if bidirectional else R).astype(dt)  # noqa: N806
    desc_cls = getattr(rnncore, KINDS[kind].descriptor)
    fields = {"reset_after": True} if kind == "gru" else {}
    desc = desc_cls(bidirectional=bidirectional, training=training, **fields)
    forward = getattr(rnncore, KINDS[kind].forward)
    _core.set_metal_counting(True)
    try:
        out = forward(x, R, W, descriptor=desc, device="metal-emulated")
        if training:
            extra = {"gru": (out.state,), "lstm": (getattr(out, "cell", None),), "rnn": ()}[kind]
            getattr(rnncore, KINDS[kind].gradients)(
                x, R, out.state, out.z_state, *extra, input_weight=W, descriptor=desc,
                device="metal-emulated",
            )  # fmt: skip
        return _core.take_metal_counts()
    finally:
        _core.set_metal_counting(False)


def expected(records, gpu):
    """Expected seconds of the counted dispatches on `gpu` (a Gpu), and the bound of each."""
    total, bounds = 0.0, []
    per_plan = {}
    for r in records:
        bandwidth, flops = gpu.usable(r.get("threadgroups", gpu.cores))
        times = {
            "memory": (r["bytes_read"] + r["bytes_written"]) / bandwidth,
            "compute": r["flops"] / flops,
            "latency": r.get("barriers", 0) * gpu.phase_s,
        }
        bound = max(times, key=times.get)
        bounds.append(bound)
        total += times[bound] + gpu.dispatch_s
        per_plan[r["plan"]] = per_plan.get(r["plan"], 0) + 1
    buffers = sum(math.ceil(n / DISPATCHES_PER_COMMAND_BUFFER) for n in per_plan.values())
    return total + buffers * gpu.command_buffer_s, bounds


def summary(records):
    """Per kernel: dispatches, bytes and FLOPs per dispatch (the last measured)."""
    rows = {}
    for r in records:
        row = rows.setdefault(r["kernel"], {"dispatches": 0, "bytes": 0, "flops": 0})
        row["dispatches"] += 1
        row["bytes"] = r["bytes_read"] + r["bytes_written"]
        row["flops"] = r["flops"]
    return rows


def this_gpu():
    """The GPUS entry of this Mac's GPU (from the CPU brand, "Apple M2 Pro" -> M2), else
    None."""
    import platform
    import subprocess

    if platform.system() != "Darwin":
        return None
    try:
        brand = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
        ).stdout
    except OSError:
        return None
    for name in sorted(GPUS, key=len, reverse=True):
        if name in brand:
            return name
    return None


def model_record(config, mode, device):
    """What the bench records beside a Metal time: the model's expectation on this Mac's GPU
    (on 'metal-emulated', or an unknown GPU: the M2), or why there is none."""
    gpu = (this_gpu() if device == "metal" else None) or "M2"
    try:
        recs = count(config.kind, config.T, config.N, config.H, I=config.I,
                     training=mode == "training", bidirectional=config.bidirectional,
                     dtype=config.dtype)  # fmt: skip
    except Exception as e:  # noqa: BLE001 (a build without counting: say so)
        return {"model_note": str(e)}
    t, bounds = expected(recs, GPUS[gpu])
    return {
        "model_gpu": gpu,
        "model_s": t,
        "model_bandwidth_bound": bounds.count("memory"),
        "model_dispatches": len(recs),
    }


CONFIGS = [  # the shapes: (kind, T, N, H)
    ("gru", 100, 32, 256),
    ("lstm", 100, 32, 256),
    ("gru", 100, 1, 256),
    ("lstm", 100, 1, 256),
    ("gru", 1000, 1, 64),
    ("gru", 50, 128, 1024),
]


def table(configs, modes=("inference", "training"), gpus=("M2", "M3 Max")):
    lines = [
        "| layer | mode | dispatches | MB moved | GFLOP | "
        + " | ".join(f"{g} ms" for g in gpus)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(gpus),
    ]
    for kind, T, N, H in configs:  # noqa: N806
        for mode in modes:
            recs = count(kind, T, N, H, training=mode == "training")
            moved = sum(r["bytes_read"] + r["bytes_written"] for r in recs) / 1e6
            gflop = sum(r["flops"] for r in recs) / 1e9
            times = [expected(recs, GPUS[g])[0] * 1e3 for g in gpus]
            lines.append(
                f"| {kind.upper()} T={T} N={N} H={H} | {mode} | {len(recs)} | {moved:.1f} | "
                f"{gflop:.2f} | " + " | ".join(f"{t:.2f}" for t in times) + " |"
            )
    return "\n".join(lines)


def add_parser(sub):
    p = sub.add_parser(
        "cost",
        help="the Metal cost model: counted bytes and FLOPs per dispatch, expected times",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--kind", choices=list(KINDS), help="one layer (default: the issue's set)")
    p.add_argument("--T", type=int, default=100)
    p.add_argument("--N", type=int, default=32)
    p.add_argument("--H", type=int, default=256)
    p.add_argument("--training", action="store_true")
    p.add_argument("--bidirectional", action="store_true")
    p.set_defaults(func=run)
    return p


def run(args):
    if args.kind is None:
        print(table(CONFIGS))
        return 0
    recs = count(args.kind, args.T, args.N, args.H, training=args.training,
                 bidirectional=args.bidirectional)  # fmt: skip
    print(f"{args.kind.upper()} T={args.T} N={args.N} H={args.H}"
          f"{' training' if args.training else ''}: {len(recs)} dispatches")  # fmt: skip
    print(f"  {'kernel':28} {'dispatches':>10} {'KB/dispatch':>12} {'MFLOP/dispatch':>15}")
    for kernel, row in summary(recs).items():
        print(f"  {kernel:28} {row['dispatches']:10d} {row['bytes'] / 1e3:12.1f} "
              f"{row['flops'] / 1e6:15.3f}")  # fmt: skip
    for g in GPUS.values():
        t, bounds = expected(recs, g)
        kinds = ", ".join(f"{bounds.count(b)} {b}" for b in ("memory", "compute", "latency"))
        print(f"  expected on {g.name:7}: {t * 1e3:8.3f} ms "
              f"(of {len(bounds)} dispatches bound by: {kinds})")  # fmt: skip
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m rnncore cost")
    sub = parser.add_subparsers()
    add_parser(sub)
    args = parser.parse_args(["cost", *(argv or [])])
    return args.func(args)

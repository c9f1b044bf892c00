"""The targets section (``--targets``): the CPU backend's speed targets (README, Speed), each
timed as rnncore against the peers it is held to, in alternating short windows.

The full run times every implementation of a layer in 3 rounds and takes the ratio of their
medians; on a shared machine whose speed moves for seconds at a time (the same call 1.5x
slower for a second or two, every library alike) that ratio is one sample of the moments
each side happened to get. Here a round times rnncore and each peer once, a short window
each, rnncore first in even rounds and last in odd ones, and a target's ratio is the median
over the rounds of rnncore's time / the fastest peer's time in the same round, with its
quartiles: both sides of each ratio share the machine's state of that second.

Every implementation is first checked against the float64 reference (PyTorch's autograd), as
in the full run. "The fastest peer" of the float32 targets is the faster of PyTorch and ONNX
Runtime (MLX's per-step loop and the numpy loop take several times as long at these layers);
ONNX Runtime runs the float16 and bfloat16 layers in float32 on the same values."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .peers import BY_NAME, Problem, RnncoreImpl, make_peers
from .report import FAR_ROUND_TRIP_NS

NAMES = {"onnxruntime": "ONNX Runtime", "torch": "PyTorch"}

# (configuration, mode, peers, limit): issue 16's targets, T=100 I=H=256.
TARGETS = [
    ("gru-T100-N32-H256", "inference", ("onnxruntime", "torch"), 0.9),
    ("lstm-T100-N32-H256", "inference", ("onnxruntime", "torch"), 1.0),
    ("lstm-T100-N32-H256", "training", ("torch",), 1.0),
    ("gru-T100-N1-H256-f16", "inference", ("onnxruntime",), 0.5),
    ("lstm-T100-N1-H256-f16", "inference", ("onnxruntime",), 0.5),
    ("gru-T100-N1-H256-bf16", "inference", ("onnxruntime",), 0.5),
    ("lstm-T100-N1-H256-bf16", "inference", ("onnxruntime",), 0.5),
] + [
    (f"{kind}-T100-N{n}-H256-bf16", mode, ("torch",), 0.8)
    for kind in ("gru", "lstm")
    for n in (1, 32)
    for mode in ("inference", "training")
]
# --quick: one of each kind of target.
QUICK = [TARGETS[1], TARGETS[3], TARGETS[-1]]

# A window: at least `min_reps` calls and `min_time` seconds after one warm-up call, the
# previous library's worker threads given `settle` seconds to stop spinning first.
WINDOW = {"warmup": 1, "min_reps": 3, "min_time": 0.25, "retries": 0, "quiet_wait": 0.0,
          "settle": 0.1}  # fmt: skip
QUICK_WINDOW = {**WINDOW, "min_reps": 2, "min_time": 0.02, "settle": 0.02}


def label(config, mode, peers):
    c = BY_NAME[config]
    dtype = {"float16": " float16", "bfloat16": " bfloat16"}.get(c.dtype, "")
    kind = c.kind.upper()
    if peers == ("torch",) and dtype:
        return f"{kind} N={c.N}{dtype} {mode} vs PyTorch{dtype}"
    if peers == ("onnxruntime",):
        return f"{kind} N={c.N}{dtype} {mode} vs ONNX Runtime float32"
    return f"{kind} N={c.N} {mode} vs fastest peer"


def paired(ours, theirs):
    """Per round, rnncore's time / the fastest peer's (`theirs`: one list per peer)."""
    fastest = np.min(np.array(theirs, dtype=float), axis=0)
    return np.array(ours, dtype=float) / fastest


def reference_peer_missing():
    """Whether PyTorch, whose float64 autograd is the reference, cannot be imported."""
    import importlib.util

    return importlib.util.find_spec("torch") is None


def run_targets(
    quick, measure, run_one, timing, allowed, threads, rounds=None, done=None, round_trip=None
):
    """Rows (a dict per target) of the targets section; `measure` and `run_one` are the
    bench's (the check, then the timed windows); done(row) is called as each row ends.
    round_trip(): the CPUs' round trip in ns (or None), taken before each round's windows:
    a host that moves the CPUs apart for seconds slows every hand-off between threads."""
    rounds = rounds or (2 if quick else 15)
    window = {**timing, **(QUICK_WINDOW if quick else WINDOW), "rounds": 1}
    peers, missing = make_peers("cpu")
    for p in peers:
        if hasattr(p, "set_threads"):
            p.set_threads(threads)
    by_name = {p.name: p for p in peers}
    torch_peer = by_name["torch"]  # (reference_peer_missing() is checked first)
    ours = RnncoreImpl("cpu")
    rows, references = [], {}
    for config, mode, names, limit in QUICK if quick else TARGETS:
        row = {"target": label(config, mode, names), "config": config, "mode": mode,
               "limit": limit, "peers": list(names), "rounds": rounds}  # fmt: skip
        absent = [NAMES[n] for n in names if n not in by_name]
        if absent:
            rows.append({**row, "status": "n/a", "note": ", ".join(absent) + " not installed"})
            done and done(rows[-1])
            continue
        problem = Problem(BY_NAME[config])
        if config not in references:
            references[config] = torch_peer.reference(problem)
        ref = references[config]
        expected = ref if mode == "training" else {"y": ref["y"]}
        impls = [ours] + [by_name[n] for n in names]
        records = [run_one(i, problem, mode, threads, expected, window, "cpu") for i in impls]
        failed = [r for r in records if r.get("status") != "ok"]
        if failed:
            # n/a: what an implementation does not run (no ratio); otherwise a failed check
            # or an error, which fails the run.
            status = "n/a" if all(r["status"] == "n/a" for r in failed) else "FAILED"
            notes = "; ".join(f"{r['impl']}: {r['status']} {r.get('note', '')}" for r in failed)
            rows.append({**row, "status": status, "note": notes})
            done and done(rows[-1])
            continue
        times = {r["impl"]: [] for r in records}
        trips = []
        for i in range(rounds):
            if round_trip is not None:
                time.sleep(window["settle"])  # the last window's worker threads spin down
                trips.append(round_trip())
            order = records if i % 2 == 0 else records[::-1]
            for r in order:
                p = r["_prepared"]
                times[r["impl"]].append(measure(p.run, window, allowed, p.sync)["median_s"])
        ratios = paired(times["rnncore"], [times[n] for n in names])
        q1, median, q3 = np.percentile(ratios, [25, 50, 75])
        row.update(
            status="ok",
            ratio=float(median),
            quartiles=[float(q1), float(q3)],
            met=bool(median <= limit),
            median_s={k: float(np.median(v)) for k, v in times.items()},
            round_s=times,
        )
        if trips and all(t is not None for t in trips):
            row["round_trip_ns"] = trips
        rows.append(row)
        done and done(row)
    return rows, missing


def heading(threads):
    return (
        f"speed targets: rnncore / the fastest of the named peers in each round, {threads} "
        "thread(s); the median over the rounds (quartiles)\n"
    )


def line(r):
    head = f"  {r['target']:52} {r['limit']:4.1f}  "
    if r["status"] != "ok":
        return head + f"{r['status']}: {r['note']}"
    q1, q3 = r["quartiles"]
    mark = "met" if r["met"] else "not met"
    ms = ", ".join(f"{NAMES.get(k, k)} {v * 1e3:.3g}" for k, v in r["median_s"].items())
    text = (
        head + f"{r['ratio']:.2f} ({q1:.2f}-{q3:.2f}) {mark:7}  {r['rounds']} rounds; "
        f"median ms: {ms}"
    )
    trips = r.get("round_trip_ns")
    if trips:
        far = sum(t > FAR_ROUND_TRIP_NS for t in trips)
        text += f"; CPU round trip {np.median(trips) / 1e3:.2f} us"
        if far:
            text += f", far in {far} of {len(trips)} rounds"
    return text


def table(rows, threads):
    return "\n".join([heading(threads), *map(line, rows)])


def write(out: Path, rows, text, info):
    """targets.json (the rows, each round's times, and `info`) and targets.md into out."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "targets.json").write_text(json.dumps({**info, "targets": rows}, indent=1))
    (out / "targets.md").write_text("```\n" + text + "\n```\n")

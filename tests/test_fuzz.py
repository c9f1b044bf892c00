"""Property-based fuzz test of the Python boundary (issue 10).

tests/fuzz_boundary.py draws random calls of the six operations (random valid and invalid
shapes with zero and awkward sizes, dtypes, layouts, torch tensors, DLPack capsules,
aliased arguments, descriptors, devices, NaN and Inf) and judges each outcome: a success
must agree with rnncore.reference in float64, an error must be clear (its message starts
with the operation in brackets), and nothing may crash, hang or accept a call the
contract refuses. The cases run in worker processes (one per core, forking a child that a
crash kills instead of pytest), so a crash fails this test with the offending call.

Environment: RNNCORE_FUZZ_CASES (default 6000), RNNCORE_FUZZ_SEED (first seed, default
0), RNNCORE_FUZZ_JOBS (worker processes, default: the usable cores, at most 4),
RNNCORE_FUZZ_REPORT (a file to write every case's outcome to, as JSON lines). Run
``pytest tests/test_fuzz.py -s`` to see the counts; reproduce one case with
``python tests/fuzz_boundary.py --run SEED``.

Undefined behaviour that a release build survives (misaligned loads, say) shows up as
crashes when rnncore is built with ``-fsanitize=alignment,undefined
-fno-sanitize-recover=all`` (pip install . -C cmake.define.CMAKE_CXX_FLAGS=... plus the
same in CMAKE_SHARED_LINKER_FLAGS and CMAKE_MODULE_LINKER_FLAGS).
"""

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "fuzz_boundary.py"
CASES = int(os.environ.get("RNNCORE_FUZZ_CASES", "6000"))
FIRST_SEED = int(os.environ.get("RNNCORE_FUZZ_SEED", "0"))
CASE_TIMEOUT = 60  # seconds for one case before it counts as a hang
FAILURES = ("unclear", "wrong", "crash", "hang", "internal")
CATEGORIES = ("ok", "clear") + FAILURES


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def jobs():
    return max(1, int(os.environ.get("RNNCORE_FUZZ_JOBS", min(usable_cores(), 4))))


def run_workers(first, count, n_jobs):
    """Run `count` seeds from `first` on `n_jobs` workers; returns (events, stderr)."""
    env = dict(os.environ)
    # One thread per worker (the workers fill the cores); BLAS pools off before forking.
    env.update(RNNCORE_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.update(MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for k in range(n_jobs):
            n = len(range(k, count, n_jobs))
            if n == 0:
                continue
            out = open(Path(tmp) / f"out{k}", "w+")
            err = open(Path(tmp) / f"err{k}", "w+")
            cmd = [sys.executable, str(WORKER), "--first", str(first + k), "--count", str(n)]
            cmd += ["--stride", str(n_jobs), "--timeout", str(CASE_TIMEOUT)]
            procs.append((subprocess.Popen(cmd, stdout=out, stderr=err, env=env), out, err))
        events, stderr = [], []
        for p, out, err in procs:
            p.wait(timeout=max(600, count * 2))
            out.seek(0)
            err.seek(0)
            for line in out:
                if line.startswith("{"):
                    events.append(json.loads(line))
            stderr.append(err.read()[-4000:])
            if p.returncode != 0:
                events.append(
                    {
                        "ev": "end",
                        "seed": None,
                        "cat": "internal",
                        "why": f"worker exited with {p.returncode}: {stderr[-1][-1000:]}",
                    }
                )
            out.close()
            err.close()
    return events, stderr


def signature(why):
    """A failure's message with the numbers taken out: one line per kind of defect."""
    why = re.sub(r"\b\w+Descriptor\.\w+", "<Descriptor>.<field>", why)
    why = re.sub(r"\(\d[\d, ]*\)", "(…)", why)
    why = re.sub(r"\d+(\.\d+)?(e[+-]\d+)?", "N", why)
    return why.split("The following argument types")[0][:150]


def summarize(events):
    descriptions = {e["seed"]: e["desc"] for e in events if e["ev"] == "start"}
    ends = [e for e in events if e["ev"] == "end"]
    counts = collections.Counter(e["cat"] for e in ends)
    groups = collections.defaultdict(list)
    for e in ends:
        if e["cat"] in FAILURES:
            groups[(e["cat"], signature(e["why"]))].append(e)
    lines = [
        "fuzz: "
        + ", ".join(f"{c} {counts.get(c, 0)}" for c in CATEGORIES)
        + f" (of {len(ends)} cases)"
    ]
    for (cat, sig), items in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        lines.append(f"{cat.upper()} x{len(items)}: {sig}")
        for e in items[:2]:
            lines.append(f"    {descriptions.get(e['seed'], 'seed ' + str(e['seed']))}")
            lines.append(f"      -> {e['why'][:300]}")
            lines.append(f"      reproduce: python tests/fuzz_boundary.py --run {e['seed']}")
    return counts, "\n".join(lines)


def test_fuzz_python_boundary():
    start = time.monotonic()
    events, _ = run_workers(FIRST_SEED, CASES, jobs())
    elapsed = time.monotonic() - start
    report = os.environ.get("RNNCORE_FUZZ_REPORT")
    if report:
        with open(report, "w") as f:
            for e in events:
                f.write(json.dumps(e) + "\n")
    counts, text = summarize(events)
    print(f"\n{text}\nfuzz: {CASES} cases in {elapsed:.1f} s on {jobs()} worker(s)")
    done = sum(counts.values())
    assert done == CASES, f"{done} of {CASES} cases reported\n{text}"
    bad = {c: counts[c] for c in FAILURES if counts[c]}
    assert not bad, f"fuzz failures {bad}\n{text}"
    # The generator must keep reaching every outcome the oracle knows.
    assert counts["ok"] > CASES // 5 and counts["clear"] > CASES // 10, text

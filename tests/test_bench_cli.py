"""The bench (rnncore.bench): both entry points run it, every implementation it times is
checked against the float64 reference first, results go only where asked, and the PyTorch
mapping it gives every peer (rnncore.convert) reproduces rnncore's forward and gradients
(and a wrong mapping would be caught); a disagreeing implementation makes it exit 1."""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import rnncore
from rnncore import bench, convert
from rnncore._ops import KINDS, rel_err
from rnncore.bench import peers

torch = pytest.importorskip("torch")

RUN_PY = pathlib.Path(__file__).resolve().parent.parent / "bench" / "run.py"
WIDENING = RUN_PY.parent / "micro" / "f16_widening.cpp"
CARRY = RUN_PY.parent / "micro" / "carry_rows.cpp"
# Sizes every implementation runs in a moment (metal-emulated --quick's).
TINY = ["gru-T5-N2-H16", "lstm-T5-N2-H16", "gru-T5-N2-H16-f16"]


def run_bench(command, *args):
    run = subprocess.run(
        [sys.executable, *command, *map(str, args)], capture_output=True, text=True, timeout=600
    )
    return run.returncode, run.stdout + run.stderr


def check_results(stdout, results, device):
    """Every float32 configuration was checked against the reference, agreed and timed,
    torch among the peers, and the tables show the ratios."""
    assert results["device"] == device and results["passed"] is True
    timed = {}
    for r in results["results"]:
        assert r["status"] in ("ok", "n/a"), r
        if r["status"] == "ok":
            assert r["check"]["max_rel_err"] <= r["check"]["tolerance"], r
            timed.setdefault((r["config"], r["mode"]), {})[r["impl"]] = r
    for config in results["configs"]:
        if config["dtype"] == "float32":
            for mode in peers.MODES:
                row = timed[(config["name"], mode)]
                ours, peer = row["rnncore"], row["torch"]
                assert peer["ratio"] == pytest.approx(ours["median_s"] / peer["median_s"])
    assert "rnncore/peer" in stdout
    # A torch row with a time and a ratio, e.g. "inference  torch (cpu)  1.93  0.28  ok (".
    assert re.search(r"torch \(cpu\)\s+[0-9.]+\s+[0-9.]+\s+ok \(", stdout), stdout
    assert "PASS" in stdout


def test_bench_cpu(tmp_path):
    out = tmp_path / "cpu.json"
    code, stdout = run_bench(
        ["-m", "rnncore", "bench"], "--device", "cpu", "--quick", "--configs", *TINY, "--json", out
    )
    assert code == 0, stdout
    results = json.loads(out.read_text())
    check_results(stdout, results, "cpu")
    assert {r["impl"] for r in results["results"]} >= {"rnncore", "torch", "numpy"}
    # float16 storage on the CPU: timed and checked like the others.
    f16 = [r for r in results["results"] if r["config"].endswith("-f16") and r["impl"] == "rnncore"]
    assert f16 and all(r["status"] == "ok" for r in f16)
    # How much of its CPUs the machine got, all busy, before and after the run.
    if hasattr(os, "sched_setaffinity"):
        for when in ("before", "after"):
            avail = results[f"cpu_availability_{when}"]
            assert avail["cpus"] == sorted(os.sched_getaffinity(0))
            assert all(0 < r <= 1 for r in avail["ran"] + avail["speed"]), avail
            assert max(avail["speed"]) == 1
        assert stdout.count("CPUs all busy: each ran") == 2, stdout


def test_the_cpu_probe_sees_a_stopped_cpu():
    """A probe whose CPU is taken from it part of the time (here by busy processes pinned to
    the same CPU, which the scheduler gives their share of it, in slices of milliseconds as
    a host stops a VM's CPU) reports the share it ran, and the line warns."""
    import subprocess
    import sys

    from rnncore.bench import cpu_availability
    from rnncore.bench.report import availability_line

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity here")
    cpu = min(os.sched_getaffinity(0))
    hog_code = (
        f"import os, sys, time; os.sched_setaffinity(0, {{{cpu}}}); print(flush=True); "
        "sys.stdout.close(); t = time.time() + 10\nwhile time.time() < t: pass"
    )
    # Four busy processes pinned to one CPU share it: the probe runs a quarter of the time at
    # most, less where other work (CI's C++ jobs run beside the tests) or a host that stops
    # a VM's CPUs takes some of it.
    hogs = [
        subprocess.Popen([sys.executable, "-c", hog_code], stdout=subprocess.PIPE) for _ in range(3)
    ]
    try:
        for hog in hogs:
            hog.stdout.readline()  # pinned and about to spin
        avail = cpu_availability(0.5)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
            hog.stdout.close()
    ran = dict(zip(avail["cpus"], avail["ran"]))
    assert 0 < ran[cpu] < 0.4, avail
    assert "taken part of the time" in availability_line(avail)


def test_the_availability_line():
    from rnncore.bench.report import availability_line

    quiet = availability_line({"cpus": [0, 1], "ran": [0.99, 0.98], "speed": [1.0, 0.97]})
    assert (
        quiet
        == "CPUs all busy: each ran 0.99, 0.98 of the time, at speeds 1.00, 0.97 of the fastest"
    )
    uneven = availability_line({"cpus": [0, 1], "ran": [0.99, 0.98], "speed": [1.0, 0.6]})
    assert "different speeds" in uneven and "taken part" not in uneven
    assert availability_line(None) is None


@pytest.mark.skipif("metal-emulated" not in rnncore.devices(), reason="no host emulator")
def test_bench_metal_emulated_quick(tmp_path):
    out = tmp_path / "emulated.json"
    code, stdout = run_bench(
        ["-m", "rnncore", "bench"], "--device", "metal-emulated", "--quick", "--json", out
    )
    assert code == 0, stdout
    results = json.loads(out.read_text())
    check_results(stdout, results, "metal-emulated")
    assert "host emulator" in stdout
    assert all(c["T"] * c["N"] * c["H"] <= 5 * 2 * 16 for c in results["configs"])
    f16 = [r for r in results["results"] if r["config"].endswith("-f16") and r["impl"] == "rnncore"]
    assert f16 and all(r["status"] == "ok" for r in f16)


def test_run_py_writes_only_where_asked(tmp_path):
    """bench/run.py is the same bench; it writes into --out and replaces nothing there
    without --force."""
    args = ["--device", "cpu", "--quick", "--configs", TINY[0], "--modes", "inference"]
    code, stdout = run_bench([RUN_PY], *args, "--out", tmp_path)
    assert code == 0, stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["repository"]["commit"]  # run from the checkout: its commit
    assert "| config | mode |" in (tmp_path / "results.md").read_text()
    before = (tmp_path / "results.json").read_text()
    code, stdout = run_bench([RUN_PY], *args, "--out", tmp_path)
    assert code == 2 and "--force" in stdout
    assert (tmp_path / "results.json").read_text() == before


def test_loaded_run(tmp_path):
    """--loaded times rnncore beside a busy loop (float16 storage too) and writes loaded.json
    and loaded.md."""
    args = ["--loaded", "--quick", "--rounds", "1", "--configs", TINY[0], TINY[2]]
    code, stdout = run_bench(["-m", "rnncore", "bench"], *args, "--out", tmp_path)
    assert code == 0, stdout
    records = json.loads((tmp_path / "loaded.json").read_text())["records"]
    got = [(r["config"], r["same_bits"]) for r in records]
    assert got == [(TINY[0], True)] * 2 + [(TINY[2], True)] * 2
    assert "| gru-T5-N2-H16 | inference |" in (tmp_path / "loaded.md").read_text()


def test_disagreeing_implementation_fails_the_run(monkeypatch, capsys):
    """rnncore given a wrong mapping disagrees with the reference: exit status 1, untimed."""
    correct = peers.Problem.rnncore_weights

    def wrong(problem):
        w = correct(problem)
        return dict(w, secondary_bias=np.zeros_like(w["secondary_bias"]))

    monkeypatch.setattr(peers.Problem, "rnncore_weights", wrong)
    parser = bench.add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--device", "cpu", "--quick", "--configs", TINY[0]])
    assert bench.run(args) == 1
    out = capsys.readouterr().out
    assert re.search(r"rnncore\s+-\s+-\s+FAILED-CHECK: disagrees with the reference", out), out
    assert out.splitlines()[-1].startswith("FAIL:")


# ---- the weight mappings ------------------------------------------------------------------

# I != H and T, N small: a transposed weight or a swapped size would not even run.
SMALL = {"T": 6, "N": 3, "I": 5, "H": 7}


def problem(kind, bidirectional=False):
    return peers.Problem(peers.Config(kind, **SMALL, bidirectional=bidirectional), seed=7)


def torch_forward(p):
    with torch.no_grad():
        return peers.TorchImpl().module(p)(torch.from_numpy(p.x))[0].numpy()


def rnncore_forward(p, weights=None, descriptor=None):
    w = dict(weights or p.rnncore_weights())
    R = w.pop("recurrent_weight")
    desc = descriptor or p.descriptor(training=False)
    forward = getattr(rnncore, KINDS[p.config.kind].forward)
    return forward(p.x, R, **w, descriptor=desc, device="cpu").state


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_torch_mapping_reproduces_rnncore(kind, bidirectional):
    """What the training rows compare: y, dx and every weight gradient; the numpy loop
    too."""
    p = problem(kind, bidirectional)
    assert rel_err(rnncore_forward(p), torch_forward(p)) < 1e-5
    expected = peers.TorchImpl().reference(p)
    for impl in (peers.RnncoreImpl("cpu"), peers.TorchImpl(), peers.NumpyImpl()):
        run, result, sync = impl.prepare(p, "training")
        errors = peers.compare(result(run()), expected)
        assert set(errors) == set(expected)
        assert max(errors.values()) < 1e-4, (impl.name, errors)


def _swap_blocks(a, i, j, gates):
    blocks = np.split(a, gates, axis=0)
    blocks[i], blocks[j] = blocks[j], blocks[i]
    return np.ascontiguousarray(np.concatenate(blocks, axis=0))


def wrong_mappings(kind, p):
    """Plausible mistakes: (name, weights, descriptor)."""
    w = p.rnncore_weights()
    if kind == "lstm":
        swapped = {k: _swap_blocks(v, 1, 2, 4) for k, v in w.items()}  # i, g, f, o
        return [
            ("f and g blocks swapped", swapped, None),
            ("bias_hh dropped", {**w, "bias": p.torch_params[0]["bias_ih"]}, None),
        ]
    H = SMALL["H"]
    folded = dict(w, bias=w["bias"].copy(), secondary_bias=np.zeros_like(w["secondary_bias"]))
    folded["bias"][2 * H :] += w["secondary_bias"]  # b_hn outside r: a reset-before bias
    return [
        ("z, r, o gate order", w, rnncore.GRUDescriptor(reset_after=True)),
        ("flip_z", w, rnncore.GRUDescriptor(reset_gate_first=True, reset_after=True, flip_z=True)),
        ("reset before", w, rnncore.GRUDescriptor(reset_gate_first=True)),
        ("b_hn folded into the bias", folded, None),
    ]


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_wrong_mappings_are_caught(kind):
    """The forward comparison has the power to see each plausible mapping mistake."""
    p = problem(kind)
    expected = torch_forward(p)
    for name, weights, descriptor in wrong_mappings(kind, p):
        assert rel_err(rnncore_forward(p, weights, descriptor), expected) > 1e-3, name


def test_convert_from_torch_stacked_layers():
    """Every layer of a two-layer bidirectional LSTM, run one after the other, gives
    PyTorch's output; projections are refused."""
    torch.manual_seed(3)
    module = torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True)
    x = torch.randn(6, 3, 5)
    with torch.no_grad():
        expected = module(x)[0].numpy()
    y = x.numpy()
    for layer in convert.from_torch(module):
        assert layer.kind == "lstm" and layer.descriptor.bidirectional
        y = rnncore.lstm(y, **layer.arguments()).state
    assert rel_err(y, expected) < 1e-5
    with pytest.raises(ValueError, match="proj_size"):
        convert.from_torch(torch.nn.LSTM(5, 7, proj_size=3))


def test_onnx_mapping_reproduces_rnncore():
    """ONNX Runtime on convert.onnx_weights_from_torch agrees with rnncore."""
    pytest.importorskip("onnxruntime")
    for kind in ("rnn", "gru", "lstm"):
        p = problem(kind, bidirectional=True)
        run, result, _ = peers.OnnxRuntimeImpl().prepare(p, "inference")
        assert rel_err(result(run())["y"], rnncore_forward(p)) < 1e-5, kind


def test_onnx_runs_narrow_configurations_in_float32():
    """ONNX Runtime's CPU operators have no float16 or bfloat16: a narrow configuration runs
    them in float32 on its values (the float32 time narrow storage is meant to halve), and
    its records say so."""
    pytest.importorskip("onnxruntime")
    impl = peers.OnnxRuntimeImpl()
    for dtype in ("float16", "bfloat16"):
        p = peers.Problem(peers.Config("lstm", **SMALL, dtype=dtype), seed=7)
        wide = peers.Problem(peers.Config("lstm", **SMALL), seed=7)
        wide.x = p.x.astype(np.float32)
        wide.torch_params = [
            {k: v.astype(np.float32) for k, v in d.items()} for d in p.torch_params
        ]
        run, result, _ = impl.prepare(p, "inference")
        run32, result32, _ = impl.prepare(wide, "inference")
        np.testing.assert_array_equal(result(run())["y"], result32(run32())["y"], err_msg=dtype)
        assert impl.where(p.config) == "onnxruntime (float32)"
    assert impl.where(problem("lstm").config) == "onnxruntime"


def test_mlx_mapping_reproduces_rnncore():
    """Only where MLX is installed: inference and training."""
    pytest.importorskip("mlx.core")
    for kind in ("gru", "lstm"):
        p = problem(kind, bidirectional=True)
        expected = peers.TorchImpl().reference(p)
        for mode in peers.MODES:
            run, result, _ = peers.MlxImpl().prepare(p, mode)
            errors = peers.compare(
                result(run()), expected if mode == "training" else {"y": expected["y"]}
            )
            assert max(errors.values()) < 1e-4, (kind, mode, errors)


def test_layer_section():
    """--layers times rnncore.torch beside torch.nn (and rnncore.mlx beside mlx.nn when MLX
    is installed) and the modules' overhead over the raw operations."""
    code, stdout = run_bench(["-m", "rnncore", "bench"], "--layers", "--quick")
    assert code == 0, stdout
    assert re.search(
        r"bidirectional LSTM .* rnncore\.torch\s+[0-9.]+ ms\s+[0-9.]+ vs torch\.nn", stdout
    )
    assert re.search(r"raw operations\s+[0-9.]+ ms\s+[0-9.]+ overhead of the module", stdout)


def test_lengths_section():
    """--lengths times rnncore with lengths beside rnncore padded, PyTorch's packed sequences
    and ONNX Runtime's sequence_lens, after checking each against the float64 reference."""
    code, stdout = run_bench(["-m", "rnncore", "bench"], "--lengths", "--quick")
    assert code == 0, stdout
    assert "FAILED" not in stdout
    assert re.search(r"GRU  training  rnncore, lengths\s+[0-9.]+ ms\s+[0-9.]+ of \(sum L", stdout)
    assert re.search(r"LSTM inference PyTorch, packed\s+[0-9.]+ ms\s+rnncore with lengths", stdout)
    assert re.search(r"ONNX Runtime, sequence_lens\s+[0-9.]+ ms", stdout)


def test_targets_section(tmp_path):
    """--targets times each speed target as rnncore against the peers it names in alternating
    rounds, after checking them against the float64 reference: a target's ratio is the median
    of the rounds' ratios to the fastest of those peers in the same round."""
    pytest.importorskip("onnxruntime")
    out = tmp_path / "targets"
    code, stdout = run_bench([RUN_PY], "--targets", "--quick", "--out", out)
    assert code == 0, stdout
    for target in (
        r"LSTM N=32 inference vs fastest peer\s+1\.0",
        r"GRU N=1 float16 inference vs ONNX Runtime float32\s+0\.5",
        r"LSTM N=32 bfloat16 training vs PyTorch bfloat16\s+0\.8",
    ):
        row = target + r"\s+[0-9.]+ \([0-9.]+-[0-9.]+\) (met|not met)\s+2 rounds"
        assert re.search(row, stdout), stdout
    data = json.loads((out / "targets.json").read_text())
    assert "--targets" in data["command"] and data["run"] == "quick"
    # run from the checkout: its commit, recorded by the section's own process
    assert data["repository"]["commit"]
    assert [r["status"] for r in data["targets"]] == ["ok"] * 3
    for r in data["targets"]:
        times = r["round_s"]
        assert set(times) == {"rnncore", *r["peers"]} and all(len(v) == 2 for v in times.values())
        fastest = np.min([times[p] for p in r["peers"]], axis=0)
        ratios = np.array(times["rnncore"]) / fastest
        assert r["ratio"] == pytest.approx(np.median(ratios))
        assert r["met"] == (r["ratio"] <= r["limit"])
        # Two threads on two CPUs or more: the CPUs' round trip before each round.
        if data["threads"] > 1 and len(os.sched_getaffinity(0)) > 1:
            assert len(r["round_trip_ns"]) == 2 and all(t > 0 for t in r["round_trip_ns"])
    if data["threads"] > 1 and len(os.sched_getaffinity(0)) > 1:
        assert data["cpu_availability_before"]["round_trip_ns"] > 0
        assert (
            stdout.count("CPU round trip") == 3 and "a round trip between the first two" in stdout
        )
    assert "```" in (out / "targets.md").read_text()
    # An existing result is replaced only with --force.
    code, stdout = run_bench(["-m", "rnncore", "bench"], "--targets", "--quick", "--out", out)
    assert code == 2 and "not replacing" in stdout


def test_targets_pair_each_round_with_its_fastest_peer():
    from rnncore.bench import targets

    ratios = targets.paired([2.0, 4.0, 3.0], [[1.0, 8.0, 6.0], [4.0, 2.0, 1.5]])
    np.testing.assert_allclose(ratios, [2.0, 2.0, 2.0])
    assert targets.label("lstm-T100-N32-H256", "training", ("torch",)) == (
        "LSTM N=32 training vs fastest peer"
    )
    assert targets.label("gru-T100-N1-H256-bf16", "inference", ("torch",)) == (
        "GRU N=1 bfloat16 inference vs PyTorch bfloat16"
    )


def test_targets_tell_what_a_peer_does_not_run_from_a_failure():
    """A peer that does not run a target's layer gives that row n/a (no ratio, the run does
    not fail); one that disagrees with the reference fails the row."""
    from rnncore.bench import targets

    class Impl:
        def __init__(self, name):
            self.name = name

    def run_one(status):
        def run(impl, problem, mode, threads, expected, timing, device):
            s = status if impl.name == "onnxruntime" else "ok"
            return {"impl": impl.name, "status": s, "note": "why", "_prepared": None}

        return run

    target = [("gru-T5-N2-H16", "inference", ("onnxruntime",), 0.5)]
    fake = ([Impl("torch"), Impl("onnxruntime")], {})
    with pytest.MonkeyPatch.context() as m:
        m.setattr(targets, "QUICK", target)
        m.setattr(targets, "make_peers", lambda device: fake)
        m.setattr(Impl, "reference", lambda self, p: {"y": None}, raising=False)
        m.setattr(targets, "RnncoreImpl", lambda device: Impl("rnncore"))
        for status, want in (("n/a", "n/a"), ("FAILED-CHECK", "FAILED")):
            rows, _ = targets.run_targets(True, None, run_one(status), {}, 1.0, 1)
            assert [r["status"] for r in rows] == [want] and "onnxruntime" in rows[0]["note"]


def test_targets_are_a_cpu_section(capsys):
    parser = bench.add_arguments(argparse.ArgumentParser())
    assert bench.run(parser.parse_args(["--targets", "--device", "metal-emulated"])) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_targets_without_pytorch_say_so(monkeypatch, capsys):
    """The reference is PyTorch's float64 autograd: without it --targets exits 2 saying so."""
    from rnncore.bench import targets

    monkeypatch.setattr(targets, "reference_peer_missing", lambda: True)
    parser = bench.add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--targets", "--quick", "--worker-section", "--device", "cpu"])
    assert bench.run(args) == 2
    assert "needs PyTorch" in capsys.readouterr().err


def test_a_crashed_worker_keeps_the_configurations_it_finished(tmp_path, monkeypatch, capsys):
    """The worker writes its results after each configuration, so a worker that dies (the
    kernels once raised SIGILL beside PyTorch's) loses only the one it was in: the run
    reports the exit code and what it kept, fails, and still writes its results."""
    parser = bench.add_arguments(argparse.ArgumentParser())
    out = tmp_path / "worker.json"
    args = parser.parse_args(["--device", "cpu", "--quick", "--modes", "inference",
                              "--configs", *TINY[:2], "--worker-out", str(out)])  # fmt: skip
    real = bench.run_one

    def dies_in_the_second(impl, problem, *rest):
        if problem.config.name == TINY[1]:
            raise SystemExit(-4)
        return real(impl, problem, *rest)

    monkeypatch.setattr(bench, "run_one", dies_in_the_second)
    with pytest.raises(SystemExit):
        bench.run(args)
    kept = json.loads(out.read_text())
    assert {r["config"] for r in kept["records"]} == {TINY[0]}

    run = subprocess.run

    def crashed(cmd, *a, **kw):  # the worker's process only
        if "--worker-out" not in cmd:
            return run(cmd, *a, **kw)
        pathlib.Path(cmd[cmd.index("--worker-out") + 1]).write_text(out.read_text())
        return subprocess.CompletedProcess(cmd, -4)

    monkeypatch.setattr(bench.subprocess, "run", crashed)
    args = parser.parse_args(["--device", "cpu", "--quick", "--modes", "inference",
                              "--threads", "1", "--configs", *TINY[:2],
                              "--out", str(tmp_path / "r")])  # fmt: skip
    assert bench.run(args) == 1
    printed = capsys.readouterr().out
    said = f"failed with exit code -4 after 1 configuration(s) (the last done: {TINY[0]})"
    assert said in printed
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["passed"] is False and results["workers"][0]["exit_code"] == -4
    assert {r["config"] for r in results["results"]} == {TINY[0]}
    assert (
        "The 1-thread run failed (exit code -4) after 1 configuration(s)"
        in (tmp_path / "r" / "results.md").read_text()
    )


def test_full_runs_time_the_implementations_in_rounds_taking_turns(monkeypatch):
    """A full run measures each implementation of a configuration and mode in 3 rounds,
    taking turns (rnncore, then each peer, then rnncore again ...): its time is the median
    of its rounds' medians and its minimum the least; calls slower than ROUND_CALL_S are
    measured once; the prepared calls are not kept in the records."""
    order, times = [], {"rnncore": [3.0, 1.0, 2.0], "torch": [0.4, 0.2, 0.3], "mlx": [9.0]}

    def fake_measure(fn, timing, allowed, sync=lambda: None):
        name = fn()
        order.append(name)
        t = times[name][sum(1 for n in order if n == name) - 1]
        assert timing["min_time"] == pytest.approx(bench.TIMING["full"]["min_time"] / 3)
        return {"median_s": t * 1e-3 if name != "mlx" else t, "min_s": t * 1e-3 / 2, "reps": 5,
                "cpu_use": 2.0, "other_cpu": 0.0, "attempts": 1, "disturbed": False}  # fmt: skip

    monkeypatch.setattr(bench, "measure", fake_measure)
    config = peers.BY_NAME["gru-T5-N2-H16"]
    records = []
    for name in ("rnncore", "torch", "mlx"):
        prepared = peers.Prepared(run=lambda name=name: name, result=None)
        r = {"config": config.name, "mode": "inference", "threads": 2, "impl": name}
        r.update(fake_measure(prepared.run, bench.round_timing(bench.TIMING["full"]), 0.0))
        r["_prepared"] = prepared
        records.append(r)
    bench.measure_rounds(records, config, "inference", bench.TIMING["full"], "cpu")
    assert order == ["rnncore", "torch", "mlx", "rnncore", "torch", "rnncore", "torch"]
    ours, peer, slow = records
    assert ours["round_medians_s"] == [3e-3, 1e-3, 2e-3] and ours["median_s"] == 2e-3
    assert peer["median_s"] == pytest.approx(3e-4) and peer["min_s"] == pytest.approx(1e-4)
    assert ours["reps"] == 15 and "round_medians_s" not in slow and slow["median_s"] == 9.0
    assert all("_prepared" not in r for r in records)
    json.dumps(records)  # what the worker writes


def test_gemm_measurements_include_onnx_runtime_and_the_layer_shapes(monkeypatch):
    """The GEMM peak is measured by numpy (OpenBLAS), torch and ONNX Runtime (MLAS, its
    weights prepacked as its LSTM's are), each product checked against numpy's first, at
    2048² and at the shapes of the LSTM T=100 N=32 layer's products; the report names them."""
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((37, 20)).astype(np.float32)
    b = rng.standard_normal((20, 33)).astype(np.float32)
    fns = bench.gemm_candidates(a, b, 2)
    assert set(fns) == {"numpy", "torch", "onnxruntime"}
    for fn in fns.values():
        assert np.allclose(np.asarray(fn()), a @ b, rtol=1e-5, atol=1e-5)
    # A product that disagrees is left out rather than timed.
    monkeypatch.setattr(bench, "onnx_matmul", lambda b, threads: lambda a: a @ b + 1)
    assert "onnxruntime" not in bench.gemm_candidates(a, b, 2)
    monkeypatch.undo()
    assert bench.GEMM_SHAPES == {"projection": (3200, 256, 1024), "step": (32, 256, 1024)}
    calls = []

    def fake_measure(fn, timing, allowed, sync=lambda: None):
        calls.append(fn)
        return {"median_s": 1e-3}

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "GEMM_SHAPES", {"step": (4, 8, 16)})
    out = bench.gemm_peak({"warmup": 1}, 1.0, 2)
    for prefix in ("sgemm", "dgemm"):
        for lib in ("numpy", "torch", "onnxruntime"):
            assert out[f"{prefix}_{lib}_gflops"] == round(2 * 2048**3 / 1e-3 / 1e9, 1)
    assert out["sgemm_shapes"]["step"]["onnxruntime_gflops"] == round(2 * 4 * 8 * 16 / 1e6, 1)
    line = bench.report.gemm_line(out)
    assert "ONNX Runtime" in line and "float32 step [4×8]·[8×16]" in line


def test_the_processor_is_told_apart_by_family_model_and_caches(tmp_path):
    # Two "AMD EPYC" of different generations (Zen 4 and Zen 5 differ in their FMA and
    # conversion rates): the record names each, from the first CPU's block only.
    cpuinfo = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
        "model name\t: AMD EPYC\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
    )
    for i, (level, kind, size) in enumerate(
        [
            (1, "Data", "48K"),
            (1, "Instruction", "32K"),
            (2, "Unified", "1024K"),
            (3, "Unified", "32768K"),
        ]
    ):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{value}\n")
    ident = bench.cpu_identity(cpuinfo, tmp_path)
    assert ident == {
        "cpu_vendor": "AuthenticAMD",
        "cpu_family": 26,
        "cpu_model_number": 2,
        "cpu_microarchitecture": "Zen 5",
        "cpu_caches": {"L1d": "48K", "L1i": "32K", "L2": "1024K", "L3": "32768K"},
    }
    machine = {"cpu_model": "AMD EPYC", **ident}
    assert bench.report.cpu_description(machine) == (
        "AMD EPYC (Zen 5: family 26 model 2; L1d 48K, L2 1024K a core; L3 32768K)"
    )
    zen4 = bench.cpu_identity(cpuinfo.replace(": 26", ": 25"), tmp_path / "none")
    assert zen4["cpu_microarchitecture"] == "Zen 3/4" and "cpu_caches" not in zen4
    intel = bench.cpu_identity("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n")
    assert intel["cpu_family"] == 6 and "cpu_microarchitecture" not in intel
    # Older results (no identity recorded) still print.
    assert bench.report.cpu_description({"cpu_model": "AMD EPYC"}) == "AMD EPYC"


@pytest.mark.parametrize("section", ["--layers", "--lengths", "--targets"])
def test_sections_run_without_the_openblas_overrides(section, monkeypatch, capsys):
    """--layers and --lengths time in a process of their own, as the configurations do: the
    OpenBLAS overrides unset and --threads's count in the thread variables (an
    OPENBLAS_CORETYPE=Haswell in the environment had made rnncore's layers 1.37x slower)."""
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    seen = []

    def fake_run(cmd, env=None, check=False):
        seen.append((cmd, env))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    parser = bench.add_arguments(argparse.ArgumentParser())
    assert bench.run(parser.parse_args([section, "--quick", "--threads", "2"])) == 0
    [(cmd, env)] = seen
    assert section in cmd and "--worker-section" in cmd and "--quick" in cmd
    assert "OPENBLAS_CORETYPE" not in env and "OPENBLAS_L2_SIZE" not in env
    assert env["RNNCORE_NUM_THREADS"] == "2" and env["OMP_NUM_THREADS"] == "2"
    out = capsys.readouterr().out
    assert "OPENBLAS_CORETYPE=Haswell" in out  # recorded in the header


def _cpu_flags():
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


@pytest.mark.skipif(
    not {"avx512f", "f16c", "fma"} <= _cpu_flags() or shutil.which("c++") is None,
    reason="the float16 widening microbenchmark needs a C++ compiler and AVX-512F, F16C, FMA",
)
def test_f16_widening_microbenchmark_builds_and_its_ways_agree(tmp_path):
    """bench/micro/f16_widening.cpp (docs/performance.md's float16 measurements) builds
    warning-free, and its float32, 512-bit and 256-bit widening products give the same bits."""
    exe = tmp_path / "f16_widening"
    build = subprocess.run(
        [
            "c++",
            "-O2",
            "-march=native",
            "-Wall",
            "-Wextra",
            "-Wno-uninitialized",
            "-Werror",
            str(WIDENING),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    check = subprocess.run([str(exe), "--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.skipif(
    not {"avx512f", "avx512_bf16"} <= _cpu_flags() or shutil.which("c++") is None,
    reason="the carried-rows microbenchmark needs a C++ compiler and AVX-512 BF16",
)
def test_carry_rows_microbenchmark_builds_and_its_layouts_agree(tmp_path):
    """bench/micro/carry_rows.cpp (docs/performance.md's carried blocks) builds warning-free,
    and its 4 rows × 4 gates and 8 rows × 2 gates carried sums give the same bits."""
    exe = tmp_path / "carry_rows"
    build = subprocess.run(
        ["c++", "-O2", "-march=native", "-Wall", "-Wextra", "-Werror", str(CARRY), "-o", str(exe)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    check = subprocess.run([str(exe), "--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "the same bits" in check.stdout, check.stdout + check.stderr


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="the round trip needs two CPUs",
)
def test_cpu_round_trip_probe():
    """Two pinned processes bounce a byte through a shared page: a round trip between the
    first two CPUs in nanoseconds (a busy interpreter loop: well under a millisecond)."""
    trips = [bench.cpu_round_trip_ns(n=500) for _ in range(3)]
    assert all(isinstance(t, int) and 0 < t < 1_000_000 for t in trips), trips


def test_round_trips_are_reported_and_far_ones_flagged():
    """The targets' rows give the rounds' median round trip and how many rounds found the
    CPUs far apart; the availability line warns when they are."""
    from rnncore.bench import report, targets

    far = report.FAR_ROUND_TRIP_NS
    row = {"target": "LSTM N=1 bfloat16 inference vs ONNX Runtime float32", "limit": 0.5,
           "status": "ok", "ratio": 0.6, "quartiles": [0.5, 0.9], "met": False, "rounds": 3,
           "median_s": {"rnncore": 5e-4, "onnxruntime": 9e-4},
           "round_trip_ns": [far // 2, far // 2, far * 2]}  # fmt: skip
    assert re.search(r"CPU round trip 0\.\d\d us, far in 1 of 3 rounds$", targets.line(row))
    row["round_trip_ns"] = [far // 2] * 3
    assert targets.line(row).endswith(" us") and "far" not in targets.line(row)
    del row["round_trip_ns"]
    assert "round trip" not in targets.line(row)
    avail = {"cpus": [0, 1], "ran": [1.0, 1.0], "speed": [1.0, 1.0], "round_trip_ns": far // 2}
    assert "warning" not in report.availability_line(avail)
    avail["round_trip_ns"] = far * 2
    assert "far apart" in report.availability_line(avail)

"""``python -m rnncore bench``: its quick runs check PyTorch (CPU) against rnncore and print
ratios; the weight mappings it relies on reproduce rnncore's forward and gradients
exactly (and a wrong mapping would be caught); a disagreeing peer makes it exit 1."""

import argparse
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import rnncore
from rnncore import bench

torch = pytest.importorskip("torch")


def run_bench(tmp_path, device):
    out = tmp_path / f"{device}.json"
    run = subprocess.run(
        [sys.executable, "-m", "rnncore", "bench", "--device", device, "--quick", "--json", out],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout, json.loads(out.read_text())


def check_report(stdout, report, device, dtypes):
    """Every configuration of `dtypes` was checked against torch on the CPU, agreed and
    was timed, and the tables show the ratios."""
    assert report["device"] == device and report["passed"] is True
    assert report["peers"]["torch"]["device"] == "torch (cpu)"
    configs = [name for name, c in report["configs"].items() if c["dtype"] in dtypes]
    assert configs
    for name in configs:
        for mode in bench.MODES:
            rows = {
                r["impl"]: r for r in report["rows"] if (r["config"], r["mode"]) == (name, mode)
            }
            ours, peer = rows["rnncore"], rows["torch (cpu)"]
            assert ours["status"] == "timed" and ours["ms"] > 0, ours
            assert peer["status"] == "ok", peer
            assert peer["error"] <= peer["tolerance"], peer
            assert peer["ratio"] == pytest.approx(ours["ms"] / peer["ms"])
    assert "rnncore/peer" in stdout
    # A torch row with a time and a ratio, e.g. "inference  torch (cpu)  1.928  0.28  ok (...".
    ratios = re.findall(r"torch \(cpu\)\s+[0-9.]+\s+([0-9.]+)\s+ok \(", stdout)
    assert len(ratios) == len(configs) * len(bench.MODES)
    assert "PASS" in stdout.splitlines()[-2]  # the summary, then "wrote FILE"


def test_bench_cpu_quick(tmp_path):
    stdout, report = run_bench(tmp_path, "cpu")
    check_report(stdout, report, "cpu", {"float32"})
    # The CPU computes no float16: those rows are skipped, not failed.
    f16 = [r for r in report["rows"] if r["config"].endswith("-f16")]
    assert f16 and all(r["status"] == "skipped" for r in f16)


@pytest.mark.skipif("metal-emulated" not in rnncore.devices(), reason="no host emulator")
def test_bench_metal_emulated_quick(tmp_path):
    stdout, report = run_bench(tmp_path, "metal-emulated")
    check_report(stdout, report, "metal-emulated", {"float32", "float16"})
    assert "not a GPU" in stdout
    assert all(c["T"] * c["N"] * c["H"] <= 5 * 2 * 16 for c in report["configs"].values())


# ---- the weight mappings ------------------------------------------------------------------

# I != H and T, N small: a transposed weight or a swapped size would not even run.
SMALL = {"T": 6, "N": 3, "I": 5, "H": 7}


def problem(kind):
    return bench.make_problem(bench.Config(kind, **SMALL), seed=7)


def torch_forward(kind, p):
    module = bench.torch_module(kind, p.params)
    with torch.no_grad():
        return module(torch.from_numpy(p.x))[0].numpy()


def rnncore_forward(kind, p, weights=None, descriptor=None):
    w = dict(weights or bench.rnncore_weights(kind, p.params))
    R = w.pop("recurrent_weight")
    desc = descriptor or bench.rnncore_descriptor(kind, training=False)
    forward = rnncore.gru if kind == "gru" else rnncore.lstm
    return forward(p.x, R, **w, descriptor=desc, device="cpu").state


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_torch_mapping_reproduces_rnncore_forward(kind):
    p = problem(kind)
    expected = torch_forward(kind, p)
    assert bench.rel_err(rnncore_forward(kind, p), expected) < 1e-5


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_torch_mapping_reproduces_rnncore_gradients(kind):
    """The training rows compare exactly these: dx, dW, dR, dbias (and db2)."""
    p = problem(kind)
    results = []
    for impl in (bench.RnncoreImpl("cpu"), bench.TorchImpl("cpu")):
        run, sync, result = impl.prepare(p, "training")
        out = run()
        sync()
        results.append(result(out))
    ours, theirs = results
    assert set(ours) == {"dx", "dW", "dR", "dbias"} | ({"db2"} if kind == "gru" else set())
    for field in ours:
        assert bench.rel_err(theirs[field], ours[field]) < 1e-4, field


def _swap_blocks(a, i, j, gates):
    blocks = np.split(a, gates, axis=0)
    blocks[i], blocks[j] = blocks[j], blocks[i]
    return np.ascontiguousarray(np.concatenate(blocks, axis=0))


def wrong_mappings(kind, p):
    """Plausible mistakes: (name, weights, descriptor)."""
    w = bench.rnncore_weights(kind, p.params)
    if kind == "lstm":
        swapped = {k: _swap_blocks(v, 1, 2, 4) for k, v in w.items()}  # i, g, f, o
        return [
            ("f and g blocks swapped", swapped, None),
            ("bias_hh dropped", {**w, "bias": p.params["bias_ih"]}, None),
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
    """The forward test above has the power to see each plausible mapping mistake."""
    p = problem(kind)
    expected = torch_forward(kind, p)
    for name, weights, descriptor in wrong_mappings(kind, p):
        err = bench.rel_err(rnncore_forward(kind, p, weights, descriptor), expected)
        assert err > 1e-3, name


def test_disagreeing_peer_fails_the_run(monkeypatch, capsys):
    """A peer that disagrees with rnncore is a failure (exit status 1) and is not timed."""
    tiny = [bench.Config("gru", 3, 2, 4, 5)]
    monkeypatch.setattr(bench, "QUICK", tiny)
    correct = bench.rnncore_weights

    def wrong(kind, params):
        w = correct(kind, params)
        return dict(w, secondary_bias=np.zeros_like(w["secondary_bias"]))

    monkeypatch.setattr(bench, "rnncore_weights", wrong)
    args = argparse.Namespace(device="cpu", quick=True, json=None)
    assert bench.run(args) == 1
    out = capsys.readouterr().out
    assert re.search(r"torch \(cpu\)\s+-\s+-\s+FAIL: disagrees with rnncore", out), out
    assert out.splitlines()[-1].startswith("FAIL:")


def test_mlx_mapping_reproduces_rnncore():
    """Only where MLX is installed (not in the test extras): inference and training."""
    pytest.importorskip("mlx.core")
    for kind in ("gru", "lstm"):
        p = problem(kind)
        for mode in bench.MODES:
            results = []
            for impl in (bench.RnncoreImpl("cpu"), bench.MlxImpl("cpu")):
                run, sync, result = impl.prepare(p, mode)
                results.append(result(run()))
            err, field = bench.worst_error(results[1], results[0])
            assert err < 1e-4, (kind, mode, field, err)

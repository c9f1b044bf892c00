"""The demo trains with rnncore's forward and gradient operations only; its quick run
must show learning (the test loss falls 50-fold) for both models."""

import subprocess
import sys

import pytest

import rnncore


def test_demo_quick_learns():
    run = subprocess.run(
        [sys.executable, "-m", "rnncore", "demo", "--quick", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "GRU: loss" in run.stdout and "LSTM: loss" in run.stdout
    assert run.stdout.count("PASS") == 2


def test_demo_reports_failure():
    run = subprocess.run(
        [sys.executable, "-m", "rnncore", "demo", "--model", "gru", "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1
    assert "FAIL" in run.stdout


def epoch_lines(stdout):
    """The per-epoch 'test loss ... accuracy ...' parts of the demo's output."""
    return [line.split("(")[0].strip() for line in stdout.splitlines() if "test loss" in line]


def demo(*args):
    return subprocess.run(
        [sys.executable, "-m", "rnncore", "demo", "--quick", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif("metal-emulated" not in rnncore.devices(), reason="no host emulator")
@pytest.mark.parametrize("model, epochs", [("gru", "4"), ("lstm", "1")])
def test_demo_trains_the_same_on_the_metal_kernels(model, epochs):
    """Training through the Metal kernels (on the host emulator) follows the CPU run: the
    same test loss and accuracy at every epoch (printed to 4 digits), and the GRU's quick
    run passes."""
    runs = {d: demo("--model", model, "--epochs", epochs, "--device", d) for d in DEVICES}
    for d, run in runs.items():
        assert "Traceback" not in run.stderr, d + run.stderr
    cpu, emulated = (epoch_lines(runs[d].stdout) for d in DEVICES)
    assert len(cpu) == int(epochs) + 1
    assert emulated == cpu
    if model == "gru":
        assert runs["metal-emulated"].returncode == 0
        assert "PASS" in runs["metal-emulated"].stdout


DEVICES = ("cpu", "metal-emulated")

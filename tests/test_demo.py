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


def test_demo_steps_and_epochs():
    """--steps and --epochs set the run's length; nonsense values are refused."""
    run = demo("--model", "gru", "--epochs", "3", "--steps", "5", "--device", "cpu")
    assert len(epoch_lines(run.stdout)) == 4, run.stdout + run.stderr
    for bad in (("--steps", "0"), ("--epochs", "0")):
        run = demo(*bad)
        assert run.returncode == 2 and "must be at least 1" in run.stderr


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
@pytest.mark.parametrize("model", ["gru", "lstm"])
def test_demo_trains_the_same_on_the_metal_kernels(model):
    """Training through the Metal kernels (on the host emulator) follows the CPU run: the
    same test loss and accuracy at every epoch (printed to 4 digits). One epoch of 5 steps:
    the emulator runs a quick epoch of 100 in about a minute."""
    args = ("--model", model, "--epochs", "1", "--steps", "5")
    runs = {d: demo(*args, "--device", d) for d in DEVICES}
    for d, run in runs.items():
        assert "Traceback" not in run.stderr, d + run.stderr
    cpu, emulated = (epoch_lines(runs[d].stdout) for d in DEVICES)
    assert len(cpu) == 2
    assert emulated == cpu
    assert cpu[0] != cpu[-1]  # it trained


DEVICES = ("cpu", "metal-emulated")

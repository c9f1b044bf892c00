"""The demo trains with rnncore's forward and gradient operations only; its quick run
must show learning (the test loss falls 50-fold) for both models."""

import subprocess
import sys


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

"""Every CPU code path gives the contract's results: the fused float32 kernels for each
instruction set this machine has (RNNCORE_ISA), and the BLAS-per-step path
(RNNCORE_CPU_PATH=blas). The variant is fixed when the library loads, so each one runs
`python -m rnncore check` (every op and option against the reference) in a subprocess."""

import os
import subprocess
import sys

import pytest

VARIANTS = [
    {"RNNCORE_ISA": "generic"},
    {"RNNCORE_ISA": "avx2"},
    {"RNNCORE_ISA": "avx512"},
    {"RNNCORE_ISA": "avx512bf16"},
    {"RNNCORE_ISA": "avx512amx"},
    {"RNNCORE_CPU_PATH": "blas"},
    {"RNNCORE_NUM_THREADS": "1"},
    {"RNNCORE_NUM_THREADS": "3"},
]


@pytest.mark.parametrize("env", VARIANTS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_variant_passes_check(env):
    run = subprocess.run(
        [sys.executable, "-m", "rnncore", "check", "--device", "cpu"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "PASS" in run.stdout

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


# Every output (forward, training state and gradients) of a spread of register tiles: rows
# 1 to 32, three to one gates, I != H, float32, bfloat16 and float16 storage.
DIGEST = """
import hashlib
import numpy as np
from rnncore.bench.peers import Config, Problem, RnncoreImpl
impl, h = RnncoreImpl("cpu"), hashlib.sha256()
for kind in ("lstm", "gru", "rnn"):
    for dtype in ("float32", "bfloat16", "float16"):
        for T, N, I, H in [(6, 1, 16, 32), (3, 32, 64, 48), (4, 9, 33, 40), (2, 17, 70, 33)]:
            problem = Problem(Config(kind, T, N, H, I=I, dtype=dtype), seed=T + N)
            for mode in ("inference", "training"):
                prepared = impl.prepare(problem, mode)
                for name, v in sorted(prepared.result(prepared.run()).items()):
                    h.update(name.encode() + np.ascontiguousarray(v).tobytes())
print(h.hexdigest())
"""


@pytest.mark.parametrize("isa", ["", "avx512"], ids=["best", "avx512"])
def test_fma_broadcast_from_memory_or_register_same_bits(isa):
    """The AVX-512 tiles take A's element from memory in each FMA on AMD Zen 4 and broadcast it
    into a register first elsewhere (RNNCORE_FMA_BROADCAST forces either): the same
    instructions' arithmetic in the same order, so the same bits."""
    probe = subprocess.run(
        [sys.executable, "-c", "import rnncore; print(rnncore.build_info()['kernels'])"],
        env={**os.environ, "RNNCORE_ISA": isa}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if not probe.stdout.strip().startswith("avx512"):
        pytest.skip("no AVX-512 kernels on this machine")
    digests = []
    for form in ("memory", "register"):
        env = {**os.environ, "RNNCORE_ISA": isa, "RNNCORE_FMA_BROADCAST": form}
        run = subprocess.run(
            [sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        digests.append(run.stdout.strip())
    assert digests[0] == digests[1] and len(digests[0]) == 64

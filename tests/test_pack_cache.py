"""The CPU backend keeps the weights it packed for its fused kernels between calls, and
reuses them only while the weights' bytes are those it packed (README, "How the CPU
backend works"). Results never depend on it: a weight changed in place, a new array at a
freed one's address, or the same values in another array give exactly the bits of a call
on fresh copies, and RNNCORE_PACK_CACHE=0 (no cache) gives the same bits as with it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cases import BFLOAT16, make_descriptor, make_inputs, run

import rnncore

# (kind, descriptor fields, N, I, H, bidirectional): batch 1 and 32 (the cache holds R's
# panels at any batch; W's bfloat16 pairs when the projection runs before the steps), H
# whole and partial panels, I != H, no input weight.
CASES = (
    ("gru", {"reset_after": True}, 1, 24, 33, False),
    ("gru", {"reset_after": False}, 1, 16, 32, True),
    ("lstm", {}, 1, 40, 64, False),
    ("lstm", {}, 3, None, 31, True),
    ("rnn", {"activation": "TANH"}, 1, 8, 1, False),
    ("gru", {"reset_after": True}, 32, 48, 128, False),
)
DTYPES = (np.float32, np.float64, np.float16, BFLOAT16)


def case_id(c):
    kind, fields, N, I, H, bi = c  # noqa: E741
    return (
        f"{kind}{'-after' if fields.get('reset_after') else ''}-N{N}-I{I}-H{H}{'-bi' if bi else ''}"
    )


def inputs_of(case, dtype, seed=0):
    kind, fields, N, I, H, bi = case  # noqa: E741
    rng = np.random.default_rng(seed)
    args = make_inputs(rng, kind, T=5, N=N, H=H, I=I, bidirectional=bi, dtype=dtype, bias=True)
    return kind, make_descriptor(kind, bidirectional=bi, **fields), args


def bits(result):
    return [np.ascontiguousarray(v).view(np.uint8).tobytes() for v in result if v is not None]


def fresh(args):
    return {k: np.array(v, copy=True) for k, v in args.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_weights_changed_in_place_are_repacked(case, dtype):
    kind, desc, args = inputs_of(case, dtype)
    first = bits(run(rnncore, kind, args, desc))
    assert bits(run(rnncore, kind, args, desc)) == first  # a hit
    for name in ("recurrent_weight", "input_weight"):
        if name not in args:
            continue
        w = args[name]
        flat = w.reshape(-1)
        for at in (0, flat.size // 2, flat.size - 1):
            old = flat[at].copy()
            flat[at] = np.asarray(float(old) * 0.5 + 0.25, dtype=w.dtype)
            got = bits(run(rnncore, kind, args, desc))
            assert got == bits(run(rnncore, kind, fresh(args), desc)), (name, at)
            assert got != first, (name, at)
            flat[at] = old
        assert bits(run(rnncore, kind, args, desc)) == first, name


@pytest.mark.parametrize("dtype", (np.float32, BFLOAT16), ids=lambda d: np.dtype(d).name)
def test_new_weights_at_a_freed_address(dtype):
    case = CASES[0]
    kind, desc, args = inputs_of(case, dtype)
    for seed in range(6):  # each R dropped before the next is made: often the same address
        _, _, other = inputs_of(case, dtype, seed=seed + 1)
        args["recurrent_weight"] = np.array(other["recurrent_weight"], copy=True)
        got = bits(run(rnncore, kind, args, desc))
        assert got == bits(run(rnncore, kind, fresh(args), desc)), seed


_CHILD = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
import test_pack_cache as t
import rnncore
out = []
for case in t.CASES:
    for dtype in t.DTYPES:
        kind, desc, args = t.inputs_of(case, dtype)
        out.append([b.hex() for b in t.bits(t.run(rnncore, kind, args, desc))])
        out.append([b.hex() for b in t.bits(t.run(rnncore, kind, args, desc))])
print(json.dumps(out))
"""


def test_same_bits_without_the_cache():
    tests = os.path.dirname(os.path.abspath(__file__))
    code = _CHILD.format(tests=tests)
    results = {}
    for flag in ("1", "0"):
        env = dict(os.environ, RNNCORE_PACK_CACHE=flag)
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        results[flag] = json.loads(proc.stdout)
    assert len(results["1"]) == 2 * len(CASES) * len(DTYPES)
    assert results["1"] == results["0"]

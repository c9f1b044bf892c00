"""Random calls at the sizes where the CPU's fused kernels, their tiles and their tails run.

The sweeps elsewhere fix their shapes; here each seed draws one: an op, T from 5 steps (the
fused path) to 101, N from 1 (the batch-1 paths: x' by blocks of rows, carried in the
bfloat16 LSTM's steps) across the tiles' row counts and past them, H in whole and partial
16-unit panels up to 512 (the k chunks), I below, at and above H or no input weight, every
flag, the optional inputs and sometimes other activations, in float32, float16 or bfloat16,
forward or training forward and gradients. Each case checks what holds whatever the
inputs' conditioning:

- the outputs' bits are the same at 1 thread and at 2 or 3 (the contract: the thread count
  never changes a result: docs/api.md, "Devices and threads");
- a float16 forward is the float32 operation on the widened arrays, rounded once (bits);
- within the dtype's tolerance of rnncore.reference in float64 (tests/util.py), where the
  reference's outputs stay finite and below 100 in magnitude and, for the storage types,
  every activation is bounded (identity and ReLU amplify the storage's rounding past the
  contract's tolerance in long or growing sequences: ill-conditioned, not wrong). The
  reference's gradients take rnncore's own training state, so that a pre-activation within
  rounding of hard sigmoid's or ReLU's kink sits on the same side in both.

RNNCORE_KERNEL_FUZZ_CASES (default 800) and RNNCORE_KERNEL_FUZZ_SEED (first seed, default
0) widen a run; ``python tests/test_kernel_fuzz.py SEED`` runs one case and prints it.
"""

import os
import sys

import numpy as np
import pytest
from cases import (
    ACTIVATION_FIELDS,
    FLAG_FIELDS,
    MASK_FORMS,
    as_float64,
    cotangents_like,
    make_descriptor,
    make_inputs,
    run,
    run_gradients,
    training_forward,
)
from util import BFLOAT16, FORWARD_TOL, GRADIENT_TOL, rel_err

import rnncore
from rnncore import reference

CASES = int(os.environ.get("RNNCORE_KERNEL_FUZZ_CASES", "800"))
FIRST_SEED = int(os.environ.get("RNNCORE_KERNEL_FUZZ_SEED", "0"))
BLOCKS = 8
BOUNDED = ("SIGMOID", "TANH", "HARD_SIGMOID")


def pick(rng, items):
    return items[int(rng.integers(len(items)))]


def draw(seed):
    """One case: (description, kind, inputs, descriptor, whether gradients, the cotangents'
    options, the thread count beside 1, whether every activation is bounded)."""
    rng = np.random.default_rng(seed)
    kind = pick(rng, ["rnn", "lstm", "lstm", "gru", "gru"])
    T = pick(rng, [5, 6, 7, 8, 9, 12, 17, 25, 40, 64, 101])
    N = pick(rng, [1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 31, 32, 33, 48, 65])
    wide = T * N < 2000
    H = pick(rng, [16, 17, 32, 40, 48, 64, 80, 96, 100, 128, 160, 256] + [384, 512] * wide)
    I = pick(rng, [None, H, H // 2 + 1, 3, 64, 100, 256, 2 * H])  # noqa: E741
    while T > 5 and T * N * H * (H + (I or H)) > 4e7:  # the float64 reference's loops short
        T = max(5, T // 2)
    dtype = np.dtype(pick(rng, [np.float32, np.float16, np.float16, BFLOAT16, BFLOAT16]))
    options = dict(bias=rng.random() < 0.6, init_state=rng.random() < 0.4)
    if kind == "lstm":
        options.update(init_cell=rng.random() < 0.4, peephole=rng.random() < 0.2)
    if kind == "gru":
        options["secondary_bias"] = rng.random() < 0.4
    if rng.random() < 0.2:
        options["mask"] = pick(rng, MASK_FORMS)
    fields = {f: bool(rng.random() < 0.3) for f in FLAG_FIELDS[kind] if f != "training"}
    if rng.random() < 0.2:
        choices = BOUNDED if rng.random() < 0.7 else ("NONE", "RELU")
        for f in ACTIVATION_FIELDS[kind]:
            if rng.random() < 0.5:
                fields[f] = pick(rng, choices)
    gradients = rng.random() < 0.45
    cot = dict(state_gradient=rng.random() < 0.5)
    if kind == "lstm":
        cot["cell_gradient"] = pick(rng, [None, "final", "steps"])
    threads = pick(rng, [2, 2, 3])
    inputs = make_inputs(
        rng, kind, T=T, N=N, H=H, I=I, dtype=dtype, **options, bidirectional=fields["bidirectional"]
    )
    what = (
        f"seed {seed}: {kind} T={T} N={N} H={H} I={I} {dtype.name} {options} {fields}"
        f"{' gradients ' + str(cot) if gradients else ''}, 1 and {threads} threads"
    )
    bounded = all(v in BOUNDED for f, v in fields.items() if f in ACTIVATION_FIELDS[kind])
    return what, kind, inputs, make_descriptor(kind, **fields), gradients, cot, threads, bounded


def arrays(result):
    return {f: np.asarray(v) for f, v in zip(result._fields, result) if v is not None}


def well_conditioned(*results):
    with np.errstate(all="ignore"):
        return all(
            np.all(np.isfinite(v)) and np.abs(v).max(initial=0) <= 100
            for r in results
            for v in arrays(r).values()
        )


def float16_rounded_once(kind, inputs, desc, forward):
    """Messages for the fields of a float16 forward that are not the float32 operation on
    the widened arrays, rounded once."""
    wide = run(rnncore, kind, {k: v.astype(np.float32) for k, v in inputs.items()}, desc)
    messages = []
    for f, v in arrays(wide).items():
        with np.errstate(over="ignore"):  # past float16's range: inf, as rounded
            rounded = v.astype(np.float16)
        differ = int((rounded.view(np.uint16) != arrays(forward)[f].view(np.uint16)).sum())
        if differ:
            messages.append(f"{f}: {differ} elements not the float32 op rounded once")
    return messages


def reference_pairs(kind, inputs, desc, result, gradients, cot):
    """(rnncore's result, the reference's, tolerances) for the forward and the gradients."""
    f64 = as_float64(inputs)
    if not gradients:
        (forward,) = result
        return [(forward, run(reference, kind, f64, desc), FORWARD_TOL)]
    grads, forward = result
    mine = forward._replace(**{f: v.astype(np.float64) for f, v in arrays(forward).items()})
    ref_grads, _ = run_gradients(reference, kind, f64, desc, as_float64(cot), forward=mine)
    return [
        (forward, training_forward(reference, kind, f64, desc), FORWARD_TOL),
        (grads, ref_grads, GRADIENT_TOL),
    ]


def check(seed):
    """The case's failures, as messages (empty: it passed)."""
    what, kind, inputs, desc, gradients, cot_options, threads, bounded = draw(seed)
    dtype = inputs["source"].dtype
    cot = cotangents_like(np.random.default_rng(seed + 1), kind, inputs, **cot_options)
    runs = []
    try:
        for n in (1, threads):
            rnncore.set_num_threads(n)
            if gradients:
                runs.append(run_gradients(rnncore, kind, inputs, desc, cot))
            else:
                runs.append((run(rnncore, kind, inputs, desc),))
    finally:
        rnncore.set_num_threads(0)
    failures = []
    for one, other in zip(*runs):
        a, b = arrays(one), arrays(other)
        failures += [
            f"{f}: other bits at {threads} threads than at 1"
            for f in a
            if a[f].tobytes() != b[f].tobytes()
        ]
    if dtype == np.float16 and not gradients:
        failures += float16_rounded_once(kind, inputs, desc, runs[0][0])
    with np.errstate(all="ignore"):  # the reference may overflow: then nothing is compared
        pairs = reference_pairs(kind, inputs, desc, runs[0], gradients, cot)
    if (bounded or dtype == np.float32) and well_conditioned(*(e for _, e, _ in pairs)):
        for actual, expected, tol in pairs:
            mine = arrays(actual)
            for f, e in arrays(expected).items():
                err = rel_err(mine[f].astype(np.float64), e) if f in mine else np.inf
                if not err <= tol[dtype]:
                    failures.append(f"{f}: relative error {err:.2e} > {tol[dtype]:.0e}")
    return [f"{what}: {m}" for m in failures]


@pytest.mark.parametrize("block", range(BLOCKS))
def test_random_calls_of_the_fused_kernels(block):
    seeds = range(FIRST_SEED + block, FIRST_SEED + CASES, BLOCKS)
    failures = [m for seed in seeds for m in check(seed)]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


if __name__ == "__main__":
    seed = int(sys.argv[1])
    print(draw(seed)[0])
    print("\n".join(check(seed)) or "passed")

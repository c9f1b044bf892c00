"""Random calls at the sizes where the CPU's fused kernels, their tiles and their tails run.

The sweeps elsewhere fix their shapes; here each seed draws one: an op, T from 5 steps (the
fused path) to 101, N from 1 (the batch-1 paths: x' by blocks of rows, carried in the
bfloat16 LSTM's steps) across the tiles' row counts and past them, H in whole and partial
16-unit panels up to 512 (the k chunks), I below, at and above H or no input weight, every
flag, the optional inputs and sometimes other activations, in float32, float16 or bfloat16,
forward or training forward and gradients; on the CPU, and smaller on the Metal devices
(the emulator here). Each case checks:

- the outputs' bits are the same at 1 thread and at 2 or 3 (the contract: the thread count
  never changes a result: docs/api.md, "Devices and threads");
- on the CPU, a float16 forward is the float32 operation on the widened arrays, rounded
  once (bits);
- within 4 times the error the problem itself implies, of rnncore.reference in float64: how
  far the reference moves when every input moves by the arithmetic's rounding (`rounding`),
  plus half the results' rounding to their storage type. For a well-conditioned draw that
  is about 1e-6 in float32, 1e-3 in float16 and 1e-2 in bfloat16, several times tighter
  than the contract's tolerances (tests/util.py), so that a loss of precision fails; for
  an ill-conditioned one (long sequences, identity or ReLU gates, a tanh update gate whose
  1 - z reaches 2) it grows as the problem's sensitivity does. On Metal the contract's
  tolerances also hold. The reference's gradients take rnncore's own training state, so
  that a pre-activation within rounding of hard sigmoid's or ReLU's kink sits on the same
  side in both.

RNNCORE_KERNEL_FUZZ_CASES (default 240), RNNCORE_KERNEL_FUZZ_DEVICE_CASES (on each Metal
device, default 16) and RNNCORE_KERNEL_FUZZ_SEED (first seed, default 0) widen a run;
``python tests/test_kernel_fuzz.py SEED [DEVICE]`` runs one case and prints it.
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
    supported,
    training_forward,
)
from util import BFLOAT16, FORWARD_TOL, GRADIENT_TOL, devices_under_test, rel_err

import rnncore
from rnncore import reference

CASES = int(os.environ.get("RNNCORE_KERNEL_FUZZ_CASES", "240"))
DEVICE_CASES = int(os.environ.get("RNNCORE_KERNEL_FUZZ_DEVICE_CASES", "16"))
FIRST_SEED = int(os.environ.get("RNNCORE_KERNEL_FUZZ_SEED", "0"))
BLOCKS = 8
BOUNDED = ("SIGMOID", "TANH", "HARD_SIGMOID")


# The results' rounding to their storage type.
STORED = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11, BFLOAT16: 2.0**-8}


def rounding(dtype, inputs, device, gradients):
    """The arithmetic's relative rounding, as a perturbation of every input: float32's unit
    roundoff grown by the square root of the sums' length (the products with W and R sum
    I + H terms, and the weights' gradients T·N), each sum rounded; on the CPU bfloat16's
    where the fused kernels' products take the state rounded to it, and on Metal the
    storage type's, in which it stores the state each step (docs/api.md, "Arrays")."""
    if device != "cpu" and dtype in (np.float16, BFLOAT16):
        return 2.0**-11 if dtype == np.float16 else 2.0**-8
    if dtype == BFLOAT16:
        return 2.0**-9
    T, N = inputs["source"].shape[:2]
    H = inputs["recurrent_weight"].shape[-1]
    I = inputs["input_weight"].shape[-1] if "input_weight" in inputs else 0  # noqa: E741
    return 2.0**-24 * np.sqrt(H + I + (T * N if gradients else 0))


def pick(rng, items):
    return items[int(rng.integers(len(items)))]


def draw(seed, device="cpu"):
    """One case: (description, kind, inputs, descriptor, whether gradients, the cotangents'
    options, the thread count beside 1)."""
    rng = np.random.default_rng(seed)
    kind = pick(rng, ["rnn", "lstm", "lstm", "gru", "gru"])
    T = pick(rng, [5, 6, 7, 8, 9, 12, 17, 25, 40, 64, 101])
    N = pick(rng, [1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 31, 32, 33, 48, 65])
    wide = T * N < 2000 and device == "cpu"
    H = pick(rng, [16, 17, 32, 40, 48, 64, 80, 96, 100, 128, 160, 256] + [384, 512] * wide)
    I = pick(rng, [None, H, H // 2 + 1, 3, 64, 100, 256, 2 * H])  # noqa: E741
    # The float64 reference's loops short, and the Metal emulator's threadgroups few.
    while T > 5 and T * N * H * (H + (I or H)) > (4e7 if device == "cpu" else 4e6):
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
        f"{' gradients ' + str(cot) if gradients else ''} on {device}, 1 and {threads} threads"
    )
    return what, kind, inputs, make_descriptor(kind, **fields), gradients, cot, threads


def arrays(result):
    return {f: np.asarray(v) for f, v in zip(result._fields, result) if v is not None}


def moderate(*results):
    """Whether every value is finite and within 100 in magnitude: outside that, values that
    grow through identity or ReLU gates leave float16's range, or float32's."""
    return all(
        np.all(np.isfinite(v)) and np.abs(v).max(initial=0) <= 100
        for r in results
        for v in arrays(r).values()
    )


def float16_rounded_once(kind, inputs, desc, forward):
    """Messages for the fields of a float16 forward that are not the float32 operation on
    the widened arrays, rounded once."""
    widened = {k: v.astype(np.float32) for k, v in inputs.items()}
    wide = run(rnncore, kind, widened, desc, device="cpu")
    messages = []
    for f, v in arrays(wide).items():
        with np.errstate(over="ignore"):  # past float16's range: inf, as rounded
            rounded = v.astype(np.float16)
        differ = int((rounded.view(np.uint16) != arrays(forward)[f].view(np.uint16)).sum())
        if differ:
            messages.append(f"{f}: {differ} elements not the float32 op rounded once")
    return messages


def reference_results(kind, f64, desc, gradients, cot, forward=None):
    """The reference's forward and, with gradients, its gradients (from `forward`'s
    training state, by default its own)."""
    if not gradients:
        return [run(reference, kind, f64, desc)]
    own = training_forward(reference, kind, f64, desc)
    grads, _ = run_gradients(
        reference, kind, f64, desc, cot, forward=own if forward is None else forward
    )
    return [own, grads]


def sensitivity(kind, f64, desc, gradients, cot, unit, seed, base=None):
    """Per result and field, how far the reference's results move (relative) when every
    input and cotangent moves by `unit` (relative, at random): the problem's own
    conditioning at the rounding of the arithmetic. The larger of two draws. `base`: the
    reference's results on the inputs as they are, if at hand."""
    rng = np.random.default_rng(seed)
    if base is None:
        base = reference_results(kind, f64, desc, gradients, cot)
    moved = {}
    for _ in range(2):
        nudge = {k: v * (1 + unit * rng.uniform(-1, 1, np.shape(v))) for k, v in f64.items()}
        cot2 = {k: v * (1 + unit * rng.uniform(-1, 1, np.shape(v))) for k, v in cot.items()}
        for i, (r, b) in enumerate(
            zip(reference_results(kind, nudge, desc, gradients, cot2), base)
        ):
            for f, v in arrays(r).items():
                moved[i, f] = max(moved.get((i, f), 0.0), rel_err(v, arrays(b)[f]))
    return moved


def check(seed, device="cpu"):
    """The case's failures, as messages (empty: it passed)."""
    what, kind, inputs, desc, gradients, cot_options, threads = draw(seed, device)
    dtype = inputs["source"].dtype
    if not supported(device, dtype):  # bfloat16 on Metal before macOS 14
        return []
    cot = cotangents_like(np.random.default_rng(seed + 1), kind, inputs, **cot_options)
    runs = []
    try:
        for n in (1, threads):
            rnncore.set_num_threads(n)
            if gradients:
                runs.append(run_gradients(rnncore, kind, inputs, desc, cot, device=device))
            else:
                runs.append((run(rnncore, kind, inputs, desc, device=device),))
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
    if dtype == np.float16 and not gradients and device == "cpu":
        failures += float16_rounded_once(kind, inputs, desc, runs[0][0])
    # The reference's gradients from rnncore's training state: a pre-activation within
    # rounding of a kink (hard sigmoid, ReLU) then sits on the same side in both.
    mine = runs[0][::-1] if gradients else runs[0]  # forward first
    state = arrays(mine[0])
    f64, cot64 = as_float64(inputs), as_float64(cot)
    with np.errstate(all="ignore"):  # the reference may overflow: then nothing is compared
        forward = mine[0]._replace(**{f: v.astype(np.float64) for f, v in state.items()})
        expected = reference_results(kind, f64, desc, gradients, cot64, forward)
        if not moderate(*expected):
            return [f"{what}: {m}" for m in failures]
        unit = rounding(dtype, inputs, device, gradients)
        own = None if gradients else expected  # (gradients: from the reference's state)
        moved = sensitivity(kind, f64, desc, gradients, cot64, unit, seed, own)
    # On Metal, whose activations this machine cannot measure on a GPU, the contract's
    # tolerances bound it too.
    tols = [FORWARD_TOL[dtype], GRADIENT_TOL[dtype]] if device != "cpu" else [0.0, 0.0]
    for i, (actual, e) in enumerate(zip(mine, expected)):
        for f, want in arrays(e).items():
            got = arrays(actual).get(f)
            err = rel_err(got.astype(np.float64), want) if got is not None else np.inf
            bound = max(4 * (moved[i, f] + STORED[dtype] / 2), tols[i])
            if not err <= bound:
                failures.append(
                    f"{f}: relative error {err:.2e} > {bound:.1e} (the reference moves by "
                    f"{moved[i, f]:.1e} for inputs moved by {unit:.0e})"
                )
    return [f"{what}: {m}" for m in failures]


@pytest.mark.skipif("cpu" not in devices_under_test(), reason="RNNCORE_DEVICE names another")
@pytest.mark.parametrize("block", range(BLOCKS))
def test_random_calls_of_the_fused_kernels(block):
    seeds = range(FIRST_SEED + block, FIRST_SEED + CASES, BLOCKS)
    failures = [m for seed in seeds for m in check(seed)]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("device", [d for d in devices_under_test() if d != "cpu"])
def test_random_calls_on_metal(device):
    """The same draws, smaller (T·N·H·(H + I) at most 4e6), on the Metal emulator and on a
    Mac's GPU: the Metal kernels' threadgroups and tails at shapes their suites do not fix."""
    seeds = range(FIRST_SEED, FIRST_SEED + DEVICE_CASES)
    failures = [m for seed in seeds for m in check(seed, device)]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


if __name__ == "__main__":
    seed, device = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cpu"
    print(draw(seed, device)[0])
    print("\n".join(check(seed, device)) or "passed")

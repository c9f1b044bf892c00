"""float16 and bfloat16 storage on the CPU: every 16-bit array is widened to float32, the
float32 op runs (the fused forward reading R's 16-bit panels directly where the processor
converts), and the outputs are rounded once. So every output is bit-identical to the float32
op on the widened inputs, narrowed; with every option, forward and gradients, and on every
instruction-set variant of the fused kernels. (Accuracy against the float64 reference is in
the forward and gradient suites, which run both types.) bfloat16 arrays come as numpy arrays
of ml_dtypes.bfloat16 or as torch tensors (DLPack), and results are ml_dtypes.bfloat16.

The exception is bfloat16 on the avx512bf16 and avx512amx variants (processors with AVX-512
BF16, and AMX): their forward multiplies in bfloat16 pairs (vdpbf16ps, and AMX tiles from 4
batch rows on), so it is checked against the float32 op within a tolerance instead,
and bit for bit on the avx512 variant. Likewise bfloat16 gradients on the avx512amx
variant, whose GEMMs multiply tiles of their operands rounded to bfloat16."""

import ml_dtypes
import numpy as np
import pytest
from util import rel_err

import rnncore

NARROW = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]

G = {"single_gate_rnn": 1, "lstm": 4, "gru": 3}

# The fused kernels of this process (RNNCORE_ISA or the best the CPU runs).
KERNELS = rnncore.build_info()["kernels"]
BFLOAT16_DOT = KERNELS in ("avx512bf16", "avx512amx")


def inputs(op, rng, T, N, I, H, D, dtype=np.float16):  # noqa: E741
    g = G[op]
    a = {
        "source": rng.standard_normal((T, N, I)),
        "recurrent_weight": rng.standard_normal((D, g * H, H)) * 0.3,
        "input_weight": rng.standard_normal((D * g * H, I)) * 0.5,
        "bias": rng.standard_normal(D * g * H),
        "init_state": rng.standard_normal((N, D * H)),
        "mask": (rng.random((N, D * H)) > 0.3) * 1.0,
    }
    if op == "lstm":
        a["init_cell"] = rng.standard_normal((N, D * H))
        a["peephole"] = rng.standard_normal((D, 4 * H))
    if op == "gru":
        a["secondary_bias"] = rng.standard_normal(D * H)
    if D == 1:  # unidirectional: no direction axis
        a["recurrent_weight"] = a["recurrent_weight"][0]
        if "peephole" in a:
            a["peephole"] = a["peephole"][0]
    return {k: v.astype(dtype) for k, v in a.items()}


DESCRIPTORS = {
    "single_gate_rnn": dict(),
    "lstm": dict(produce_cell=True),
    "gru": dict(),
    "gru_reset_after": dict(reset_after=True, flip_z=True),
}


def descriptor(name, bidirectional):
    op = "gru" if name.startswith("gru") else name
    cls = {"single_gate_rnn": rnncore.RNNDescriptor, "lstm": rnncore.LSTMDescriptor,
           "gru": rnncore.GRUDescriptor}[op]  # fmt: skip
    return op, cls(bidirectional=bidirectional, training=True, **DESCRIPTORS[name])


def forward(op, desc, args):
    out = getattr(rnncore, op)(**args, descriptor=desc, device="cpu")
    return [a for a in out if a is not None]


@pytest.mark.parametrize("dtype", NARROW, ids=str)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_narrow_storage_is_the_float32_op_rounded_once(name, bidirectional, dtype):
    if BFLOAT16_DOT and dtype == np.dtype(ml_dtypes.bfloat16):
        pytest.skip("vdpbf16ps products: test_bfloat16_dot_products; bits on avx512 (subprocess)")
    op, desc = descriptor(name, bidirectional)
    D = 2 if bidirectional else 1  # noqa: N806
    # (batch 1 from 5 steps on: the fused kernels, float16 panels widened by halves or whole,
    # x' filled by the steps' threads from W's 16-bit panels; up to 4 steps: BLAS; N = 3: the
    # fused steps on 16-bit panels of R, N = 9: on float32 panels of R widened once)
    shapes = [
        (1, 1, 1, 1),
        (5, 3, 4, 33),
        (4, 1, 7, 31),
        (3, 9, 2, 40),
        (7, 1, 6, 33),
        (13, 1, 5, 64),
        (2, 1, 160, 256),  # few rows: BLAS halves by the columns of W and R
    ]
    if op != "single_gate_rnn":  # (whose 31 steps at H = 256 overflow float16)
        shapes.append((31, 1, 8, 256))  # R's products blocked along k as float32 panels are
    for T, N, I, H in shapes:  # noqa: E741
        half = inputs(op, np.random.default_rng(T + N + H), T, N, I, H, D, dtype)
        got = forward(op, desc, half)
        want = forward(op, desc, {k: v.astype(np.float32) for k, v in half.items()})
        assert len(got) == len(want) >= 2
        for a, b in zip(got, want):
            assert a.dtype == dtype
            np.testing.assert_array_equal(
                a.view(np.uint16), b.astype(dtype).view(np.uint16), err_msg=f"{T, N, I, H}"
            )


@pytest.mark.parametrize("panels", ["narrow", "wide"])
def test_float16_panels_of_r_narrow_or_widened_once(panels):
    """float16 R at few rows as 16-bit panels that the steps' tiles widen, or as float32
    panels widened once (AVX2's choice where each thread's share fits its L2): both
    forced in a fresh process, the same bits as the float32 operation's."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RNNCORE_F16_R=panels)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "rounded_once and float16"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
def test_every_fused_kernel_variant(isa):
    """The same on the other instruction-set variants (chosen once per process, so in a
    fresh one): AVX-512 and AVX2 read 16-bit panels (F16C; bfloat16 by a shift), the generic
    variant float32 ones."""
    if isa == KERNELS:
        pytest.skip(f"{isa} is this process's variant: tested above")
    import os
    import subprocess
    import sys

    env = dict(os.environ, RNNCORE_ISA=isa)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "rounded_once"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    probe = subprocess.run(
        [sys.executable, "-c", "import rnncore; print(rnncore.build_info()['kernels'])"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # A CPU without the set runs the best it has below it.
    assert probe.stdout.strip() in (isa, "avx512", "avx2", "generic")


@pytest.mark.parametrize("widen", ["halves", "whole"])
def test_float16_panels_widened_by_halves_or_whole(widen):
    """At batch 1 the 512-bit kernels widen float16 panels by two 256-bit conversions on AMD
    Zen 4 and by one 512-bit conversion elsewhere (RNNCORE_F16_WIDEN forces either, in a fresh
    process): the same FMAs, so both are the float32 op rounded once."""
    import os
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "rounded_once and float16"],
        env=dict(os.environ, RNNCORE_F16_WIDEN=widen), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


@pytest.mark.skipif(not BFLOAT16_DOT, reason="the avx512bf16 and avx512amx variants only")
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_bfloat16_dot_products(name, bidirectional, training):
    """bfloat16 forwards by vdpbf16ps: the input projection multiplies the bfloat16 arrays
    (exact products, float32 sums); the steps round h̃ to bfloat16 for the product in
    inference, and split it into two bfloat16 (16 bits) in a training forward. Against the
    float32 op on the same inputs rounded once: measured at most 6.5e-3 (inference) and
    2.4e-3 (training) of each output's largest value; float16 is unaffected (bit for bit,
    above). Odd I and H pad the pairs with zero. N of 4 and more run on AMX tiles on the
    avx512amx variant (rows past a multiple of 16 by tiles of fewer rows, pairs of k past
    one by vdpbf16ps): measured the same 6.1e-3. An LSTM of 16 rows or more with an even I
    multiplies each step's source rows (read in place as pairs) by W's pair panels in the
    step, instead of a projection beforehand (N = 17 and 32 here; I = 5 and 33 do not)."""
    op, desc = descriptor(name, bidirectional)
    desc.training = training
    tol = 1.3e-2 if not training else 5e-3
    D = 2 if bidirectional else 1  # noqa: N806
    shapes = [(1, 1, 1, 1), (5, 3, 4, 33), (4, 1, 7, 31), (3, 9, 2, 40)]
    shapes += [(3, 17, 70, 33), (2, 32, 32, 64), (2, 48, 5, 40), (1, 16, 33, 17), (2, 5, 40, 64)]
    for T, N, I, H in shapes:  # noqa: E741
        half = inputs(op, np.random.default_rng(T + N + H), T, N, I, H, D, ml_dtypes.bfloat16)
        got = forward(op, desc, half)
        want = forward(op, desc, {k: v.astype(np.float32) for k, v in half.items()})
        assert len(got) == len(want) >= 1
        for a, b in zip(got, want):
            assert a.dtype == ml_dtypes.bfloat16
            err = np.abs(a.astype(np.float32) - b.astype(ml_dtypes.bfloat16).astype(np.float32))
            assert err.max() <= tol * max(np.abs(b).max(), 1e-30), (T, N, I, H, err.max())


@pytest.mark.skipif(not BFLOAT16_DOT, reason="the vdpbf16ps variants only")
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_bfloat16_few_rows_multiply_as_the_fused_kernels_do(name, training):
    """A bfloat16 call of a few rows in all (T <= 4 and T·N <= 16) reads R and W as stored,
    a step at a time, in the fused kernels' arithmetic (h̃ rounded to bfloat16 for the product
    in inference, split in two in a training forward; exact products, float32 sums). Its
    outputs against the first steps of a 9-step call (the fused kernels) on the same inputs:
    only the order of the float32 sums differs (the few rows' lanes of pairs and their tree,
    the fused kernels' pairs in k order), so outputs differ rarely, by a unit or so in the last
    place (measured: at most 0.4% of them, by up to 4 units, in a training state near zero);
    with h̃ left in float32 for the product in inference, 4-18% of them differ."""
    op, desc = descriptor(name, False)
    desc.training = training
    for T, N, I, H in [(2, 1, 160, 256), (4, 1, 33, 31), (3, 4, 64, 64), (1, 8, 256, 256)]:  # noqa: E741
        long = inputs(op, np.random.default_rng(T + N + H), 9, N, I, H, 1, ml_dtypes.bfloat16)
        got = forward(op, desc, dict(long, source=long["source"][:T]))
        want = forward(op, desc, long)
        for a, b in zip(got, want):
            a, b = a.astype(np.float32), b[:T].astype(np.float32)
            ulp = np.spacing(np.abs(b).astype(ml_dtypes.bfloat16)).astype(np.float32)
            ulps = np.abs(a - b) / ulp
            assert ulps.max() <= 4 and (ulps > 0).mean() <= 0.01, (T, N, H, ulps.max())


@pytest.mark.skipif(not BFLOAT16_DOT, reason="the vdpbf16ps variants only")
def test_bfloat16_lstm_inference_writes_its_outputs_in_bfloat16():
    """A bfloat16 LSTM inference on pairs with an even H writes its state and cell outputs in
    bfloat16 in the steps, and an unmasked step takes the previous step's output rows as its
    product's pairs: the same bits as with a mask of ones (whose h̃ the step rounds from
    float32), with and without the cell output, reverse and bidirectional, with NaN and
    infinities (a ReLU cell) in the state."""
    for T, N, I, H in [(1, 1, 3, 2), (4, 5, 7, 48), (3, 32, 64, 64), (2, 33, 10, 34)]:  # noqa: E741
        for bidirectional, reverse in [(False, False), (False, True), (True, False)]:
            D = 2 if bidirectional else 1  # noqa: N806
            rng = np.random.default_rng(T + N + H)
            a = inputs("lstm", rng, T, N, I, H, D, ml_dtypes.bfloat16)
            a["source"][0, 0, :] = np.inf
            if N > 2:
                a["source"][0, 2, 0] = np.nan
            ones = np.ones_like(a.pop("mask"))
            for relu in (False, True):
                kw = dict(bidirectional=bidirectional, reverse=reverse)
                if relu:
                    kw["cell_gate_activation"] = rnncore.Activation.RELU
                runs = []
                for mask, cell in [(None, True), (ones, True), (None, False)]:
                    desc = rnncore.LSTMDescriptor(produce_cell=cell, **kw)
                    out = rnncore.lstm(**a, mask=mask, descriptor=desc, device="cpu")
                    runs.append([np.asarray(x).view(np.uint16) for x in out if x is not None])
                shape = (T, N, I, H, bidirectional, reverse, relu)
                for got in runs[1:]:
                    for x, y in zip(got, runs[0]):
                        np.testing.assert_array_equal(x, y, err_msg=str(shape))
                assert np.isnan(runs[0][0].view(ml_dtypes.bfloat16).astype(np.float32)).any()


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), *NARROW], ids=str)
def test_projecting_in_the_steps_gives_the_same_bits_at_every_thread_count(dtype, name):
    """From 16 batch rows the forward projects each step's rows in the step (float32 tiles,
    or the LSTM's bfloat16 pairs), and at batch 1 blocks of rows ahead of the steps: each
    unit's sums are the same whichever thread runs it, and whether a thread waiting for a
    step computed that part of the next one ahead."""
    rng = np.random.default_rng(11)
    cases = [(5, 32, 20, 33, True), (4, 17, 6, 31, False), (40, 16, 8, 96, False)]
    # At batch 1 the LSTM and the reset-after GRU fill x' by blocks of rows, whichever
    # thread gets there first (forward and reversed in time).
    cases += [(31, 1, 8, 256, False), (9, 1, 6, 256, True)]
    for T, N, I, H, bidirectional in cases:  # noqa: E741
        op, desc = descriptor(name, bidirectional)
        args = inputs(op, rng, T, N, I, H, 2 if bidirectional else 1, dtype)
        runs = []
        try:
            for threads in (1, 2, 3, 8):
                rnncore.set_num_threads(threads)
                runs.append([np.asarray(a).tobytes() for a in forward(op, desc, args)])
        finally:
            rnncore.set_num_threads(0)
        assert all(r == runs[0] for r in runs[1:]), (T, N, I, H, bidirectional)


# A bfloat16 LSTM inference at batch 1, x' filled by the steps, every option that keeps the
# one-row path: blocks of 4 rows (a short one last, or first in reverse), I below, equal to
# and above H (pairs carried after the row's product; with I = 2 a block a slice), H from one
# panel to 16.
CARRY = """
import hashlib, os
import ml_dtypes
import numpy as np
import rnncore
from test_narrow_storage_cpu import inputs
h = hashlib.sha256()
for threads in (1, 2, 3):
    rnncore.set_num_threads(threads)
    for T, I, H in [(1, 8, 16), (4, 6, 32), (5, 256, 256), (9, 512, 64), (13, 34, 48),
                    (31, 8, 256), (40, 96, 32), (11, 2, 256)]:
        for kw in [{}, dict(reverse=True), dict(bidirectional=True), dict(produce_cell=True)]:
            D = 2 if kw.get("bidirectional") else 1
            a = inputs("lstm", np.random.default_rng(T + I + H), T, 1, I, H, D, ml_dtypes.bfloat16)
            a.pop("mask"); a.pop("peephole")
            for extra in [{}, {"mask": np.ones((1, D * H), ml_dtypes.bfloat16)}]:
                desc = rnncore.LSTMDescriptor(**kw)
                out = rnncore.lstm(**a, **extra, descriptor=desc, device="cpu")
                for x in out:
                    if x is not None:
                        h.update(np.ascontiguousarray(x).tobytes())
print(h.hexdigest())
"""


@pytest.mark.skipif(not BFLOAT16_DOT, reason="the vdpbf16ps variants only")
def test_blocks_carried_by_the_steps_or_made_beside_them_give_the_same_bits():
    """At batch 1 a bfloat16 LSTM inference on vdpbf16ps sums its blocks of x' in the steps'
    products with R (pairs of k carried after the row's, FusedOps::carry_rows), or, with
    RNNCORE_CARRY=0, by blocks of the same rows made before the steps that read them: the same
    sums, so the same bits, at every thread count, reversed and bidirectional."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    digests = []
    for carry in ("1", "0"):
        path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "RNNCORE_CARRY": carry, "PYTHONPATH": path}
        run = subprocess.run([sys.executable, "-c", CARRY], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        digests.append(run.stdout.strip())
    assert digests[0] == digests[1] and len(digests[0]) == 64


def gradients_both_ways(name, bidirectional, shape, dtype, rng):
    """The gradient op on 16-bit arrays, and the float32 one on the same arrays widened."""
    op, desc = descriptor(name, bidirectional)
    half = inputs(op, rng, *shape, 2 if bidirectional else 1, dtype)
    fwd = getattr(rnncore, op)(**half, descriptor=desc, device="cpu")
    g = dict(half, z_state=fwd.z_state)
    g["source_gradient"] = rng.standard_normal(fwd.state.shape).astype(dtype)
    if op == "gru":
        g["output_fwd"] = fwd.state
    if op == "lstm":
        g["cell_output_fwd"] = fwd.cell
    got = getattr(rnncore, op + "_gradients")(**g, descriptor=desc, device="cpu")
    wide = {k: v.astype(np.float32) for k, v in g.items()}
    want = getattr(rnncore, op + "_gradients")(**wide, descriptor=desc, device="cpu")
    return [(a, b) for a, b in zip(got, want) if a is not None]


@pytest.mark.parametrize("dtype", NARROW, ids=str)
def test_gradients_are_the_float32_gradients_rounded_once(dtype):
    """The gradient op on 16-bit arrays: the float32 gradient op on the widened arrays, each
    output rounded once. Also where the products of a few rows read R and W in 16 bits as
    stored (batch 1, and at most 16 rows in all, against an R or a W of 64k elements: every
    cell at H = 256, the LSTM's and the reset-after GRU's R and every W at H = 150)."""
    if BFLOAT16_DOT and dtype == np.dtype(ml_dtypes.bfloat16):
        pytest.skip("bfloat16 gradient GEMMs: test_bfloat16_gradient_gemms_round_their_operands")
    rng = np.random.default_rng(3)
    for name in sorted(DESCRIPTORS):
        for shape in [(6, 3, 5, 17), (2, 1, 160, 256), (3, 4, 300, 150)]:
            for a, b in gradients_both_ways(name, True, shape, dtype, rng):
                assert a.dtype == dtype
                np.testing.assert_array_equal(
                    a.view(np.uint16), b.astype(dtype).view(np.uint16), err_msg=f"{name} {shape}"
                )


@pytest.mark.skipif(not BFLOAT16_DOT, reason="the AVX-512 BF16 variants only")
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_bfloat16_gradient_gemms_round_their_operands(name, bidirectional):
    """bfloat16 gradients with AVX-512 BF16: the GEMMs of dX, dW and dR multiply their
    operands rounded to bfloat16 (the gate gradients dX' and the state h̃; float32 sums), on
    AMX tiles or by vdpbf16ps; on AMX each backward step's product with R splits dX' into
    bfloat16 hi + lo (elsewhere it is the float32 product). Against the
    float32 gradient op on the same arrays, past half a bfloat16 ulp of each output: at most
    5e-3 of the output's largest value (measured 3.3e-3), and 2e-2 at T = N = I = H = 1,
    whose source gradient is a sum of 4 terms that cancel (measured 1.3e-2); and not the
    float32 op rounded once. Shapes with whole 32-blocks, ragged edges and (T·N = 8320) K in
    chunks (the resident operand's chunk fills half of L2: two chunks of dW and dR at 2 MiB,
    more below), and T·N <= 32 rows at a layer's size, whose GEMMs are float32 FMAs on the
    rounded operands (the kernels of few rows and short sums). Against the float64
    reference: test_gradients_reference."""
    rng = np.random.default_rng(8)
    shapes = [(6, 3, 5, 17), (1, 1, 1, 1), (4, 16, 64, 32), (3, 17, 70, 33), (130, 64, 5, 17)]
    shapes += [(1, 8, 230, 150), (4, 4, 230, 150)]
    rounded = 0.0
    for shape in shapes:
        tol = 2e-2 if shape == (1, 1, 1, 1) else 5e-3
        for a, b in gradients_both_ways(name, bidirectional, shape, ml_dtypes.bfloat16, rng):
            assert a.dtype == ml_dtypes.bfloat16
            half_ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(b), 1e-38))) - 8)
            excess = np.maximum(0, np.abs(a.astype(np.float32) - b) - half_ulp)
            assert excess.max() <= tol * np.abs(b).max(), (shape, excess.max())
            rounded = max(rounded, excess.max() / max(np.abs(b).max(), 1e-30))
    assert rounded > 1e-4


@pytest.mark.parametrize("T, N", [(2, 3), (4, 40)], ids=["few rows", "fused"])
def test_bfloat16_subnormals(T, N):  # noqa: N803
    """vdpbf16ps and AMX's tdpbf16ps take subnormal bfloat16 operands (below 2^-126) as zero
    and flush subnormal results, as oneDNN's bfloat16 layers do: on the AVX-512 BF16 variants
    a forward of subnormal inputs gives zeros, and so does the input weight's gradient (its
    GEMM's x operand) past 32 rows in T·N. Elsewhere the float32 op keeps them: its bits,
    rounded once."""
    bf = ml_dtypes.bfloat16
    I, H = 32, 16  # noqa: E741, N806
    desc = rnncore.RNNDescriptor(activation=rnncore.Activation.TANH, training=True)
    x = np.full((T, N, I), 2e-39).astype(bf)  # subnormal: 2e-39 < 2^-126
    W = np.ones((H, I)).astype(bf)  # noqa: N806
    R = np.eye(H).astype(bf)  # noqa: N806
    dy = np.ones((T, N, H)).astype(bf)

    def both(a, *w):
        out = rnncore.single_gate_rnn(a, w[1], input_weight=w[0], descriptor=desc)
        g = rnncore.single_gate_rnn_gradients(
            a, w[1], dy.astype(a.dtype), out.z_state, input_weight=w[0], descriptor=desc
        )
        return out.state, g.input_weight

    y, dW = both(x, W, R)  # noqa: N806
    y32, dW32 = both(x.astype(np.float32), W.astype(np.float32), R.astype(np.float32))  # noqa: N806
    assert y32.min() > 0 and dW32.min() > 0
    if BFLOAT16_DOT:
        assert not y.astype(np.float32).any()
        if T * N > 32:
            assert not dW.astype(np.float32).any()
    else:
        np.testing.assert_array_equal(y.view(np.uint16), y32.astype(bf).view(np.uint16))
        np.testing.assert_array_equal(dW.view(np.uint16), dW32.astype(bf).view(np.uint16))


@pytest.mark.parametrize("N", [1, 32])
def test_bfloat16_outputs_round_subnormal_values_as_numbers(N):  # noqa: N803
    """Outputs written in bfloat16 by the kernels themselves (an LSTM on pairs: state, cell and
    training state) round a subnormal float32 as any other number, as the float32 op rounded
    once does (vcvtneps2bf16, which they use elsewhere, would take it as zero): zero weights,
    so the training state is the bias, subnormal in most lanes."""
    bf = ml_dtypes.bfloat16
    rng = np.random.default_rng(3)
    T, I, H = 3, 8, 32  # noqa: N806, E741
    bias = rng.standard_normal(4 * H) * 1e-39
    bias[::7] = rng.standard_normal(len(bias[::7]))  # and some normal ones beside them
    args = dict(
        source=rng.standard_normal((T, N, I)),
        recurrent_weight=np.zeros((4 * H, H)),
        input_weight=np.zeros((4 * H, I)),
        bias=bias,
        init_state=np.zeros((N, H)),
        init_cell=np.zeros((N, H)),
    )
    half = {k: v.astype(bf) for k, v in args.items()}
    desc = rnncore.LSTMDescriptor(training=True, produce_cell=True)
    got = rnncore.lstm(**half, descriptor=desc)
    want = rnncore.lstm(**{k: v.astype(np.float32) for k, v in half.items()}, descriptor=desc)
    sub = np.abs(want.z_state) < 2.0**-126
    assert (sub & (want.z_state != 0)).mean() > 0.5 and (want.state != 0).any()
    for name in ("z_state", "state", "cell"):
        a, b = getattr(got, name), getattr(want, name).astype(bf)
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16), err_msg=name)


def test_bfloat16_torch_tensors_and_strided_views():
    """bfloat16 from torch (DLPack) and a strided numpy view: the same result as the C-order
    numpy array; the result is an ml_dtypes.bfloat16 numpy array."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    a = inputs("gru", rng, 4, 3, 5, 8, 1, ml_dtypes.bfloat16)
    want = rnncore.gru(**a).state
    assert want.dtype == ml_dtypes.bfloat16
    t = {k: torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
         for k, v in a.items()}  # fmt: skip
    got = rnncore.gru(**t).state
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    wide = np.zeros((4, 3, 10), ml_dtypes.bfloat16)
    wide[:, :, ::2] = a["source"]
    got = rnncore.gru(**dict(a, source=wide[:, :, ::2])).state
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_bfloat16_on_the_emulator_is_the_cpu_storage():
    """The Metal kernels' bfloat16 storage (MSL 3.1's bfloat, here the emulator's) rounds as
    the CPU's does: a GRU's results on both devices within bfloat16's tolerance of each other,
    and in bfloat16."""
    if "metal-emulated" not in rnncore.devices():
        pytest.skip("no Metal device in this build")
    a = inputs("gru", np.random.default_rng(5), 6, 3, 5, 33, 1, ml_dtypes.bfloat16)
    cpu = rnncore.gru(**a, device="cpu").state
    emu = rnncore.gru(**a, device="metal-emulated").state
    assert emu.dtype == ml_dtypes.bfloat16
    assert rel_err(emu.astype(np.float64), cpu.astype(np.float64)) < 2**-7


def test_mixed_storage_types_are_refused():
    a = inputs("gru", np.random.default_rng(6), 2, 1, 3, 4, 1, ml_dtypes.bfloat16)
    a["recurrent_weight"] = a["recurrent_weight"].astype(np.float16)
    with pytest.raises(TypeError, match="recurrent_weight"):
        rnncore.gru(**a)


BESIDE_TORCH = """
import sys
import ml_dtypes, numpy as np, torch
sys.path.insert(0, {tests!r})
import rnncore
from util import rel_err
from test_narrow_storage_cpu import descriptor, inputs

torch.set_num_threads(2)
op, desc = descriptor("lstm", False)
a = inputs(op, np.random.default_rng(11), 5, 32, 48, 64, 1, ml_dtypes.bfloat16)

def ours():
    fwd = rnncore.lstm(**a, descriptor=desc, device="cpu")
    g = dict(a, z_state=fwd.z_state, cell_output_fwd=fwd.cell,
             source_gradient=np.ones_like(fwd.state))
    grads = rnncore.lstm_gradients(**g, descriptor=desc, device="cpu")
    return [np.asarray(x).view(np.uint16).copy() for x in (*fwd, *grads) if x is not None]

def theirs():
    m = torch.nn.LSTM(48, 64).to(torch.bfloat16)
    x = torch.randn(5, 32, 48, dtype=torch.bfloat16, requires_grad=True)
    y, _ = m(x)
    y.sum().backward()

want = ours()
theirs()
got = ours()
assert all(np.array_equal(u, v) for u, v in zip(got, want))
print("same")
"""


def test_bfloat16_beside_pytorch():
    """PyTorch's bfloat16 layers (oneDNN: AMX tiles where the processor has them) configure
    and release the tiles on threads rnncore uses too; rnncore's results are the same bits
    before and after them (a tile configuration remembered instead of read once raised
    SIGILL here). In a subprocess: a crash fails the test, not the run."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys

    code = BESIDE_TORCH.format(tests=os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "same" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]

"""``python -m rnncore check``: every operation against the float64 numpy reference.

It runs every operation on every available device (or the ``--device`` ones) over a
sweep of descriptor options and awkward sizes, in float32 and, where the device computes
them, float64 (the CPU), float16 (the CPU and Metal devices) and bfloat16 (the CPU, and
Metal from macOS 14), compares each result with
``rnncore.reference`` and prints one row per operation x device x dtype: cases run, cases
failed, the worst relative error ``||actual - reference|| / ||reference||`` over all
outputs, and the tolerance. It exits with status 1 if anything failed.

The operations, descriptor fields and activations come from ``rnncore._ops`` and the
binding: a new descriptor option or activation is swept without a change here.
"""

import itertools
import sys
import time
from typing import NamedTuple, Optional

import ml_dtypes
import numpy as np

import rnncore
from rnncore import reference
from rnncore._ops import KINDS, activation_fields, flag_fields, rel_err

# The contract's tolerances (relative to the reference's norm). float16 and bfloat16 are
# storage types (float32 arithmetic): 1e-2 and 5e-2.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FORWARD_TOL = {
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.float16): 1e-2,
    BFLOAT16: 5e-2,
}
GRADIENT_TOL = {
    np.dtype(np.float32): 1e-4,
    np.dtype(np.float64): 1e-10,
    np.dtype(np.float16): 1e-2,
    BFLOAT16: 5e-2,
}
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BFLOAT16)

# ---- what each layer kind has (from _ops and the binding) ----------------------------------


def descriptor_class(kind):
    return getattr(rnncore, KINDS[kind].descriptor)


FLAGS = {kind: flag_fields(descriptor_class(kind)) for kind in KINDS}
ACTIVATION_FIELDS = {kind: activation_fields(descriptor_class(kind)) for kind in KINDS}
ACTIVATIONS = tuple(rnncore.Activation)  # in value order
# Unbounded activations (see make_case) and the two --quick tries on every gate.
UNBOUNDED = (int(rnncore.Activation.NONE), int(rnncore.Activation.RELU))
QUICK_ACTIVATIONS = (int(rnncore.Activation.RELU), int(rnncore.Activation.HARD_SIGMOID))
MASK_FORMS = (None, "scalar", "dh", "1dh", "n1", "ndh")


class Op(NamedTuple):
    name: str  # the function's name in rnncore and rnncore.reference
    kind: str  # rnn, lstm or gru
    gradient: bool


# Every forward op, then every gradient op.
OPS = tuple(Op(k.forward, name, False) for name, k in KINDS.items()) + tuple(
    Op(k.gradients, name, True) for name, k in KINDS.items()
)


# ---- the sweep -------------------------------------------------------------------------------


class Case(NamedTuple):
    kind: str
    T: int
    N: int
    I: Optional[int]  # noqa: E741 (None: no input weight)
    H: int
    fields: dict  # descriptor fields (activations as ints)
    bias: bool
    init_state: bool
    init_cell: bool
    mask: Optional[str]
    peephole: bool
    secondary_bias: bool
    state_gradient: bool
    cell_gradient: Optional[str]  # None, "final" ([N, D*H]) or "steps" ([T, N, D*H])
    seed: int

    def describe(self):
        opts = [f"T={self.T} N={self.N} I={self.I} H={self.H}"]
        opts += [k for k, v in self.fields.items() if v is True]
        opts += [
            f"{k}={ACTIVATIONS[v].name}"
            for k, v in self.fields.items()
            if not isinstance(v, bool) and v != default_activation(self.kind, k)
        ]
        for name in ("bias", "init_state", "init_cell", "peephole", "secondary_bias"):
            if getattr(self, name):
                opts.append(name)
        if self.mask:
            opts.append(f"mask={self.mask}")
        if self.state_gradient:
            opts.append("state_gradient")
        if self.cell_gradient:
            opts.append(f"cell_gradient={self.cell_gradient}")
        return " ".join(opts)


def default_activation(kind, field):
    return int(getattr(descriptor_class(kind)(), field))


# (T, N, I, H): T = 1, N = 1, H in {1, 31, 32, 33}, I != H; I = None: no input weight.
SIZES = (
    (3, 2, 5, 4),
    (1, 3, 4, 1),
    (2, 1, 7, 31),
    (3, 2, 16, 32),
    (2, 3, 20, 33),
    (1, 1, 3, 2),
    (4, 2, None, 3),
    (2, 2, None, 33),
    (5, 3, 1, 6),
    (12, 3, 10, 8),
    (3, 5, 40, 65),
)
RANDOM_CASES = 60  # per kind, on top of the systematic ones (none with --quick)


def make_case(kind, seed, size=None, fields=None):
    """A case with the given size and descriptor fields, and random everything else."""
    r = np.random.default_rng(seed)
    T, N, I, H = size if size is not None else SIZES[r.integers(len(SIZES))]  # noqa: E741
    all_fields = {f: bool(r.integers(2)) for f in FLAGS[kind]}
    for f in ACTIVATION_FIELDS[kind]:
        # Mostly the default, sometimes any activation.
        default = default_activation(kind, f)
        all_fields[f] = int(r.integers(len(ACTIVATIONS))) if r.random() < 0.35 else default
    all_fields.update(fields or {})
    if T > 5:
        # Unbounded gates (none, relu) make long recurrences blow up (a GRU update gate
        # of 1.5 multiplies h by 1.5 per step): keep them to short sequences.
        for f in ACTIVATION_FIELDS[kind]:
            if all_fields[f] in UNBOUNDED and f != "activation":
                all_fields[f] = default_activation(kind, f)
    return Case(
        kind=kind,
        T=T,
        N=N,
        I=I,
        H=H,
        fields=all_fields,
        bias=bool(r.integers(2)),
        init_state=bool(r.integers(2)),
        init_cell=kind == "lstm" and bool(r.integers(2)),
        mask=MASK_FORMS[r.integers(len(MASK_FORMS))],
        peephole=kind == "lstm" and bool(r.integers(2)),
        secondary_bias=kind == "gru" and bool(r.integers(2)),
        state_gradient=bool(r.integers(2)),
        cell_gradient=(None, "final", "steps")[r.integers(3)] if kind == "lstm" else None,
        seed=seed,
    )


def sweep(kind, quick=False):
    """Every combination of the kind's flags (a subset with quick), every size, and every
    activation on every gate; the other options drawn at random per case."""
    cases = []
    seed = 1000 * (1 + list(KINDS).index(kind))  # rnn 1000, lstm 2000, gru 3000
    combos = list(itertools.product((False, True), repeat=len(FLAGS[kind])))
    if quick:
        combos = combos[:: max(1, len(combos) // 6)]
    for i, combo in enumerate(combos):
        size = SIZES[i % len(SIZES)]
        cases.append(make_case(kind, seed + i, size, dict(zip(FLAGS[kind], combo))))
    seed += len(combos)
    for i, size in enumerate(SIZES[:4] if quick else SIZES):
        cases.append(make_case(kind, seed + i, size))
    seed += len(SIZES)
    for field in ACTIVATION_FIELDS[kind]:
        values = QUICK_ACTIVATIONS if quick else range(len(ACTIVATIONS))
        for act in values:
            cases.append(make_case(kind, seed, fields={field: act}))
            seed += 1
    for i in range(0 if quick else RANDOM_CASES):
        cases.append(make_case(kind, seed + i))
    return cases


# ---- inputs ------------------------------------------------------------------------------------


def mask_shape(form, N, DH):
    return {"scalar": (), "dh": (DH,), "1dh": (1, DH), "n1": (N, 1), "ndh": (N, DH)}[form]


def make_inputs(case, dtype):
    """Forward inputs of `case` as `dtype` arrays (keyword arguments of the forward op)."""
    r = np.random.default_rng(case.seed)
    D = 2 if case.fields["bidirectional"] else 1
    G, H, T, N = KINDS[case.kind].gates, case.H, case.T, case.N
    GH, DH = G * H, D * H

    def normal(shape, scale):
        return (r.standard_normal(shape) * scale).astype(dtype)

    args = {"source": normal((T, N, D * GH if case.I is None else case.I), 1.0)}
    args["recurrent_weight"] = normal((2, GH, H) if D == 2 else (GH, H), 0.8 / np.sqrt(H))
    if case.I is not None:
        args["input_weight"] = normal((D * GH, case.I), 1.0 / np.sqrt(case.I))
    if case.bias:
        args["bias"] = normal((D * GH,), 0.5)
    if case.init_state:
        args["init_state"] = normal((N, DH), 0.7)
    if case.init_cell:
        args["init_cell"] = normal((N, DH), 1.0)
    if case.mask is not None:
        shape = mask_shape(case.mask, N, DH)
        values = np.where(r.random(shape) < 0.25, 0.0, r.uniform(0.5, 1.5, shape))
        args["mask"] = np.asarray(values, dtype=dtype)
    if case.peephole:
        args["peephole"] = normal((2, 4 * H) if D == 2 else (4 * H,), 0.5)
    if case.secondary_bias:
        args["secondary_bias"] = normal((DH,), 0.5)
    return args


def descriptor(case, **override):
    fields = dict(case.fields, **override)
    return descriptor_class(case.kind)(**fields)


def as64(args):
    return {k: np.asarray(v, dtype=np.float64) for k, v in args.items()}


# ---- running one case ------------------------------------------------------------------------

FORWARD_REQUIRED = ("source", "recurrent_weight")


def call(fn, required, args, desc, **kwargs):
    """Call `fn` with the `required` arguments positionally and the rest by keyword."""
    positional = [args[k] for k in required]
    rest = {k: v for k, v in args.items() if k not in required}
    return fn(*positional, **rest, descriptor=desc, **kwargs)


def forward_pair(op, case, dtype, device):
    """(rnncore's result, the reference's result) of the forward `op` on `case`."""
    args = make_inputs(case, dtype)
    desc = descriptor(case)
    actual = call(getattr(rnncore, op.name), FORWARD_REQUIRED, args, desc, device=device)
    expected = call(getattr(reference, op.name), FORWARD_REQUIRED, as64(args), desc)
    return actual, expected


def gradient_pair(op, case, dtype, device):
    """(rnncore's result, the reference's result) of the gradient `op` on `case`.

    The training state and forward outputs come from the reference's forward pass on the
    same (rounded) inputs, rounded to `dtype`; both sides get exactly the same values.
    """
    args = make_inputs(case, dtype)
    kind = case.kind
    fwd = getattr(reference, KINDS[kind].forward)
    desc = descriptor(case, training=True)
    y = call(fwd, FORWARD_REQUIRED, as64(args), desc)
    r = np.random.default_rng(case.seed + 1)
    T, N, DH = y.state.shape
    args["source_gradient"] = r.standard_normal((T, N, DH)).astype(dtype)
    args["z_state"] = y.z_state.astype(dtype)
    if kind == "lstm":
        args["cell_output_fwd"] = y.cell.astype(dtype)
    if kind == "gru":
        args["output_fwd"] = y.state.astype(dtype)
    if case.state_gradient:
        args["state_gradient"] = r.standard_normal((N, DH)).astype(dtype)
    if case.cell_gradient == "final":
        args["cell_gradient"] = r.standard_normal((N, DH)).astype(dtype)
    elif case.cell_gradient == "steps":
        args["cell_gradient"] = r.standard_normal((T, N, DH)).astype(dtype)
    required = KINDS[kind].gradient_required
    desc = descriptor(case)  # the training field is ignored by gradient ops
    actual = call(getattr(rnncore, op.name), required, args, desc, device=device)
    expected = call(getattr(reference, op.name), required, as64(args), desc)
    return actual, expected


RUNNERS = {False: forward_pair, True: gradient_pair}


def compare(actual, expected, dtype):
    """(worst relative error, the field it is in, problem or None) over every field."""
    worst, worst_field = 0.0, None
    for field in expected._fields:
        a, e = getattr(actual, field), getattr(expected, field)
        if e is None or a is None:
            if a is not None or e is not None:
                got = "None" if a is None else "an array"
                want = "None" if e is None else "an array"
                return worst, field, f"{field} is {got}, expected {want}"
            continue
        if not isinstance(a, np.ndarray):
            return worst, field, f"{field} is a {type(a).__name__}, not a numpy array"
        if a.shape != e.shape:
            return worst, field, f"{field} has shape {a.shape}, expected {e.shape}"
        if a.dtype != dtype:
            return worst, field, f"{field} has dtype {a.dtype}, expected {dtype}"
        if not np.all(np.isfinite(a)):
            return worst, field, f"{field} has non-finite values"
        err = rel_err(a, e)
        if worst_field is None or err > worst:
            worst, worst_field = err, field
    return worst, worst_field, None


class Row(NamedTuple):
    op: str
    device: str
    dtype: str
    cases: int
    failed: int
    worst: float
    tol: float
    note: str


def check_row(op, cases, device, dtype, failures):
    tol = (GRADIENT_TOL if op.gradient else FORWARD_TOL)[dtype]
    runner = RUNNERS[op.gradient]
    failed, worst = 0, 0.0
    with np.errstate(all="ignore"):
        for case in cases:
            try:
                actual, expected = runner(op, case, dtype, device)
                err, field, problem = compare(actual, expected, dtype)
            except Exception as e:  # noqa: BLE001 (any exception is a failed case)
                err, problem = float("nan"), f"{type(e).__name__}: {e}"
            if problem is None and err > tol:
                problem = f"{field}: relative error {err:.2e} > {tol:.0e}"
            if np.isfinite(err):
                worst = max(worst, err)
            if problem is not None:
                failed += 1
                failures.append(f"{op.name} {device} {dtype.name} [{case.describe()}]: {problem}")
    return Row(op.name, device, dtype.name, len(cases), failed, worst, tol, "")


def dtype_support(device, dtype):
    """None if `device` computes `dtype`, else the reason it does not."""
    x = np.zeros((1, 1, 1), dtype=dtype)
    r = np.zeros((1, 1), dtype=dtype)
    try:
        rnncore.single_gate_rnn(x, r, device=device)
    except (TypeError, RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def print_table(rows):
    header = ("operation", "device", "dtype", "cases", "failed", "worst err", "tolerance", "")
    table = [header]
    for r in rows:
        if r.cases == 0:
            table.append((r.op, r.device, r.dtype, "-", "-", "-", "-", r.note))
            continue
        status = "ok" if r.failed == 0 else "FAIL"
        table.append(
            (
                r.op,
                r.device,
                r.dtype,
                str(r.cases),
                str(r.failed),
                f"{r.worst:.2e}",
                f"{r.tol:.0e}",
                status + (f" ({r.note})" if r.note else ""),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {3, 4, 5, 6}
    for row in table:
        cells = [
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)
        ]
        print("  ".join(cells).rstrip())


def run(args):
    start = time.perf_counter()
    devices = args.device or list(rnncore.devices())
    ops = list(OPS)
    if args.ops:
        unknown = set(args.ops) - {op.name for op in OPS}
        if unknown:
            print(f"unknown operation(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        ops = [op for op in ops if op.name in args.ops]
    cases = {kind: sweep(kind, args.quick) for kind in KINDS}

    print(f"rnncore {rnncore.__version__}: checking against rnncore.reference (float64 numpy)")
    print(f"devices: {', '.join(devices)}; {'quick' if args.quick else 'full'} sweep")
    print()

    rows, failures, broken = [], [], False
    for device in devices:
        for dtype in DTYPES:
            reason = dtype_support(device, dtype)
            if reason is not None:
                # float64 and bfloat16 are optional off the CPU; anything else is a failure.
                optional = (
                    "TypeError" in reason and dtype in (np.float64, BFLOAT16) and device != "cpu"
                )
                broken = broken or not optional
                for op in ops:
                    note = "unsupported" if optional else "ERROR: " + reason
                    rows.append(Row(op.name, device, dtype.name, 0, 0, 0.0, 0.0, note))
                if not optional:
                    failures.append(f"{device} {dtype.name}: {reason}")
                continue
            for op in ops:
                rows.append(check_row(op, cases[op.kind], device, dtype, failures))

    print_table(rows)
    total = sum(r.cases for r in rows)
    failed = sum(r.failed for r in rows)
    elapsed = time.perf_counter() - start
    print()
    if failures:
        limit = None if args.verbose else 20
        print(f"{len(failures)} failure(s):")
        for line in failures[:limit]:
            print("  " + line)
        if limit is not None and len(failures) > limit:
            print(f"  ... and {len(failures) - limit} more (--verbose lists all)")
        print()
    ok = failed == 0 and not broken
    print(f"{'PASS' if ok else 'FAIL'}: {total - failed}/{total} cases passed in {elapsed:.1f} s")
    return 0 if ok else 1


HELP = "compare every operation with the numpy reference on every device"
DESCRIPTION = (
    "Run every operation over a sweep of options and sizes on every available device in "
    "float32, float64, float16 and bfloat16 (where the device computes them), compare with "
    "rnncore.reference, print a pass/fail table; exit status 1 on any failure."
)


def add_arguments(parser):
    """The options of ``python -m rnncore check`` (run(args) reads them)."""
    parser.add_argument(
        "--device",
        action="extend",
        nargs="+",
        metavar="NAME",
        help="device(s) to check (default: all of rnncore.devices())",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller sweep")
    parser.add_argument(
        "--op",
        dest="ops",
        action="extend",
        nargs="+",
        metavar="NAME",
        help="only these operations (e.g. gru lstm_gradients)",
    )
    parser.add_argument("--verbose", action="store_true", help="list every failure")

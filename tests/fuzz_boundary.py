"""Property-based fuzzer of rnncore's Python boundary (issue 10): the case generator, the
oracle and the worker process that tests/test_fuzz.py runs.

Every case is a function of its seed: a random call of one of the six operations with
random valid or invalid shapes (zero sizes, 1/31/32/33), dtypes, memory layouts
(non-contiguous, negative and zero strides, misaligned buffers), containers (numpy, torch
tensors incl. zero-size and requires_grad ones, DLPack capsules, memoryviews, lists,
scalars, None), aliased arguments, descriptors (right, wrong class, positional, omitted,
out-of-range fields), devices (real and bogus) and NaN / Inf values. The generator knows
what the contract says about the call it made (``expect``):

- ``valid``: it must succeed, leave its inputs untouched and agree with
  ``rnncore.reference`` (float64, on the same values) within the dtype's tolerance;
- ``error``: it must raise a *clear* error (``ValueError`` / ``TypeError`` /
  ``MemoryError`` / ``OverflowError``, plus ``RuntimeError`` for a known but unavailable
  device) whose message starts with ``[<op>]`` (or, for a descriptor's field, with the
  descriptor's class), or Python's own "missing / unexpected argument" ``TypeError``;
- ``either``: a clear error, or success with the right answer (lists, scalar masks,
  requires_grad tensors, a consumed capsule passed again, ...);
- ``huge``: element counts that overflow or cannot be allocated (zero-size dimensions keep
  the arrays empty): a clear error, or success with the right shapes.

Outcomes: ``ok`` (success, checked), ``clear`` (expected error, clear), ``unclear`` (an
error that is not clear: nanobind's "incompatible function arguments", a message without
the op, RuntimeError, SystemError, ...), ``wrong`` (wrong answer, a NaN turned into a
number, an invalid call accepted, a valid call refused, inputs modified), ``crash`` /
``hang`` (the process died or a case ran past its time limit; reported by the worker's
parent process), ``internal`` (a bug of this file).

Command line::

    python tests/fuzz_boundary.py --first 0 --count 100 [--stride 2]  # worker: JSON lines
    python tests/fuzz_boundary.py --show SEED   # describe a case
    python tests/fuzz_boundary.py --run SEED    # run one case here (a crash kills python)

The worker imports everything once and forks a child that runs the cases one by one; when
the child dies (a crash) or a case runs past ``--timeout`` seconds (a hang), the parent
reports that case, runs it once more alone in a fresh child (does it crash on its own?)
and forks a new child for the remaining seeds, so one crash costs milliseconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import time
import traceback
import types
import warnings

import ml_dtypes
import numpy as np
from cases import ACTIVATIONS as ACTIVATION_NAMES
from cases import (
    DEFAULT_ACTIVATIONS,
    FLAG_FIELDS,
    OPTIONAL_INPUTS,
    metal_computes_bfloat16,
    z_width,
)
from util import FORWARD_TOL, GRADIENT_TOL

import rnncore
from rnncore import _ops, reference
from rnncore._ops import rel_err

try:
    import torch
except ImportError:  # pragma: no cover - torch is a test dependency
    torch = None

# Part of every case's random state: change it to draw a new set of cases.
GENERATION = 1

KINDS = tuple(_ops.KINDS)
GATES = {k: kind.gates for k, kind in _ops.KINDS.items()}
FORWARD = {k: kind.forward for k, kind in _ops.KINDS.items()}
GRADIENT = {k: kind.gradients for k, kind in _ops.KINDS.items()}
DESCRIPTOR = {k: kind.descriptor for k, kind in _ops.KINDS.items()}
RESULT = {
    (k, grad): (kind.gradient_result if grad else kind.result).__name__
    for k, kind in _ops.KINDS.items()
    for grad in (False, True)
}


def _flags(kind):
    """The descriptor's boolean fields, those every kind has first: the order in which a
    case draws them (part of what a seed means)."""
    common = [f for f in FLAG_FIELDS[kind] if all(f in FLAG_FIELDS[k] for k in KINDS)]
    return tuple(common + [f for f in FLAG_FIELDS[kind] if f not in common])


FLAGS = {k: _flags(k) for k in KINDS}
# Activation field -> its default (the descriptor's).
ACTIVATIONS = {k: dict(DEFAULT_ACTIVATIONS[k]) for k in KINDS}
# Forward signature, in order (all positional-or-keyword).
FORWARD_ARGS = {k: ("source", "recurrent_weight") + OPTIONAL_INPUTS[k] for k in KINDS}
# Gradient signature: positional, then keyword-only.
GRADIENT_POSITIONAL = {k: kind.gradient_required for k, kind in _ops.KINDS.items()}
GRADIENT_KEYWORD = {
    k: ("state_gradient",) + (("cell_gradient",) if k == "lstm" else ()) + OPTIONAL_INPUTS[k]
    for k in KINDS
}
# Inputs that a forward run's results depend on (a gradient case must not change them
# after computing the training state); the forward's own outputs.
FORWARD_OUTPUTS = ("z_state", "output_fwd", "cell_output_fwd")
COTANGENTS = ("source_gradient", "state_gradient", "cell_gradient")

# NaN in these inputs multiplies the state; a zero state (no init_state, first step) may
# skip that product, so a NaN there need not reach the outputs.
MULTIPLIES_STATE = ("recurrent_weight", "mask", "peephole")
CLEAR_TYPES = (ValueError, TypeError, MemoryError, OverflowError)


def default_device():
    return os.environ.get("RNNCORE_DEVICE") or rnncore.devices()[0]


def device_dtypes(device):
    """The dtypes a device computes (README "Devices"): bfloat16 on Metal needs macOS 14."""
    if device == "cpu":
        return ("float32", "float64", "float16", "bfloat16")
    if device == "metal-emulated" or (device == "metal" and metal_computes_bfloat16()):
        return ("float32", "float16", "bfloat16")
    return ("float32", "float16")


# --------------------------------------------------------------------------------------
# Shapes: the contract's, and the validity of any set of them
# --------------------------------------------------------------------------------------


def contract_shapes(kind, grad, T, N, I, H, bi, reset_after, given, mask_shape, cell_form):  # noqa: E741
    """Shapes of a valid call; `given` = the optional inputs passed; I=None: no W."""
    D = 2 if bi else 1
    GH, DH = GATES[kind] * H, D * H
    s = {
        "source": (T, N, D * GH if I is None else I),
        "recurrent_weight": (2, GH, H) if bi else (GH, H),
    }
    if I is not None:
        s["input_weight"] = (D * GH, I)
    optional = {
        "bias": (D * GH,),
        "init_state": (N, DH),
        "init_cell": (N, DH),
        "mask": mask_shape,
        "peephole": (2, 4 * H) if bi else (4 * H,),
        "secondary_bias": (DH,),
        "state_gradient": (N, DH),
        "cell_gradient": (N, DH) if cell_form == "final" else (T, N, DH),
    }
    for name in given:
        s[name] = optional[name]
    if grad:
        s["source_gradient"] = (T, N, DH)
        s["z_state"] = (T, N, D * z_width(kind, reset_after) * H)
        if kind == "lstm":
            s["cell_output_fwd"] = (T, N, DH)
        if kind == "gru":
            s["output_fwd"] = (T, N, DH)
    return s


def shape_problem(kind, grad, bi, reset_after, shapes):
    """None when `shapes` is a valid call of the contract, else what is wrong."""
    src, R = shapes["source"], shapes["recurrent_weight"]
    if len(src) != 3:
        return "source rank"
    T, N, C = src
    if len(R) != (3 if bi else 2):
        return "recurrent_weight rank"
    H = R[-1]
    D = 2 if bi else 1
    GH, DH = GATES[kind] * H, D * H
    if R != ((2, GH, H) if bi else (GH, H)):
        return "recurrent_weight shape"
    want = {
        "input_weight": (D * GH, C),
        "bias": (D * GH,),
        "init_state": (N, DH),
        "init_cell": (N, DH),
        "peephole": (2, 4 * H) if bi else (4 * H,),
        "secondary_bias": (DH,),
        "state_gradient": (N, DH),
        "source_gradient": (T, N, DH),
        "z_state": (T, N, D * z_width(kind, reset_after) * H),
        "cell_output_fwd": (T, N, DH),
        "output_fwd": (T, N, DH),
    }
    if "input_weight" not in shapes and C != D * GH:
        return "source channels without input_weight"
    for name, shape in shapes.items():
        if name in want and shape != want[name]:
            return f"{name} shape"
    if "mask" in shapes:
        m = shapes["mask"]
        if len(m) > 2:
            return "mask rank"
        try:
            if np.broadcast_shapes(m, (N, DH)) != (N, DH):
                return "mask broadcast"
        except ValueError:
            return "mask broadcast"
    if "cell_gradient" in shapes and shapes["cell_gradient"] not in ((N, DH), (T, N, DH)):
        return "cell_gradient shape"
    return None


def expected_shapes(kind, grad, fields, shapes):
    """Output shapes of a valid call (None: absent), for the cases with no reference."""
    if grad:
        return {n: shapes.get(n) for n in _ops.KINDS[kind].gradient_fields}
    T, N = shapes["source"][:2]
    H = shapes["recurrent_weight"][-1]
    D = 2 if fields.get("bidirectional") else 1
    out = {"state": (T, N, D * H)}
    if kind == "lstm":
        produce = fields.get("produce_cell") or fields.get("training")
        out["cell"] = (T, N, D * H) if produce else None
    w = z_width(kind, fields.get("reset_after", False))
    out["z_state"] = (T, N, D * w * H) if fields.get("training") else None
    return out


# --------------------------------------------------------------------------------------
# Containers: how one array argument is handed to rnncore
# --------------------------------------------------------------------------------------


class Arg:
    """One argument: its float64 values (None: not an array), the object passed, tags."""

    def __init__(self, name, values, dtype):
        self.name = name
        self.values = values  # float64 ndarray as rnncore must read it, or None
        self.dtype = dtype
        self.obj = None
        self.tags = []
        self.snapshot = None  # (ndarray view to re-read, bytes) to check it is untouched

    def text(self):
        if self.values is None and not isinstance(self.obj, np.ndarray):
            return _short_repr(self.obj)
        dt = {"float32": "f32", "float64": "f64", "float16": "f16"}.get(
            str(self.dtype), str(self.dtype)
        )
        shape = "x".join(str(s) for s in np.shape(self.values)) or "scalar"
        tags = "" if not self.tags else "[" + ",".join(self.tags) + "]"
        return f"{dt}({shape}){tags}"


def _short_repr(obj):
    r = repr(obj)
    return r if len(r) <= 40 else r[:37] + "..."


def _misaligned(a, rng):
    """A copy of `a` whose data starts 1..itemsize-1 bytes past an aligned address."""
    off = int(rng.integers(1, a.itemsize)) if a.itemsize > 1 else 1
    buf = np.zeros(a.nbytes + 64, np.uint8)
    base = (-buf.ctypes.data) % 64  # 64-byte aligned start, then off bytes further
    out = np.frombuffer(buf.data, dtype=a.dtype, count=a.size, offset=base + off)
    out = out.reshape(a.shape)
    out[...] = a
    return out, f"misaligned+{off}"


def _strided(a, rng):
    """A non-contiguous view of a copy of `a` (every other element along one axis)."""
    axis = int(rng.integers(a.ndim))
    shape = list(a.shape)
    shape[axis] *= 2
    big = np.full(shape, np.nan, a.dtype)  # the skipped elements are NaN: reading them shows
    idx = [slice(None)] * a.ndim
    idx[axis] = slice(0, None, 2)
    big[tuple(idx)] = a
    return big[tuple(idx)], f"step2-axis{axis}"


def _negative(a, rng):
    axis = int(rng.integers(a.ndim))
    flipped = np.flip(a, axis).copy()
    return np.flip(flipped, axis), f"negstride-axis{axis}"


def _fortran(a, rng):
    return np.asfortranarray(a), "fortran"


def _torch_from(x):
    """torch.from_numpy, and ml_dtypes.bfloat16 arrays through their bits."""
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def _torch_bytes(t):
    """A tensor's bytes (bfloat16 through an int16 view: numpy has no bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def make_container(arg, rng, layout):
    """Set arg.obj (and tags) from arg.values, per `layout`."""
    a = arg.values.astype(arg.dtype)
    if layout == "plain":
        arg.obj = np.ascontiguousarray(a)
    elif layout == "stride0":
        # values are constant along arg.stride0_axis (made so by the generator)
        axis = arg.stride0_axis
        first = np.take(a, [0], axis=axis)
        arg.obj = np.broadcast_to(first, a.shape)
        if not np.array_equal(arg.obj, a, equal_nan=True):  # pragma: no cover
            raise AssertionError(f"{arg.name} is not constant along axis {axis}")
        arg.tags.append(f"stride0-axis{axis}")
    elif layout in ("strided", "negative", "fortran", "misaligned"):
        maker = {
            "strided": _strided,
            "negative": _negative,
            "fortran": _fortran,
            "misaligned": _misaligned,
        }[layout]
        arg.obj, tag = maker(a, rng)
        arg.tags.append(tag)
    elif layout == "npscalar":
        arg.obj = a[()]  # a numpy scalar (np.float32(...)): a 0-d buffer
        arg.tags.append("numpy-scalar")
    elif layout == "memoryview":
        arg.obj = memoryview(np.ascontiguousarray(a))
        arg.tags.append("memoryview")
    elif layout == "capsule":
        arg.obj = np.ascontiguousarray(a).__dlpack__()
        arg.tags.append("dlpack-capsule")
    elif layout.startswith("torch"):
        if a.size == 0:
            t = torch.empty(a.shape, dtype=getattr(torch, str(arg.dtype)))  # NULL data
            arg.tags.append("torch-empty")
        else:
            t = _torch_from(np.ascontiguousarray(a))
            arg.tags.append("torch")
        if layout == "torch-t" and a.ndim >= 2:
            t = _torch_from(np.ascontiguousarray(np.swapaxes(a, 0, 1))).transpose(0, 1)
            arg.tags[-1] = "torch-transposed"
        elif layout == "torch-expand" and getattr(arg, "stride0_axis", None) is not None:
            axis = arg.stride0_axis
            first = _torch_from(np.ascontiguousarray(np.take(a, [0], axis=axis)))
            t = first.expand(*a.shape)
            arg.tags[-1] = f"torch-expand-axis{axis}"
        elif layout == "torch-grad":
            t = t.clone().requires_grad_(True)
            arg.tags.append("requires_grad")
        elif layout == "torch-capsule":
            t = t.__dlpack__()
            arg.tags.append("dlpack-capsule")
        arg.obj = t
    elif layout == "list":
        arg.obj = a.tolist()
        arg.tags.append("list")
    else:  # pragma: no cover
        raise AssertionError(layout)
    if isinstance(arg.obj, np.ndarray):
        arg.snapshot = (arg.obj, arg.obj.tobytes())
    elif torch is not None and isinstance(arg.obj, torch.Tensor):
        arg.snapshot = (arg.obj, _torch_bytes(arg.obj))


def untouched(arg):
    if arg.snapshot is None:
        return True
    obj, before = arg.snapshot
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_bytes(obj) == before
    return obj.tobytes() == before


# --------------------------------------------------------------------------------------
# The generator
# --------------------------------------------------------------------------------------


def finfo(dtype):
    """np.finfo, and ml_dtypes.finfo for bfloat16 (numpy's refuses it)."""
    return ml_dtypes.finfo(dtype) if np.dtype(dtype).name == "bfloat16" else np.finfo(dtype)


def pick(rng, items, weights=None):
    if weights is not None:
        p = np.asarray(weights, float)
        return items[int(rng.choice(len(items), p=p / p.sum()))]
    return items[int(rng.integers(len(items)))]


class Case:
    """One random call; see the module docstring."""

    def __init__(self, seed):
        self.seed = seed
        self.rng = np.random.default_rng([GENERATION, seed])
        self.notes = []  # what was done, for the description
        self.invalid = []  # why the contract refuses the call
        self.loose = []  # why an error is acceptable as well as success
        self.huge = False
        self.nonfinite = False
        self.args = {}  # name -> Arg (array arguments, in generation order)
        self.extra_keywords = {}
        self.descriptor_plan = None  # how the descriptor is passed
        self.device_arg = ("omit", None)
        self.unavailable_device = False
        self.generate()

    # -- the pieces -------------------------------------------------------------------

    def generate(self):
        rng = self.rng
        self.kind = kind = pick(rng, KINDS)
        self.grad = grad = bool(rng.random() < 0.5)
        self.op = GRADIENT[kind] if grad else FORWARD[kind]
        self.choose_device()
        self.choose_descriptor()
        fields = self.fields
        bi = fields.get("bidirectional", False)
        reset_after = fields.get("reset_after", False)

        if rng.random() < 0.03:
            return self.generate_huge(bi, reset_after)

        T = pick(rng, (0, 1, 2, 3, 4, 6), (1, 3, 3, 2, 1, 1))
        N = pick(rng, (0, 1, 2, 3, 5), (1, 3, 3, 2, 1))
        H = pick(rng, (0, 1, 2, 3, 5, 31, 32, 33), (1, 3, 3, 3, 2, 1, 1, 1))
        I = pick(rng, (None, 0, 1, 2, 5, 31, 32, 33), (3, 2, 2, 3, 2, 1, 1, 1))  # noqa: E741
        if self.device != "cpu" and H > 8 and T * N > 6:  # the emulator is slow
            T = min(T, 2)
        optional = [n for n in OPTIONAL_INPUTS[kind] if n != "input_weight"]
        if grad:
            optional += ["state_gradient"] + (["cell_gradient"] if kind == "lstm" else [])
        given = [n for n in optional if rng.random() < 0.5]
        D = 2 if bi else 1
        mask_shape = pick(rng, [(), (1,), (D * H,), (1, D * H), (N, 1), (N, D * H), (1, 1)])
        cell_form = pick(rng, ("final", "steps"))
        self.sizes = (T, N, I, H)
        shapes = contract_shapes(
            kind, grad, T, N, I, H, bi, reset_after, given, mask_shape, cell_form
        )
        # Shape mutations: the validator decides whether the result is still valid.
        if rng.random() < 0.2:
            for _ in range(1 + int(rng.random() < 0.3)):
                self.mutate_shape(shapes)
        problem = shape_problem(kind, grad, bi, reset_after, shapes)
        if problem:
            self.invalid.append(problem)
        self.shapes = shapes
        self.make_values(shapes, consistent=problem is None)
        self.mutate_values()
        self.make_containers()
        self.mutate_objects()

    def choose_device(self):
        rng = self.rng
        devices = list(rnncore.devices())
        r = rng.random()
        if r < 0.04:
            bogus = pick(rng, ["gpu", "CPU", "cuda", "", " cpu", "metal:0", "cpu\x00", 3, b"cpu"])
            self.device_arg = ("keyword", bogus)
            self.invalid.append(f"device {bogus!r}")
            self.device = default_device()
        elif r < 0.06 and "metal" not in devices:
            self.device_arg = ("keyword", "metal")
            self.invalid.append("device 'metal' unavailable")
            self.unavailable_device = True
            self.device = default_device()
        elif r < 0.2:
            self.device_arg = pick(rng, [("omit", None), ("keyword", None)])
            self.device = default_device()
        else:
            self.device = pick(rng, devices, [3 if d == "cpu" else 2 for d in devices])
            self.device_arg = ("keyword", self.device)
        supported = device_dtypes(self.device)
        r = rng.random()
        other = [d for d in ("float32", "float64", "float16", "bfloat16") if d not in supported]
        if r < 0.04 and other:  # a float dtype the device does not compute, for every array
            self.dtype = np.dtype(pick(rng, other))
            self.invalid.append(f"{self.dtype} on {self.device}")
        else:
            self.dtype = np.dtype(supported[0] if r < 0.65 else pick(rng, list(supported[1:])))

    def choose_descriptor(self):
        """Random fields; then how the descriptor reaches the call."""
        rng, kind = self.rng, self.kind
        fields = {}
        values = {}  # field -> the Python object given to the constructor
        for f in FLAGS[kind]:
            if rng.random() < 0.35:
                fields[f] = bool(rng.random() < 0.6)
                values[f] = np.bool_(fields[f]) if rng.random() < 0.1 else fields[f]
        for f in ACTIVATIONS[kind]:
            if rng.random() < 0.3:
                a = int(rng.integers(len(ACTIVATION_NAMES)))
                fields[f] = a
                values[f] = pick(
                    rng,
                    [a, rnncore.Activation(a), np.int64(a), np.uint8(a)],
                    (3, 3, 1, 1),
                )
        if self.grad and rng.random() < 0.1:
            # Defect 7: no descriptor after a forward with another one. Keep the shapes
            # of the default descriptor so that only the results can tell.
            fields.pop("bidirectional", None)
            fields.pop("reset_after", None)
            values.pop("bidirectional", None)
            values.pop("reset_after", None)
            if not any(fields.get(f, d) != d for f, d in _defaults(kind)):
                f = pick(rng, list(ACTIVATIONS[kind]))
                other = ACTIVATIONS[kind][f] + 1 + int(rng.integers(len(ACTIVATION_NAMES) - 1))
                fields[f] = values[f] = other % len(ACTIVATION_NAMES)
            self.descriptor_plan = "omit"
            self.invalid.append("gradient op without descriptor")
        self.fields = fields
        self.field_values = values
        if self.descriptor_plan is None:
            r = rng.random()
            bad = None
            if r < 0.03:
                bad = ("activation", pick(rng, [5, -1, 255, 2**31, 2**64, 2.0, True, "TANH"]))
            elif r < 0.05:
                bad = ("flag", pick(rng, [1, 0, "yes", None, 1.0]))
            elif r < 0.06:
                bad = ("unknown-field", "hidden_size")
            elif r < 0.075:
                bad = ("setattr", pick(rng, [7, -3, "relu", 3.5]))
            if bad is not None:
                self.bad_field = bad
                self.invalid.append(f"descriptor field {bad[0]} {bad[1]!r}")
            r = rng.random()
            if r < 0.03:
                self.descriptor_plan = "wrong-class"
                self.invalid.append("descriptor of another class")
            elif r < 0.05:
                self.descriptor_plan = "namespace"
                self.invalid.append("descriptor is not a descriptor")
            elif r < 0.07:
                self.descriptor_plan = "positional"
                self.invalid.append("positional descriptor")
            elif not fields and not bad and r < 0.2:
                self.descriptor_plan = "omit" if not self.grad else "none"
                if self.grad:
                    self.loose.append("descriptor=None in a gradient op")
            else:
                self.descriptor_plan = "keyword"

    def generate_huge(self, bi, reset_after):
        """Element counts past int64 or past any allocation; the arrays stay empty."""
        rng, kind = self.rng, self.kind
        self.huge = True
        T, N = pick(
            rng,
            [
                (2**30, 2**30),
                (2**40, 2**20),
                (2**31 + 1, 1),
                (2**59, 2),
                (1, 2**61),
                (2**33, 2**27),
            ],
        )
        H = 0 if self.grad else pick(rng, (0, 1, 16))
        I = 0  # noqa: E741
        if rng.random() < 0.5:
            T, N = N, T
        while T * N * 8 >= 2**62:  # numpy's and torch's own limit, for any dtype used
            T = max(T // 2, 1) if T >= N else T
            N = max(N // 2, 1) if N > T else N
        if T * N * H * 2 < 2**47:
            # Outputs that a large machine could allocate would be computed for real
            # (minutes, gigabytes): keep them empty instead. Past 2**47 bytes no
            # allocation can succeed (the address space), so a MemoryError is certain.
            H = 0
        self.sizes = (T, N, I, H)
        D = 2 if bi else 1
        shapes = contract_shapes(kind, self.grad, T, N, I, H, bi, reset_after, [], (), "final")
        if rng.random() < 0.3:
            shapes["mask"] = ()
        self.shapes = shapes
        for name, shape in shapes.items():
            arg = Arg(name, None, self.dtype)
            n = math.prod(shape)
            if n == 0 and max(shape, default=0) > 2**20:
                arg.obj = np.empty(shape, self.dtype)
                if torch is not None and rng.random() < 0.3:
                    arg.obj = torch.empty(shape, dtype=getattr(torch, str(self.dtype)))
                    arg.tags.append("torch-empty")
                arg.values = np.empty(shape, self.dtype)
            else:
                arg.values = self.rng.standard_normal(shape) * 0.3
                arg.obj = arg.values.astype(self.dtype)
            self.args[name] = arg
        self.notes.append(f"huge T={T} N={N} H={H} D={D}")

    def mutate_shape(self, shapes):
        rng = self.rng
        name = pick(rng, list(shapes))
        shape = list(shapes[name])
        r = rng.random()
        if r < 0.15 or not shape:
            shape.insert(int(rng.integers(len(shape) + 1)), pick(rng, (1, 2)))
            what = "extra axis"
        elif r < 0.3:
            del shape[int(rng.integers(len(shape)))]
            what = "dropped axis"
        else:
            axis = int(rng.integers(len(shape)))
            new = pick(rng, [shape[axis] + 1, shape[axis] - 1, 0, 1, 31, 32, 33])
            shape[axis] = max(new, 0)
            what = f"axis {axis} -> {shape[axis]}"
        shapes[name] = tuple(shape)
        self.notes.append(f"{name} {what}")

    def scale(self, name, shapes):
        H = max(shapes["recurrent_weight"][-1] if shapes["recurrent_weight"] else 1, 1)
        I = max(shapes["source"][-1] if shapes["source"] else 1, 1)  # noqa: E741
        return {
            "recurrent_weight": 0.8 / math.sqrt(H),
            "input_weight": 1.0 / math.sqrt(I),
            "bias": 0.5,
            "init_state": 0.7,
            "peephole": 0.5,
            "secondary_bias": 0.5,
        }.get(name, 1.0)

    def random_values(self, name, shape, shapes):
        rng = self.rng
        if name == "mask":
            v = rng.uniform(0.5, 1.5, shape)
            return np.where(rng.random(shape) < 0.25, 0.0, v)
        return rng.standard_normal(shape) * self.scale(name, shapes)

    def make_values(self, shapes, consistent):
        """Float64 values (rounded to the dtype) for every array argument; for a valid
        gradient call, the training state and outputs of a forward run on them."""
        rng = self.rng
        dt = self.dtype if self.dtype.kind == "f" else np.dtype("float32")
        forward_inputs = [n for n in shapes if n not in FORWARD_OUTPUTS + COTANGENTS]
        for name in shapes:
            if consistent and self.grad and name in FORWARD_OUTPUTS:
                continue
            v = self.random_values(name, shapes[name], shapes)
            # Some arrays constant along an axis, to be passed with stride 0.
            if v.size and v.ndim > 0 and rng.random() < 0.08:
                axis = int(rng.integers(v.ndim))
                v = np.repeat(np.take(v, [0], axis=axis), v.shape[axis], axis=axis)
                self.stride0 = getattr(self, "stride0", {})
                self.stride0[name] = axis
            self.args[name] = Arg(name, v.astype(dt).astype(np.float64), self.dtype)
        # Aliasing: the same values (later: the same object) for two arguments.
        if rng.random() < 0.15:
            self.alias = self.choose_alias(shapes, forward_inputs, consistent)
        if consistent and self.grad:
            fwd = getattr(reference, FORWARD[self.kind])
            fields = dict(self.fields, training=True)
            ins = {n: self.args[n].values for n in forward_inputs}
            with np.errstate(all="ignore"):
                out = fwd(**ins, descriptor=types.SimpleNamespace(**fields))
            outs = {"z_state": out.z_state}
            if self.kind == "lstm":
                outs["cell_output_fwd"] = out.cell
            if self.kind == "gru":
                outs["output_fwd"] = out.state
            for name, v in outs.items():
                self.args[name] = Arg(name, v.astype(dt).astype(np.float64), self.dtype)
            if getattr(self, "alias", None) and self.alias[1] in FORWARD_OUTPUTS:
                dst, src = self.alias
                self.args[dst].values = self.args[src].values.copy()
        # Keep the signature order.
        order = list(shapes)
        self.args = {n: self.args[n] for n in order}

    def choose_alias(self, shapes, forward_inputs, consistent):
        """(dst, src): dst gets src's values and object. A valid gradient call may only
        alias its cotangents (anything else would not match the training state)."""
        rng = self.rng
        names = list(shapes)
        pairs = [
            (d, s)
            for d in names
            for s in names
            if d != s
            and shapes[d] == shapes[s]
            and (not (self.grad and consistent) or d in COTANGENTS)
        ]
        if not pairs:
            return None
        dst, src = pick(rng, pairs)
        if src in self.args:
            self.args[dst].values = self.args[src].values.copy()
        if dst in getattr(self, "stride0", {}):
            del self.stride0[dst]
        if src in getattr(self, "stride0", {}):
            self.stride0[dst] = self.stride0[src]
        self.notes.append(f"{dst} is {src}")
        return dst, src

    def mutate_values(self):
        """NaN / Inf in one element of one array."""
        rng = self.rng
        if rng.random() < 0.07:
            names = [n for n, a in self.args.items() if a.values is not None and a.values.size]
            if getattr(self, "alias", None):
                names = [n for n in names if n not in self.alias]
            # Arrays passed with stride 0 must stay constant along that axis.
            names = [n for n in names if n not in getattr(self, "stride0", {})]
            if names:
                name = pick(rng, names)
                v = self.args[name].values
                value = pick(rng, [np.nan, np.nan, np.inf, -np.inf])
                v.flat[int(rng.integers(v.size))] = value
                self.nonfinite = True
                self.nan = bool(np.isnan(value)) and name not in MULTIPLIES_STATE
                self.notes.append(f"{value} in {name}")

    def make_containers(self):
        rng = self.rng
        layouts = ["plain", "strided", "negative", "fortran", "misaligned", "memoryview"]
        weights = [10, 1.5, 1.5, 1, 2, 0.5]
        if torch is not None:
            layouts += ["torch", "torch-t", "torch-expand", "torch-grad", "torch-capsule"]
            weights += [2.5, 0.5, 0.3, 0.5, 0.5]
        layouts += ["capsule", "list"]
        weights += [0.8, 0.3]
        if self.dtype.name == "bfloat16":  # numpy exports it neither as a buffer nor DLPack
            keep = [i for i, x in enumerate(layouts) if x not in ("memoryview", "capsule")]
            layouts, weights = [layouts[i] for i in keep], [weights[i] for i in keep]
        alias = getattr(self, "alias", None)
        stride0 = getattr(self, "stride0", {})
        for name, arg in self.args.items():
            if alias and name == alias[0]:
                continue
            if name in stride0 and rng.random() < 0.7:
                layout = "torch-expand" if torch is not None and rng.random() < 0.3 else "stride0"
                arg.stride0_axis = stride0[name]
            elif arg.values.size == 0 and torch is not None and rng.random() < 0.3:
                layout = "torch"  # zero-size torch tensors have no data pointer
            elif arg.values.ndim == 0 and rng.random() < 0.3:
                layout = "npscalar"
            else:
                layout = pick(rng, layouts, weights)
                if layout == "torch-expand":
                    layout = "torch"
            if arg.values.ndim < (2 if layout in ("fortran", "torch-t") else 1):
                layout = "plain" if layout != "torch-t" else "torch"
            if layout == "memoryview" and self.dtype == np.float16:
                self.loose.append("float16 memoryview")
            if layout == "list":
                self.loose.append(f"{name} as a list")
            if layout in ("torch-grad",):
                self.loose.append(f"{name} requires_grad")
            make_container(arg, rng, layout)
        if alias:
            dst, src = alias
            a, b = self.args[dst], self.args[src]
            if rng.random() < 0.3 and torch is not None and isinstance(b.obj, np.ndarray):
                try:
                    a.obj = torch.from_numpy(b.obj)  # the same memory through another door
                    a.tags = [*b.tags, f"torch-view-of-{src}"]
                except (ValueError, TypeError, RuntimeError):  # negative strides
                    a.obj, a.tags = b.obj, [*b.tags, f"same-object-as-{src}"]
            else:
                a.obj, a.tags = b.obj, [*b.tags, f"same-object-as-{src}"]
            a.snapshot = b.snapshot
            if "dlpack-capsule" in b.tags:
                self.loose.append("a DLPack capsule passed twice")

    def mutate_objects(self):
        """Wrong dtypes, wrong objects, None, scalars, extra/missing arguments."""
        rng = self.rng
        names = list(self.args)
        required = set(GRADIENT_POSITIONAL[self.kind] if self.grad else FORWARD_ARGS[self.kind][:2])
        r = rng.random()
        if r < 0.08:  # one array of another dtype
            name = pick(rng, names)
            arg = self.args[name]
            choices = ["int32", "int64", "bool", "complex64", "uint8", "float16", "float64"]
            choices += ["float32"]
            dt = np.dtype(pick(rng, [c for c in choices if c != str(self.dtype)]))
            arg.dtype = dt
            arg.tags = []
            with np.errstate(all="ignore"):
                vals = arg.values if arg.values is not None else np.zeros(self.shapes[name])
                arg.obj = np.ascontiguousarray(vals.astype(dt))
            if rng.random() < 0.3 and arg.obj.ndim:
                arg.obj, tag = _negative(arg.obj, rng)
                arg.tags.append(tag)
            if rng.random() < 0.2 and torch is not None and dt.name != "uint8":
                arg.obj = torch.from_numpy(arg.obj.copy(order="C"))
                arg.tags.append("torch")
            arg.snapshot = None
            self.invalid.append(f"{name} has dtype {dt}")
        elif r < 0.13:  # None where an array is required
            name = pick(rng, sorted(required))
            self.args[name].obj = None
            self.args[name].values = None
            self.args[name].snapshot = None
            self.invalid.append(f"{name} is None")
        elif r < 0.17:  # not an array at all
            name = pick(rng, names)
            obj = pick(rng, ["abc", {}, object(), 3, 2.5, b"\x00" * 8, (1.0, 2.0), Ellipsis])
            arg = self.args[name]
            arg.obj, arg.values, arg.snapshot = obj, None, None
            if name == "mask" and isinstance(obj, float):
                self.loose.append("a Python float as the mask")
                arg.values = np.asarray(obj)
            else:
                self.invalid.append(f"{name} is {type(obj).__name__}")
        elif r < 0.19:
            self.extra_keywords["hidden_size"] = 4
            self.invalid.append("unknown keyword")
        elif r < 0.2:
            self.drop = pick(rng, sorted(required))
            self.invalid.append(f"{self.drop} missing")

    # -- running ----------------------------------------------------------------------

    def shapes_invalid(self):
        ends = ("shape", "rank", "broadcast", "channels without input_weight")
        return any(w.endswith(ends) for w in self.invalid)

    def descriptor_class(self):
        return getattr(rnncore, DESCRIPTOR[self.kind])

    def build_descriptor(self):
        """The descriptor as the plan says; may raise (bad field values)."""
        cls = self.descriptor_class()
        values = dict(self.field_values)
        bad = getattr(self, "bad_field", None)
        if bad and bad[0] == "activation":
            values[pick(self.rng, list(ACTIVATIONS[self.kind]))] = bad[1]
        elif bad and bad[0] == "flag":
            values[pick(self.rng, list(FLAGS[self.kind]))] = bad[1]
        elif bad and bad[0] == "unknown-field":
            values[bad[1]] = 3
        d = cls(**values)
        if bad and bad[0] == "setattr":
            setattr(d, pick(self.rng, list(ACTIVATIONS[self.kind])), bad[1])
        if self.descriptor_plan == "wrong-class":
            other = pick(self.rng, [k for k in KINDS if k != self.kind])
            return getattr(rnncore, DESCRIPTOR[other])()
        if self.descriptor_plan == "namespace":
            return pick(
                self.rng,
                [types.SimpleNamespace(**self.fields), dict(self.fields), "default", 0],
            )
        return d

    def call_parts(self, descriptor):
        """(positional, keyword) arguments as the plan says."""
        rng = np.random.default_rng([GENERATION, self.seed, 1])  # independent of the rest
        objs = {n: a.obj for n, a in self.args.items()}
        drop = getattr(self, "drop", None)
        if self.grad:
            positional = [objs.get(n) for n in GRADIENT_POSITIONAL[self.kind]]
            keyword = {n: objs[n] for n in GRADIENT_KEYWORD[self.kind] if n in objs}
            for n in GRADIENT_KEYWORD[self.kind]:
                if n not in keyword and rng.random() < 0.3:
                    keyword[n] = None
        else:
            order = FORWARD_ARGS[self.kind]
            given = [n for n in order if n in objs]
            last = max(order.index(n) for n in given)
            npos = 2 if rng.random() < 0.6 else int(rng.integers(2, last + 2))
            positional = [objs.get(n) for n in order[:npos]]
            keyword = {n: objs[n] for n in order[npos:] if n in objs}
            for n in order[npos:]:
                if n not in keyword and rng.random() < 0.3:
                    keyword[n] = None
        if drop is not None:
            names = GRADIENT_POSITIONAL[self.kind] if self.grad else FORWARD_ARGS[self.kind]
            i = names.index(drop)
            # Dropping a positional argument: pass the later ones by keyword.
            later = positional[i + 1 :]
            for n, v in zip(names[i + 1 :], later):
                keyword[n] = v
            positional = positional[:i]
        keyword.update(self.extra_keywords)
        plan = self.descriptor_plan
        if plan == "positional":
            positional.append(descriptor)
        elif plan == "none":
            keyword["descriptor"] = None
        elif plan != "omit":
            keyword["descriptor"] = descriptor
        how, device = self.device_arg
        if how == "keyword":
            keyword["device"] = device
        return positional, keyword

    def describe(self):
        try:
            positional, keyword = self.call_parts("<descriptor>")
        except Exception as e:  # pragma: no cover - a bug of this file
            return f"seed {self.seed}: (cannot describe: {e!r})"
        texts = {id(a.obj): a.text() for a in self.args.values()}

        def text(v):
            if isinstance(v, str) and v == "<descriptor>":
                return self.descriptor_text()
            return texts.get(id(v), _short_repr(v))

        parts = [text(v) for v in positional]
        parts += [f"{k}={text(v)}" for k, v in keyword.items()]
        line = f"rnncore.{self.op}({', '.join(parts)})"
        extra = []
        if self.notes:
            extra.append("; ".join(self.notes))
        extra.append(f"expect {self.expect}" + (f" ({', '.join(self.why)})" if self.why else ""))
        return f"seed {self.seed}: {line}  # " + " | ".join(extra)

    def descriptor_text(self):
        cls = DESCRIPTOR[self.kind]
        fields = ", ".join(f"{k}={_short_repr(v)}" for k, v in self.field_values.items())
        bad = getattr(self, "bad_field", None)
        text = f"{cls}({fields})"
        if bad:
            text += f"<bad {bad[0]} {bad[1]!r}>"
        if self.descriptor_plan in ("wrong-class", "namespace"):
            text = f"<{self.descriptor_plan} instead of {cls}>"
        return text

    @property
    def expect(self):
        if self.invalid:
            return "error"
        if self.huge:
            return "huge"
        return "either" if self.loose else "valid"

    @property
    def why(self):
        return self.invalid or self.loose


# --------------------------------------------------------------------------------------
# Running one case and judging the outcome
# --------------------------------------------------------------------------------------


def clear_error(case, exc, stage):
    """Is `exc` (raised at `stage`: "descriptor" or "call") a clear error?"""
    msg = str(exc)
    if stage == "descriptor":
        cls = DESCRIPTOR[case.kind]
        if not isinstance(exc, (ValueError, TypeError)) or not re.match(rf"\[?{cls}[.(\]]", msg):
            return False
        bad = getattr(case, "bad_field", None)
        value = bad[1] if bad else None
        if isinstance(value, int) and not isinstance(value, bool) and isinstance(exc, ValueError):
            return str(value) in msg  # the message shows the value it refuses
        return True
    ok_types = CLEAR_TYPES + ((RuntimeError,) if case.unavailable_device else ())
    if type(exc) not in ok_types:
        return False
    if "incompatible function arguments" in msg:
        return False
    if msg.startswith(f"[{case.op}]"):
        return True
    # Python's own argument errors, naming the function.
    return (
        isinstance(exc, TypeError)
        and re.match(rf"{case.op}\(\) (takes|missing|got) ", msg) is not None
    )


def reference_result(case, perturb=0.0):
    """rnncore.reference's answer on the values rnncore was given (float64); with
    `perturb`, on those values times (1 + perturb * u), u uniform in [-1, 1]."""
    vals = {n: a.values for n, a in case.args.items()}
    if perturb:
        rng = np.random.default_rng([GENERATION, case.seed, 2])
        vals = {
            n: None if v is None else v * (1 + perturb * rng.uniform(-1, 1, np.shape(v)))
            for n, v in vals.items()
        }
    d = types.SimpleNamespace(**case.fields)
    if case.grad:
        fn = getattr(reference, GRADIENT[case.kind])
        pos = [vals[n] for n in GRADIENT_POSITIONAL[case.kind]]
        kw = {n: vals[n] for n in GRADIENT_KEYWORD[case.kind] if n in vals}
        return fn(*pos, **kw, descriptor=d)
    fn = getattr(reference, FORWARD[case.kind])
    return fn(**vals, descriptor=d)


def check_result(case, result):
    """None when `result` is right, else what is wrong."""
    want_type = RESULT[(case.kind, case.grad)]
    if type(result).__name__ != want_type or not isinstance(result, tuple):
        return f"result is {type(result).__name__}, not {want_type}"
    inputs = [(a.name, a.snapshot[0]) for a in case.args.values() if a.snapshot is not None]
    for field, out in zip(result._fields, result):
        for name, obj in inputs:
            if isinstance(out, np.ndarray) and isinstance(obj, np.ndarray):
                if out.size and obj.size and np.may_share_memory(out, obj):
                    return f"output {field} shares memory with input {name}"
    dtype = case.dtype
    if case.huge:
        shapes = expected_shapes(case.kind, case.grad, case.fields, case.shapes)
        for field, shape in shapes.items():
            got = getattr(result, field)
            if (got is None) != (shape is None):
                return f"{field}: {'None' if got is None else 'an array'} instead of {shape}"
            if got is not None and (got.shape != shape or got.dtype != dtype):
                return f"{field}: {got.dtype}{got.shape} instead of {dtype}{shape}"
        return None
    with np.errstate(all="ignore"):
        ref = reference_result(case)
    tol = (GRADIENT_TOL if case.grad else FORWARD_TOL)[dtype]
    arrays = [np.abs(v) for v in ref if v is not None and np.size(v)]
    peak = max((float(np.nanmax(a)) for a in arrays), default=0.0)
    overflow = peak > finfo(dtype).max / 2  # the true values do not fit the dtype
    worst = 0.0
    for field in ref._fields:
        got, want = getattr(result, field), getattr(ref, field)
        if (got is None) != (want is None):
            return f"{field}: {'None' if got is None else 'an array'} instead of " + (
                "None" if want is None else f"shape {want.shape}"
            )
        if want is None:
            continue
        if not isinstance(got, np.ndarray):
            return f"{field} is a {type(got).__name__}"
        if got.shape != want.shape or got.dtype != dtype:
            return f"{field}: {got.dtype}{got.shape} instead of {dtype}{want.shape}"
        g = got.astype(np.float64)
        if case.nonfinite:
            if case.grad:
                continue  # derivatives at NaN are not specified: no crash is enough
            if field not in ("state", "cell"):
                continue
            # NaN in, NaN out: where the reference has NaN, rnncore must have some too.
            if case.nan and np.isnan(want).any() and np.isfinite(g).all():
                i = tuple(int(x) for x in np.argwhere(np.isnan(want))[0])
                return f"NaN lost: {field} is finite, the reference has NaN at {list(i)}"
            both = np.isfinite(want) & np.isfinite(g)
            if both.any():
                err = rel_err(g[both], want[both])
                if err > tol:
                    return f"{field}: relative error {err:.2e} > {tol:.0e} on the finite entries"
            continue
        if overflow:
            continue  # shapes and dtypes only
        if not np.all(np.isfinite(g)):
            return f"{field} has non-finite values (finite inputs)"
        err = rel_err(g, want)
        if err > tol:
            # An ill-conditioned problem (long sequences, expansive activations) amplifies
            # rounding: allow 30 times the change that rounding the inputs to the dtype
            # makes in the reference itself. A wrong answer is off by far more.
            loose = 30 * sensitivity(case, ref, field)
            if err > loose:
                return f"{field}: relative error {err:.2e} > {max(tol, loose):.1e}"
            err = 0.0  # within the problem's own sensitivity
        worst = max(worst, err)
    case.worst = worst
    return None


def sensitivity(case, ref, field):
    """How much `field` of the reference moves when the inputs move by one rounding
    error of the case's dtype (cached per case)."""
    if not hasattr(case, "perturbed"):
        eps = float(finfo(case.dtype).eps)
        with np.errstate(all="ignore"):
            case.perturbed = reference_result(case, perturb=eps)
    return rel_err(getattr(case.perturbed, field), getattr(ref, field))


def make_case(seed):
    """(case, description), or (None, the generator's traceback): a bug of this file."""
    try:
        case = Case(seed)
        return case, case.describe()
    except Exception:
        return None, f"seed {seed}: generator failed: " + traceback.format_exc(limit=4)


def run_case(case):
    """Run one case; returns (outcome, why)."""
    if case is None:
        return "internal", "the generator failed"
    try:
        return judge(case)
    except Exception:  # a bug of the oracle, not of rnncore
        return "internal", "oracle: " + traceback.format_exc(limit=4)


def judge(case):
    fn = getattr(rnncore, case.op)
    stage = "descriptor"
    try:
        descriptor = case.build_descriptor()
        stage = "call"
        positional, keyword = case.call_parts(descriptor)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fn(*positional, **keyword)
    except BaseException as exc:  # noqa: B036 - SystemError etc. must be classified too
        if isinstance(exc, KeyboardInterrupt):
            raise
        text = f"{type(exc).__name__}: {_first_line(exc)}"
        for a in case.args.values():
            if not untouched(a):
                return "wrong", f"{a.name} was modified by a failing call ({text})"
        if not clear_error(case, exc, stage):
            bad = getattr(case, "bad_field", None)
            if stage == "descriptor" and bad:
                text += f" (the value given: {bad[1]!r})"
            return "unclear", text
        if case.expect == "valid":
            return "wrong", f"valid call refused: {text}"
        return "clear", text
    for a in case.args.values():
        if not untouched(a):
            return "wrong", f"{a.name} was modified by the call"
    if case.expect == "error":
        why = f"accepted although {', '.join(case.invalid)}"
        if case.descriptor_plan == "omit" and case.grad and not case.shapes_invalid():
            problem = _quietly(check_result, case, result)
            why += "; vs the forward's descriptor: " + (problem or "same result")
        return "wrong", why
    problem = check_result(case, result)
    if problem:
        return "wrong", problem
    return "ok", f"max rel err {getattr(case, 'worst', 0.0):.1e}"


def _quietly(f, *args):
    try:
        return f(*args)
    except Exception as e:
        return f"(reference failed: {e!r})"


def _first_line(exc):
    msg = str(exc).strip().splitlines()
    return msg[0][:300] if msg else ""


def _defaults(kind):
    """(field, default) of every descriptor field."""
    return [(f, False) for f in FLAGS[kind]] + list(ACTIVATIONS[kind].items())


# --------------------------------------------------------------------------------------
# The worker: a parent that runs the cases in a child process (crash-safe)
# --------------------------------------------------------------------------------------

# Linux: fork children from a parent that has imported everything (a restart after a
# crash costs milliseconds). Elsewhere (macOS: fork and the Objective-C / Metal runtime do
# not mix), or with RNNCORE_FUZZ_SPAWN=1, each child is a new interpreter.
USE_FORK = sys.platform.startswith("linux") and not os.environ.get("RNNCORE_FUZZ_SPAWN")


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Progress:
    """(index of the running case, its start time or 0) in a 16-byte file."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def set(self, index, t0):
        os.pwrite(self.fd, struct.pack("qd", index, t0), 0)

    def get(self):
        data = os.pread(self.fd, 16, 0)
        return struct.unpack("qd", data) if len(data) == 16 else (0, 0.0)


def child(seeds, start, progress):
    """Run seeds[start:], publishing the running case's index and start time."""
    np.seterr(all="ignore")
    for i in range(start, len(seeds)):
        seed = seeds[i]
        progress.set(i, time.monotonic())
        case, desc = make_case(seed)
        emit({"ev": "start", "seed": seed, "desc": desc})
        outcome, why = run_case(case)
        progress.set(i, 0.0)
        emit({"ev": "end", "seed": seed, "cat": outcome, "why": why})


class Child:
    """A child process running seeds[start:] (or one seed, silently)."""

    def __init__(self, seeds, start, progress_path, quiet=False):
        if USE_FORK:
            sys.stdout.flush()
            self.pid = os.fork()
            if self.pid == 0:  # pragma: no cover - the child
                code = 0
                try:
                    if quiet:
                        devnull = os.open(os.devnull, os.O_WRONLY)
                        os.dup2(devnull, 1)
                        os.dup2(devnull, 2)
                    child(seeds, start, Progress(progress_path))
                except BaseException:
                    traceback.print_exc()
                    code = 3
                finally:
                    sys.stdout.flush()
                    os._exit(code)
            self.proc = None
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", progress_path]
            cmd += ["--start", str(start), "--seeds", ",".join(map(str, seeds))]
            out = subprocess.DEVNULL if quiet else None
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=out)

    def poll(self):
        """None while running, else a negative signal number or the exit status."""
        if self.proc is not None:
            return self.proc.poll()
        done, status = os.waitpid(self.pid, os.WNOHANG)
        if not done:
            return None
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
        else:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout, progress=None):
        """(returncode, hung): hung when one case (or, without progress, the whole
        child) ran past `timeout` seconds."""
        begin = time.monotonic()
        hung = False
        while True:
            code = self.poll()
            if code is not None:
                return code, hung
            if progress is not None:
                _, t0 = progress.get()
                late = t0 and time.monotonic() - t0 > timeout
            else:
                late = time.monotonic() - begin > timeout
            if late and not hung:
                self.kill()
                hung = True
            time.sleep(0.01)


def ended_by(code):
    if code < 0:
        try:
            return f"{signal.Signals(-code).name} (signal {-code})"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def worker(seeds, timeout):
    """Run every seed; report crashes and hangs of the children, then go on."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "progress")
        progress = Progress(path)
        pos = 0
        while pos < len(seeds):
            progress.set(pos, 0.0)
            code, hung = Child(seeds, pos, path).wait(timeout, progress)
            if code == 0 and not hung:
                return
            index, t0 = progress.get()
            seed = seeds[index]
            if hung:
                emit({"ev": "end", "seed": seed, "cat": "hang", "why": f"ran past {timeout} s"})
            elif t0 == 0.0:
                why = f"the worker's child ended with {ended_by(code)} after this case"
                emit({"ev": "end", "seed": seed, "cat": "internal", "why": why})
            else:
                alone = confirm_alone(seed, timeout, tmp)
                why = f"{ended_by(code)}; alone in a fresh process: {alone}"
                emit({"ev": "end", "seed": seed, "cat": "crash", "why": why})
            pos = index + 1


def confirm_alone(seed, timeout, tmp):
    """Does the case crash on its own, in a process that ran nothing before it?"""
    code, hung = Child([seed], 0, os.path.join(tmp, "alone"), quiet=True).wait(timeout)
    if hung:
        return "hangs"
    if code == 0:
        return "does not crash (an earlier case may have corrupted memory)"
    return f"crashes too ({ended_by(code)})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    p.add_argument("--show", type=int, nargs="*", help="describe these seeds")
    p.add_argument("--run", type=int, nargs="*", help="run these seeds in this process")
    p.add_argument("--child", help=argparse.SUPPRESS)  # progress file of a spawned child
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--seeds", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    if a.child:
        child([int(x) for x in a.seeds.split(",")], a.start, Progress(a.child))
        return 0
    if a.show:
        for seed in a.show:
            print(make_case(seed)[1])
        return 0
    if a.run:
        for seed in a.run:
            case, desc = make_case(seed)
            print(desc, flush=True)
            outcome, why = run_case(case)
            print(f"  -> {outcome}: {why}", flush=True)
        return 0
    seeds = [a.first + k * a.stride for k in range(a.count)]
    worker(seeds, a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The case tables of the bad-input suites (tests/test_bad_input.py for the forward ops,
tests/test_bad_input_gradients.py for the gradient ops): sizes, message patterns, the
``Case`` record and the builders both tables use.

A case is a valid base call of one op with some arguments replaced (another shape,
another dtype, left out); its id names the change.
"""

import re
from typing import NamedTuple, Optional

import numpy as np

# Small sizes, chosen so that the shapes in the messages are unambiguous.
T, N, I, H = 5, 4, 7, 3  # noqa: E741

# ---- message patterns ---------------------------------------------------------------


def name_re(name):
    # Not inside a longer name: "bias" must not be satisfied by "secondary_bias".
    return r"\b" + re.escape(name) + r"\b"


def shape_re(shape):
    """A shape as printed in messages: (4, 3), (12,) or (12), ()."""
    if len(shape) == 1:
        return r"\(" + str(shape[0]) + r",?\)"
    return r"\(" + r",\s*".join(str(s) for s in shape) + r"\)"


def all_of(*pieces):
    """A regex that matches when every piece occurs somewhere, in any order."""
    return "(?s)^" + "".join("(?=.*(?:" + p + "))" for p in pieces)


# ---- cases ---------------------------------------------------------------------------


class Case(NamedTuple):
    kind: str
    id: str
    shapes: dict  # argument -> shape (None: argument not given)
    dtypes: dict  # argument -> dtype (default float32)
    flags: dict  # descriptor fields
    exc: Optional[type]  # None: the call must succeed
    pieces: tuple  # regexes that must all occur in the message (besides the op name)


def case(kind, tag, base, *, shapes=None, dtypes=None, flags=None, exc=None, pieces=()):
    """The call of `kind` with the shapes `base`, updated by `shapes`."""
    s = dict(base)
    s.update(shapes or {})
    return Case(kind, f"{kind}-{tag}", s, dict(dtypes or {}), dict(flags or {}), exc, tuple(pieces))


def shape_error(make, kind, name, got, *want, **kw):
    """A case built by `make` (a suite's case builder): a ValueError naming `name`, the
    shape `got` and every shape in `want`."""
    return make(
        kind,
        f"{name}{list(got)}",
        shapes={name: got},
        exc=ValueError,
        pieces=(name_re(name), shape_re(got), *(shape_re(w) for w in want)),
        **kw,
    )


def dtype_errors(make, kind, names, dtypes):
    """For each argument in `names`: each of `dtypes`, and float64 among float32
    arguments; a TypeError naming the argument and the dtypes."""
    out = []
    for name in names:
        for dt in dtypes:
            out.append(dtype_error(make, kind, f"{name}-{dt}", name, {name: dt}, dt))
        tag = f"{name}-float64-among-float32"
        out.append(dtype_error(make, kind, tag, name, {name: "float64"}, "float64", "float32"))
    return out


def dtype_error(make, kind, tag, name, dtypes, *shown):
    """A TypeError naming `name` and every dtype in `shown`."""
    return make(kind, tag, dtypes=dtypes, exc=TypeError, pieces=(name_re(name), *shown))


def float32_among_float64(make, kind, name, base):
    """`name` in float32, the other arguments of `base` in float64: a TypeError naming
    `name` and both dtypes."""
    dtypes = {n: "float64" for n in base if n != name}
    tag = f"{name}-float32-among-float64"
    return dtype_error(make, kind, tag, name, dtypes, "float64", "float32")


def other_batch(make, kind, *pieces):
    """A source of N + 1 sequences: the arguments sized by N no longer fit; a ValueError
    whose message has every one of `pieces`."""
    return make(kind, "source-N+1", shapes={"source": (T, N + 1, I)}, exc=ValueError, pieces=pieces)


def unique(cases):
    """The first case of each id."""
    seen = {}
    for c in cases:
        seen.setdefault(c.id, c)
    return list(seen.values())


# ---- arguments -----------------------------------------------------------------------


def rand(rng, shape, dtype):
    a = rng.uniform(-0.5, 0.5, shape)
    if np.dtype(dtype).kind == "b":
        return a > 0
    if np.dtype(dtype).kind in "iu":
        return (a * 10).astype(dtype)
    return a.astype(dtype)


def build_args(rng, c):
    return {
        name: rand(rng, shape, c.dtypes.get(name, "float32"))
        for name, shape in c.shapes.items()
        if shape is not None
    }

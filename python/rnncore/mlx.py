"""``mlx.nn.GRU``, ``mlx.nn.LSTM`` and ``mlx.nn.RNN`` computed by rnncore.

Each class is a subclass of MLX's own layer (the same constructor, parameters, shapes and
initialisation), whose call is an ``mx.custom_function``: the forward is one fused rnncore
operation run in training mode, and its VJP is one call of rnncore's gradient operation
on the training state that forward returned, so ``mx.grad``, ``nn.value_and_grad`` and
MLX's optimizers work without a second forward.

    import rnncore.mlx
    layer = rnncore.mlx.GRU(16, 32)
    loss_and_grad = mlx.nn.value_and_grad(layer, lambda x: layer(x).sum())

Arrays are float32, or float16 or bfloat16 (storage types: float32 arithmetic; bfloat16
on Metal from macOS 14, as for the operations; mixed ones promote as mlx.nn's arithmetic
does) — rnncore's CPU backend computes them; on
an Apple GPU build, pass ``rnncore_device="metal"``. Under ``mx.compile`` the layer
refuses with a clear error: rnncore runs outside MLX's graph, on evaluated arrays.
"""

from __future__ import annotations

import weakref

import ml_dtypes
import mlx.core as mx
import mlx.nn
import numpy as np

import rnncore as _rc

from . import GRUDescriptor, LSTMDescriptor, RNNDescriptor
from . import nn as _nn
from ._ops import KINDS

__all__ = ["GRU", "LSTM", "RNN"]


def _mx(a):
    """An MLX array of rnncore's result a (ml_dtypes.bfloat16 through its bits)."""
    if a.dtype == ml_dtypes.bfloat16:
        return mx.array(a.view(np.uint16)).view(mx.bfloat16)
    return mx.array(a)


def _compile_refusal(label, e):
    return RuntimeError(
        f"[{label}] cannot run under mx.compile: rnncore computes outside MLX's graph, "
        f"on evaluated arrays; call the layer outside the compiled function ({e})"
    )


def _evaluated(arrays, label):
    """The arrays, evaluated together: one round trip to MLX's stream, where reading each
    lazily (numpy's buffer access evaluates it) cost one apiece, about 9 us each and 13 of
    them in a T=1 GRU training step."""
    present = [a for a in arrays if a is not None]
    try:
        mx.eval(*present)
    except ValueError as e:  # an array being traced (mx.compile) has no value yet
        raise _compile_refusal(label, e) from e
    return arrays


def _numpy(a, label):
    if a is None:
        return None
    if a.dtype not in (mx.float32, mx.float16, mx.bfloat16):
        raise TypeError(
            f"[{label}] arrays must be float32, float16 or bfloat16 but one has dtype {a.dtype}"
        )
    try:
        if a.dtype == mx.bfloat16:  # no buffer format for it: its bits, viewed
            return np.array(a.view(mx.uint16), copy=False).view(ml_dtypes.bfloat16)
        return np.array(a, copy=False)
    except ValueError as e:  # an array being traced (mx.compile) has no value yet
        raise _compile_refusal(label, e) from e


# Each layer's custom functions by call form, outside the module (an MLX module's attributes
# are its children, and a custom_function cannot be copied or pickled), kept while it lives.
_FUNCTIONS: dict = {}


def _functions_of(module):
    functions = _FUNCTIONS.get(id(module))
    if functions is None:
        functions = _FUNCTIONS[id(module)] = {}
        weakref.finalize(module, _FUNCTIONS.pop, id(module), None)
    return functions


class _Layer:
    """The call of the three layers: a custom function over the present arrays."""

    _kind: str
    _names: tuple  # MLX's parameter names: input weight, recurrent weight, biases

    def _descriptor(self, training):
        raise NotImplementedError

    def _call(self, x, hidden, cell=None):
        label = f"rnncore.mlx.{type(self).__name__}"
        H = self.hidden_size
        I = self[self._names[0]].shape[1]  # noqa: E741
        if x.ndim not in (2, 3) or x.shape[-1] != I:
            raise ValueError(
                f"[{label}] x must have shape (N, L, {I}) or (L, {I}) but has {x.shape}"
            )
        unbatched = x.ndim == 2
        N = 1 if unbatched else x.shape[0]
        for arg, value in (("hidden", hidden), ("cell", cell)):
            expected = (H,) if unbatched else (N, H)
            if value is not None and tuple(value.shape) != expected:
                raise ValueError(
                    f"[{label}] {arg} must have shape {expected} but has {tuple(value.shape)}"
                )
        present = {"x": x, "hidden": hidden, "cell": cell}
        present.update({n: self.get(n) for n in self._names})
        names = tuple(k for k, v in present.items() if v is not None)
        # Arrays of different floating types promote as mlx.nn's arithmetic does (bfloat16
        # x with float32 weights: float32); the casts are in the graph, so each array's
        # gradient comes back in its own type. Other types are refused (_numpy).
        types = {present[n].dtype for n in names}
        if len(types) > 1 and types <= {mx.float32, mx.float16, mx.bfloat16}:
            common = mx.result_type(*types)
            present = {n: present[n].astype(common) for n in names}
        device = getattr(self, "rnncore_device", None)
        # The custom function of this layer's call form, made once: building it (descriptors,
        # closures, mx.custom_function) cost about 12 us of a 90 us call at T=1.
        cache = _functions_of(self)
        key = (unbatched, names, device)
        f = cache.get(key)
        if f is None:
            f = cache[key] = self._function(label, unbatched, names, device)
        out = f(*[present[n] for n in names])
        return out[0] if self._kind != "lstm" else (out[0], out[1])

    def _function(self, label, unbatched, names, device):
        """The mx.custom_function of one call form (input arrays `names`), and its VJP."""
        kind, layer_names = self._kind, self._names
        train_desc, grad_desc = self._descriptor(True), self._descriptor(False)
        roles = dict(
            zip(layer_names, ("input_weight", "recurrent_weight", "bias", "secondary_bias"))
        )

        def to_time_major(a):
            return np.ascontiguousarray(a[:, None, :] if unbatched else a.transpose(1, 0, 2))

        def from_time_major(a):
            return _mx(a[:, 0, :] if unbatched else a.transpose(1, 0, 2))

        def arrays(values):
            v = {n: _numpy(a, label) for n, a in zip(names, _evaluated(values, label))}
            ops = {roles[n]: v[n] for n in layer_names if n in v}
            for n in ("hidden", "cell"):
                if n in v:
                    ops["init_state" if n == "hidden" else "init_cell"] = (
                        v[n][None, :] if unbatched else v[n]
                    )
            return to_time_major(v["x"]), ops

        @mx.custom_function
        def f(*values):
            source, ops = arrays(values)
            R = ops.pop("recurrent_weight")
            out = getattr(_rc, KINDS[kind].forward)(
                source, R, descriptor=train_desc, device=device, **ops
            )
            result = [from_time_major(out.state)]
            if kind == "lstm":
                result.append(from_time_major(out.cell))
            return (*result, _mx(out.z_state))

        @f.vjp
        def f_vjp(primals, cotangents, outputs):
            _evaluated([*primals, *cotangents, *outputs], label)  # one round trip for all
            source, ops = arrays(primals)
            R = ops.pop("recurrent_weight")
            dy = to_time_major(_numpy(cotangents[0], label))
            z = _numpy(outputs[-1], label)
            state = to_time_major(_numpy(outputs[0], label))
            common = dict(descriptor=grad_desc, device=device, **ops)
            if kind == "gru":
                g = _rc.gru_gradients(source, R, dy, z, state, **common)
            elif kind == "lstm":
                cells = to_time_major(_numpy(outputs[1], label))
                dc = to_time_major(_numpy(cotangents[1], label))
                g = _rc.lstm_gradients(source, R, dy, z, cells, cell_gradient=dc, **common)
            else:
                g = _rc.single_gate_rnn_gradients(source, R, dy, z, **common)
            by_name = {
                "x": from_time_major(g.source),
                "hidden": None
                if g.init_state is None
                else _mx(g.init_state[0] if unbatched else g.init_state),
                "cell": None,
            }
            if kind == "lstm" and g.init_cell is not None:
                by_name["cell"] = _mx(g.init_cell[0] if unbatched else g.init_cell)
            for n in layer_names:
                role = roles[n]
                by_name[n] = None if getattr(g, role, None) is None else _mx(getattr(g, role))
            return tuple(by_name[n] for n in names)

        return f


class GRU(_Layer, mlx.nn.GRU):
    __doc__ = mlx.nn.GRU.__doc__
    _kind = "gru"
    _names = ("Wx", "Wh", "b", "bhn")

    def __init__(self, input_size, hidden_size, bias=True, *, rnncore_device=None):
        mlx.nn.GRU.__init__(self, input_size, hidden_size, bias)
        self.rnncore_device = rnncore_device

    def _descriptor(self, training):
        return GRUDescriptor(reset_gate_first=True, reset_after=True, training=training)

    def __call__(self, x, hidden=None):
        return self._call(x, hidden)


class LSTM(_Layer, mlx.nn.LSTM):
    __doc__ = mlx.nn.LSTM.__doc__
    _kind = "lstm"
    _names = ("Wx", "Wh", "bias")

    def __init__(self, input_size, hidden_size, bias=True, *, rnncore_device=None):
        mlx.nn.LSTM.__init__(self, input_size, hidden_size, bias)
        self.rnncore_device = rnncore_device

    def _descriptor(self, training):
        return LSTMDescriptor(produce_cell=True, training=training)

    def __call__(self, x, hidden=None, cell=None):
        return self._call(x, hidden, cell)


class RNN(_Layer, mlx.nn.RNN):
    __doc__ = mlx.nn.RNN.__doc__
    _kind = "rnn"
    _names = ("Wxh", "Whh", "bias")

    def __init__(
        self, input_size, hidden_size, bias=True, nonlinearity=None, *, rnncore_device=None
    ):
        mlx.nn.RNN.__init__(self, input_size, hidden_size, bias, nonlinearity)
        self.rnncore_device = rnncore_device
        self._activation = _nn._activation(nonlinearity)

    def _descriptor(self, training):
        return RNNDescriptor(activation=self._activation, training=training)

    def __call__(self, x, hidden=None):
        return self._call(x, hidden)

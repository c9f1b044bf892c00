"""Drop-in ``torch.nn.GRU``, ``torch.nn.LSTM`` and ``torch.nn.RNN`` computed by rnncore.

Each class is a subclass of torch's own module: the same constructor, parameters
(``weight_ih_l0``, ``weight_hh_l0_reverse``, ...), initialisation, ``state_dict`` and
``forward(input, hx)`` results (``output, h_n`` or ``output, (h_n, c_n)``, batched and
unbatched), so ``load_state_dict`` works both ways with torch's modules. ``forward`` runs
every layer as one fused rnncore operation (both directions in one call) inside a
``torch.autograd.Function`` whose backward is one call of rnncore's gradient operation,
on the training state of the same forward. float32 and float64, CPU tensors.

    import rnncore.torch
    gru = rnncore.torch.GRU(256, 256, num_layers=2, batch_first=True, bidirectional=True)
    output, h_n = gru(x)          # as torch.nn.GRU
    output.sum().backward()       # gradients of every parameter and of x

``rnncore_device`` (keyword) picks rnncore's device for the computation ("cpu" by
default; tensors stay on torch's CPU device either way).
"""

from __future__ import annotations

import copy
import weakref

import ml_dtypes
import numpy as np
import torch
from torch.autograd.function import once_differentiable

import rnncore
from rnncore.convert import (
    TORCH_PARAMETERS,
    _one_direction,
    gradients_to_torch,
    torch_suffix,
    weights_from_torch,
)
from rnncore.nn import layer_forward, layer_gradients

__all__ = ["GRU", "LSTM", "RNN"]

# float16 and bfloat16 are storage types on the CPU (float32 arithmetic).
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _numpy(t):
    # A strided view, not torch.contiguous(): rnncore copies it on its own thread, where a torch
    # copy would wake OpenMP threads that then spin beside rnncore's pool.
    if t is None:
        return None
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:  # numpy's is ml_dtypes': the same bits, viewed
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _autocast_dtype():
    """The CPU autocast's dtype where it is on and 16-bit, else None."""
    if not torch.is_autocast_enabled("cpu"):
        return None
    dtype = torch.get_autocast_dtype("cpu")
    return dtype if dtype in (torch.float16, torch.bfloat16) else None


def _tensor(a):
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# Per module: its _Spec and numpy views of its parameters, so that a call (a generation
# loop's one step) does not rebuild them; a view sees in-place updates of its parameter.
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _views(where, params):
    """numpy views of `params` (no copies), kept at `where` (module, layer) and made again
    when a parameter is another tensor or its memory, shape, strides or dtype changed
    (``.data = ...``, ``set_``)."""
    entry = _CACHE.setdefault(where[0], {})
    key = [(p, p.data_ptr(), p.shape, p.stride(), p.dtype) for p in params]
    old = entry.get(where[1])
    if (
        old is None
        or len(old[0]) != len(key)
        or any(a[0] is not b[0] or a[1:] != b[1:] for a, b in zip(old[0], key))
    ):
        old = entry[where[1]] = (key, [_numpy(p) for p in params])
    return old[1]


def _run(spec, x, h0, c0, params, training, where=None):
    """One layer's forward operation on the tensors' memory (no copies of contiguous ones)."""
    views = _views(where, params) if where is not None else [_numpy(p) for p in params]
    arrays = spec.arrays(views)
    inits = {"init_state": _numpy(h0)}
    if spec.kind == "lstm":
        inits["init_cell"] = _numpy(c0)
    x_np = _numpy(x)
    desc = spec.descriptor(training)
    out = layer_forward(spec.kind, x_np, arrays, inits, desc, spec.device, spec.lengths)
    return x_np, arrays, inits, out


def _outputs(spec, out):
    if spec.kind == "lstm":
        return _tensor(out.state), _tensor(out.cell)
    return _tensor(out.state)


class _Layer(torch.autograd.Function):
    """One layer, both directions: forward and gradients each one rnncore call."""

    @staticmethod
    def forward(ctx, spec, where, x, h0, c0, *params):
        ctx.spec = spec
        ctx.saved = _run(spec, x, h0, c0, params, True, where)
        return _outputs(spec, ctx.saved[3])

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dc=None):
        spec = ctx.spec
        x_np, arrays, inits, out = ctx.saved
        g = layer_gradients(
            spec.kind,
            x_np,
            arrays,
            inits,
            out,
            _numpy(dy),
            _numpy(dc),
            spec.descriptor(False),
            spec.device,
            spec.lengths,
        )
        grads = spec.parameter_gradients(g)
        dh0 = _tensor(g.init_state)
        dc0 = _tensor(getattr(g, "init_cell", None))
        return (None, None, _tensor(g.source), dh0, dc0, *[_tensor(a) for a in grads])


def _nonlinearity(module):
    # torch.nn.RNN's attribute; GRUs and LSTMs have none, and getattr's default on them went
    # through nn.Module.__getattr__'s miss (an AttributeError made and caught, 5 us of a
    # decoder's step).
    return module.nonlinearity if isinstance(module, torch.nn.RNN) else "tanh"


class _Spec:
    """How one layer's torch parameters map onto the operation (the contract's "Mapping
    other frameworks onto the descriptors")."""

    def __init__(self, module, kind, lengths=None):
        self.kind = kind
        self.lengths = lengths  # [N] int64, or None
        self.H = module.hidden_size
        self.D = 2 if module.bidirectional else 1
        self.bias = module.bias
        self.device = module.rnncore_device
        self.activation = (
            rnncore.Activation.RELU if _nonlinearity(module) == "relu" else rnncore.Activation.TANH
        )
        self.per_direction = 4 if module.bias else 2

    @staticmethod
    def of(module, kind, lengths):
        """The module's spec (kept while its configuration is unchanged), with `lengths`."""
        key = (
            kind,
            module.hidden_size,
            module.bidirectional,
            module.bias,
            module.rnncore_device,
            _nonlinearity(module),
        )
        entry = _CACHE.setdefault(module, {})
        spec = entry.get("spec")
        if spec is None or spec[0] != key:
            spec = entry["spec"] = (key, _Spec(module, kind))
        if lengths is None:
            return spec[1]
        with_lengths = copy.copy(spec[1])
        with_lengths.lengths = lengths
        return with_lengths

    def descriptor(self, training):
        # Made per call (a microsecond), not kept: a descriptor kept by the module outlived
        # the extension at the exit of a script ending with the module alive, and nanobind
        # reported it as leaked.
        bidirectional = self.D == 2
        if self.kind == "gru":
            return rnncore.GRUDescriptor(
                reset_gate_first=True,
                reset_after=True,
                bidirectional=bidirectional,
                training=training,
            )
        if self.kind == "lstm":
            return rnncore.LSTMDescriptor(
                bidirectional=bidirectional, produce_cell=True, training=training
            )
        return rnncore.RNNDescriptor(
            activation=self.activation, bidirectional=bidirectional, training=training
        )

    def _directions(self, params):
        """[w_ih, w_hh, (b_ih, b_hh)] per direction -> one mapping per direction."""
        k = self.per_direction
        return [dict(zip(TORCH_PARAMETERS, params[d * k : (d + 1) * k])) for d in range(self.D)]

    def arrays(self, params):
        """The layer's parameters as the operation's arrays (rnncore.convert)."""
        if self.D == 1:  # (weights_from_torch's mapping and checks: 2 us of a T=1 call)
            return _one_direction(self.kind, dict(zip(TORCH_PARAMETERS, params)))
        return weights_from_torch(self.kind, self._directions(params))

    def parameter_gradients(self, g):
        """The gradients of [w_ih, w_hh, (b_ih, b_hh)] per direction, in that order."""
        by_name = gradients_to_torch(self.kind, g, bidirectional=self.D == 2)
        return [
            by_name[name + torch_suffix(0, d)]
            for d in range(self.D)
            for name in TORCH_PARAMETERS[: self.per_direction]
        ]


class _Module:
    """forward() of the three modules over torch's own parameters."""

    _kind: str

    def __init__(self, *args, rnncore_device=None, **kwargs):
        super().__init__(*args, **kwargs)  # torch's module: arguments, parameters, init
        if getattr(self, "proj_size", 0) > 0:
            raise ValueError(
                f"[rnncore.torch.{type(self).__name__}] proj_size > 0 is not supported "
                "(rnncore has no projected LSTM yet); use torch.nn.LSTM"
            )
        self.rnncore_device = rnncore_device

    def forward(self, input, hx=None):  # noqa: A002 (torch's argument name)
        packed = input if isinstance(input, torch.nn.utils.rnn.PackedSequence) else None
        lengths = None
        if packed is not None:
            # A packed batch is a padded one plus its lengths (docs/semantics.md): rnncore
            # runs each row for its own length, and the output is packed as the input was.
            input, lengths_t = torch.nn.utils.rnn.pad_packed_sequence(packed)
            lengths = lengths_t.numpy().astype(np.int64)
            if self.batch_first:
                input = input.transpose(0, 1)
        name = f"rnncore.torch.{type(self).__name__}"
        if not input.is_cpu:
            raise TypeError(f"[{name}] input is on {input.device}; rnncore.torch takes CPU tensors")
        if input.dim() not in (2, 3) or input.shape[-1] != self.input_size:
            layout = "(N, L, {})" if self.batch_first else "(L, N, {})"
            raise ValueError(
                f"[{name}] input must have shape {layout.format(self.input_size)} or "
                f"(L, {self.input_size}) but has {tuple(input.shape)}"
            )
        params = self._flat_weights
        cast = _autocast_dtype()
        if cast is not None:
            # Under the CPU's autocast to a 16-bit type the layers run in its storage, as
            # torch.nn.LSTM and RNN do on the CPU (its GRU stays float32); float32 tensors
            # only, as autocast casts. The casts are in the graph, so the parameters'
            # gradients come back in their own dtype.
            def to(t):
                return t.to(cast) if t is not None and t.dtype == torch.float32 else t

            input = to(input)  # noqa: A001
            params = [to(p) for p in params]
            hx = tuple(to(h) for h in hx) if isinstance(hx, tuple) else to(hx)
        dtype = params[0].dtype
        if input.dtype != dtype or dtype not in _DTYPES:
            raise TypeError(
                f"[{name}] input has dtype {input.dtype} and the parameters {dtype}; "
                "both must be float32, float64, float16 or bfloat16"
            )
        unbatched = input.dim() == 2
        x = (
            input.unsqueeze(1)
            if unbatched
            else (input.transpose(0, 1) if self.batch_first else input)
        )
        N = x.shape[1]
        D, H, L = (2 if self.bidirectional else 1), self.hidden_size, self.num_layers
        h0, c0 = (hx if hx is not None else (None, None)) if self._kind == "lstm" else (hx, None)
        h0 = self._state("hx" if self._kind != "lstm" else "h_0", h0, N, unbatched, x.shape[0])
        c0 = self._state("c_0", c0, N, unbatched, x.shape[0])

        spec = _Spec.of(self, self._kind, lengths)
        grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in [x, h0, c0, *params]
        )
        per_layer = spec.per_direction * D
        h_n, c_n = [], []
        for layer in range(L):
            p = params[layer * per_layer : (layer + 1) * per_layer]
            args = (x, self._layer_state(h0, layer), self._layer_state(c0, layer), *p)
            if grad:
                out = _Layer.apply(spec, (self, layer), *args)
                y, cells = out if self._kind == "lstm" else (out, None)
                h_n += self._finals(y, D, H, lengths)
                if cells is not None:
                    c_n += self._finals(cells, D, H, lengths)
            else:  # inference: no training state, no graph; the finals sliced in numpy
                result = _run(spec, args[0], args[1], args[2], p, False, (self, layer))[3]
                out = _outputs(spec, result)
                y, cells = out if self._kind == "lstm" else (out, None)
                h_n += self._finals(result.state, D, H, lengths)
                if cells is not None:
                    c_n += self._finals(result.cell, D, H, lengths)
            x = y
            if self.dropout and self.training and layer < L - 1:
                x = torch.nn.functional.dropout(x, self.dropout, training=True)
        if packed is not None:
            output = self._pack_as(x, packed)
        else:
            output = x.squeeze(1) if unbatched else (x.transpose(0, 1) if self.batch_first else x)
        h_n = self._stack(h_n)
        if unbatched:
            h_n = h_n.squeeze(1)
        if self._kind == "lstm":
            c_n = self._stack(c_n)
            return output, (h_n, c_n.squeeze(1) if unbatched else c_n)
        return output, h_n

    @staticmethod
    def _stack(finals):
        """torch.stack of the finals: tensors (in autograd's graph), or numpy arrays at
        inference (stacked by numpy: torch's slicing and stacking cost a T=1 call 5 us)."""
        if isinstance(finals[0], torch.Tensor):
            return torch.stack(finals)
        if len(finals) == 1:  # one layer, one direction: np.stack took 3 us of a T=1 call
            return _tensor(finals[0][None].copy())
        return _tensor(np.stack(finals))

    @staticmethod
    def _finals(y, D, H, lengths=None):
        """The final state of each direction (y a tensor or a numpy array): y[T-1, :, :H]
        (each row's last step with lengths), and y[0, :, H:] backwards."""
        if lengths is None:
            last = y[-1, :, :H]
        elif isinstance(y, torch.Tensor):  # packed rows have lengths >= 1 (torch refuses 0)
            last = y[torch.from_numpy(lengths - 1), torch.arange(y.shape[1]), :H]
        else:
            last = y[lengths - 1, np.arange(y.shape[1]), :H]
        return [last] + ([y[0, :, H:]] if D == 2 else [])

    @staticmethod
    def _pack_as(y, packed):
        """The padded time-major output y as a PackedSequence laid out as `packed`: step t
        holds the batch_sizes[t] longest rows, in sorted_indices order."""
        order = packed.sorted_indices
        rows = order if order is not None else torch.arange(y.shape[1])
        sizes = packed.batch_sizes.tolist()
        t = torch.repeat_interleave(torch.arange(len(sizes)), packed.batch_sizes)
        n = torch.cat([rows[:b] for b in sizes])
        return torch.nn.utils.rnn.PackedSequence(
            y[t, n], packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices
        )

    def _state(self, arg, value, N, unbatched, T):
        if value is None:
            return None
        LD = self.num_layers * (2 if self.bidirectional else 1)
        expected = (LD, self.hidden_size) if unbatched else (LD, N, self.hidden_size)
        if tuple(value.shape) != expected:
            hint = ""
            if not unbatched and T != N and tuple(value.shape) == (LD, T, self.hidden_size):
                hint = f" (is input {'time-major' if self.batch_first else 'batch-first'}? "
                hint += f"this module has batch_first={self.batch_first})"
            raise ValueError(
                f"[rnncore.torch.{type(self).__name__}] {arg} must have shape {expected} "
                f"but has {tuple(value.shape)}{hint}"
            )
        return value.unsqueeze(1) if unbatched else value

    def _layer_state(self, states, layer):
        """[L * D, N, H] -> this layer's [N, D * H] (the operation's layout)."""
        if states is None:
            return None
        if not self.bidirectional:
            return states[layer]  # (one view: a decoder's step spent 3 us a state on the rest)
        s = states[2 * layer : 2 * layer + 2]
        return s.transpose(0, 1).reshape(s.shape[1], 2 * self.hidden_size)


class GRU(_Module, torch.nn.GRU):
    __doc__ = torch.nn.GRU.__doc__
    _kind = "gru"


class LSTM(_Module, torch.nn.LSTM):
    __doc__ = torch.nn.LSTM.__doc__
    _kind = "lstm"


class RNN(_Module, torch.nn.RNN):
    __doc__ = torch.nn.RNN.__doc__
    _kind = "rnn"

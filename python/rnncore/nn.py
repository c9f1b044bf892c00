"""Recurrent layers on numpy arrays, with the API of ``mlx.nn.GRU``, ``mlx.nn.LSTM`` and
``mlx.nn.RNN`` and the fused operations underneath.

With its defaults a layer is MLX's: the same constructor, parameter names (``Wx``, ``Wh``,
``b``, ``bhn``; ``Wx``, ``Wh``, ``bias``; ``Wxh``, ``Whh``, ``bias``), shapes, gate order and
initialisation, batch-first ``NLD`` or unbatched ``LD`` input, an optional ``NH`` / ``H``
hidden (and cell) state, and all hidden states as output (``NLH`` / ``LH``; the LSTM also
returns its cells), so an MLX model's weights load unchanged and give the same outputs.
Beyond MLX: ``num_layers``, ``bidirectional``, ``batch_first=False`` for time-major data,
``device`` and ``dtype``, and :meth:`backward`, the gradients of every parameter and input
for a given output gradient, through the fused gradient operations (one call per layer).

    layer = rnncore.nn.GRU(16, 32, num_layers=2, bidirectional=True)
    y = layer(x)                      # x [N, L, 16] -> y [N, L, 64]
    grads = layer.backward(dy)        # {"Wx": ..., "Wh_l1_reverse": ..., "x": ...}

Parameters of layer ``l`` and direction are named as MLX's with torch's suffixes:
``Wx`` (layer 0, forward), ``Wx_reverse`` (layer 0, backward), ``Wx_l1``, ``Wx_l1_reverse``...
With several layers or directions the hidden state is ``[num_layers * D, N, H]`` (torch's
``h_0`` layout; ``[num_layers * D, H]`` unbatched); with one, MLX's ``[N, H]`` (or ``[H]``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np

import rnncore as _rc

from . import (
    Activation,
    GRUDescriptor,
    LSTMDescriptor,
    RNNDescriptor,
)
from ._ops import KINDS, activation_fields

__all__ = ["GRU", "LSTM", "RNN", "from_keras", "from_mlx", "from_onnx", "from_torch"]

# Non-linearities an RNN layer takes, by name (MLX passes a callable such as mlx.nn.tanh).
_NONLINEARITIES = {
    "tanh": Activation.TANH,
    "relu": Activation.RELU,
    "sigmoid": Activation.SIGMOID,
    "hard_sigmoid": Activation.HARD_SIGMOID,
    "identity": Activation.NONE,
}


def layer_forward(kind, source, arrays, inits, descriptor, device, lengths=None):
    """One layer's forward operation: `arrays` the weights as the operation's keywords
    (input_weight, recurrent_weight, bias, secondary_bias), `inits` its initial states,
    `lengths` the rows' sequence lengths (None: all T)."""
    op = getattr(_rc, KINDS[kind].forward)
    return op(
        source,
        descriptor=descriptor,
        device=device,
        sequence_lengths=lengths,
        **arrays,
        **inits,
    )


def layer_gradients(kind, source, arrays, inits, result, dy, dc, descriptor, device, lengths=None):
    """The gradient operation of `layer_forward`'s call that gave `result` (run with
    training), for the state gradient `dy` and, for the LSTM, the per-step cell gradient."""
    rest = dict(arrays)
    R = rest.pop("recurrent_weight")
    forward_output = ()  # the forward output the gradients read: GRU h, LSTM c
    if kind == "gru":
        forward_output = (result.state,)
    elif kind == "lstm":
        forward_output = (result.cell,)
        rest["cell_gradient"] = dc
    op = getattr(_rc, KINDS[kind].gradients)
    return op(
        source,
        R,
        dy,
        result.z_state,
        *forward_output,
        descriptor=descriptor,
        device=device,
        sequence_lengths=lengths,
        **rest,
        **inits,
    )


class _Recurrent:
    """What the three layers share: parameters, layouts, the layer loop and its backward."""

    _gates: int  # G
    _weights: tuple  # MLX's names: input weight, recurrent weight, bias[, secondary bias]

    def __init__(
        self,
        input_size,
        hidden_size,
        bias=True,
        *,
        num_layers=1,
        bidirectional=False,
        batch_first=True,
        reverse=False,
        activations=None,
        device=None,
        dtype=np.float32,
    ):
        name = type(self).__name__
        for arg, value, low in (
            ("input_size", input_size, 1),
            ("hidden_size", hidden_size, 1),
            ("num_layers", num_layers, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(
                    f"[rnncore.nn.{name}] {arg} must be an int >= {low}, not {value!r}"
                )
        self.dtype = np.dtype(dtype)
        if self.dtype.name not in ("float32", "float64", "float16", "bfloat16"):
            raise TypeError(
                f"[rnncore.nn.{name}] dtype must be float32, float64, float16 or bfloat16"
            )
        self.input_size = int(input_size)
        self.hidden_size = H = int(hidden_size)
        self.num_layers = int(num_layers)
        self.bidirectional = bool(bidirectional)
        self.batch_first = bool(batch_first)
        if reverse and bidirectional:
            raise ValueError(f"[rnncore.nn.{name}] reverse and bidirectional exclude each other")
        self.reverse = bool(reverse)
        self.activations = self._check_activations(activations)
        self.device = device
        self.bias = bool(bias)  # replaced by the bias array of the same name (RNN, LSTM)
        self.training = True  # as an mlx.nn.Module: keep what backward() needs
        self.lengths = None  # the sequence lengths of a call that gives none (from_onnx)
        self._tape = None
        self._names = []
        scale = 1.0 / math.sqrt(H)
        rng = np.random.default_rng()
        G = self._gates
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else self.directions * H
            for d in range(self.directions):
                shapes = [(G * H, width), (G * H, H)]
                if bias:
                    shapes.append((G * H,))
                    if len(self._weights) == 4:
                        shapes.append((H,))
                for base, shape in zip(self._weights, shapes):
                    value = rng.uniform(-scale, scale, shape).astype(self.dtype)
                    self._add(base + self._suffix(layer, d), value)
                if not bias:
                    for base in self._weights[2:]:
                        object.__setattr__(self, base + self._suffix(layer, d), None)

    def _check_activations(self, activations):
        """{descriptor activation field: Activation} overriding the layer's defaults."""
        allowed = activation_fields(self._descriptor_class)
        activations = dict(activations or {})
        for field, value in activations.items():
            if field not in allowed:
                raise ValueError(
                    f"[rnncore.nn.{type(self).__name__}] activations has no field {field!r}; "
                    f"the fields are {allowed}"
                )
            activations[field] = Activation(value)
        return activations

    def _descriptor(self, training):
        fields = dict(self._fields(), **self.activations)
        return self._descriptor_class(
            bidirectional=self.bidirectional, reverse=self.reverse, training=training, **fields
        )

    # ---- parameters ---------------------------------------------------------------------------

    @property
    def directions(self):
        return 2 if self.bidirectional else 1

    @staticmethod
    def _suffix(layer, direction):
        return ("" if layer == 0 else f"_l{layer}") + ("_reverse" if direction else "")

    def _add(self, name, value):
        self._names.append(name)
        object.__setattr__(self, name, value)

    def parameters(self):
        """The parameters by name (the arrays themselves, not copies)."""
        return {n: getattr(self, n) for n in self._names}

    def update(self, parameters):
        """Sets parameters by name from arrays of the same shapes (any float dtype; stored in
        the layer's dtype). Unknown names and wrong shapes raise."""
        for n, value in parameters.items():
            if n not in self._names:
                raise ValueError(f"[{self._label}] has no parameter {n!r}; it has {self._names}")
            old = getattr(self, n)
            value = np.ascontiguousarray(value, dtype=self.dtype)
            if value.shape != old.shape:
                raise ValueError(
                    f"[{self._label}] parameter {n} must have shape {old.shape} "
                    f"but has {value.shape}"
                )
            object.__setattr__(self, n, value)
        return self

    def train(self, mode=True):
        self.training = bool(mode)
        if not mode:
            self._tape = None
        return self

    def eval(self):
        return self.train(False)

    @property
    def _label(self):
        return f"rnncore.nn.{type(self).__name__}"

    def __repr__(self):
        return (
            f"{type(self).__name__}(input_size={self.input_size}, hidden_size={self.hidden_size}, "
            f"bias={self.bias is not None and self.bias is not False}, "
            f"num_layers={self.num_layers}, bidirectional={self.bidirectional}, "
            f"batch_first={self.batch_first})"
        )

    def _layer_arrays(self, layer):
        """This layer's parameters in the operation's layout, both directions concatenated."""
        per_dir = [
            [getattr(self, base + self._suffix(layer, d)) for base in self._weights]
            for d in range(self.directions)
        ]
        cat = np.concatenate if self.bidirectional else (lambda xs: xs[0])
        out = {
            "input_weight": cat([p[0] for p in per_dir]),
            "recurrent_weight": np.stack([p[1] for p in per_dir])
            if self.bidirectional
            else per_dir[0][1],
            "bias": None if per_dir[0][2] is None else cat([p[2] for p in per_dir]),
        }
        if len(self._weights) == 4:
            out["secondary_bias"] = None if per_dir[0][3] is None else cat([p[3] for p in per_dir])
        return out

    # ---- layouts ------------------------------------------------------------------------------

    def _sequence(self, x):
        """x in the user's layout -> time-major [T, N, I], and whether it was unbatched."""
        x = np.asarray(x)
        if x.dtype.kind != "f" and x.dtype.name != "bfloat16":  # ml_dtypes' kind is "V"
            raise TypeError(f"[{self._label}] x must be a float array but has dtype {x.dtype}")
        layout = "(N, L, {})" if self.batch_first else "(L, N, {})"
        if x.ndim not in (2, 3) or x.shape[-1] != self.input_size:
            raise ValueError(
                f"[{self._label}] x must have shape {layout.format(self.input_size)} or "
                f"(L, {self.input_size}) but has {x.shape}"
            )
        x = x.astype(self.dtype, copy=False)
        if x.ndim == 2:
            return np.ascontiguousarray(x[:, None, :]), True
        return np.ascontiguousarray(x.transpose(1, 0, 2) if self.batch_first else x), False

    def _from_sequence(self, y, unbatched):
        if unbatched:
            return y[:, 0, :]
        return np.ascontiguousarray(y.transpose(1, 0, 2)) if self.batch_first else y

    def _state(self, arg, value, N, unbatched, T=None):
        """A hidden or cell state in the user's shape -> [num_layers * D, N, H], or None."""
        if value is None:
            return None
        value = np.asarray(value)
        LD, H = self.num_layers * self.directions, self.hidden_size

        def shape(batch):
            s = ((batch,) if not unbatched else ()) + (H,)
            return (LD,) + s if LD > 1 or value.ndim == len(s) + 1 else s

        expected = shape(N)
        if value.shape != expected:
            hint = ""
            if T is not None and T != N and value.shape == shape(T):
                hint = f" (is x {'time-major' if self.batch_first else 'batch-first'}? this "
                hint += f"layer has batch_first={self.batch_first})"
            raise ValueError(
                f"[{self._label}] {arg} must have shape {expected} but has {value.shape}{hint}"
            )
        value = value.astype(self.dtype, copy=False).reshape(LD, N, H)
        return value

    def _layer_state(self, states, layer, N):
        """[num_layers * D, N, H] -> this layer's [N, D * H] (the operations' layout)."""
        if states is None:
            return None
        D, H = self.directions, self.hidden_size
        return np.ascontiguousarray(states[layer * D : (layer + 1) * D].transpose(1, 0, 2)).reshape(
            N, D * H
        )

    # ---- forward and backward -----------------------------------------------------------------

    def _lengths(self, lengths, N, T, unbatched):
        """`lengths` ([N] integers in [0, L]; an int for unbatched x) as an int64 array."""
        if lengths is None:
            return None
        value = np.asarray(lengths)
        expected = () if unbatched else (N,)
        if unbatched and value.shape == (1,):
            value = value.reshape(())
        if value.dtype.kind not in "iu":
            raise TypeError(
                f"[{self._label}] lengths must hold integers but has dtype {value.dtype}"
            )
        if value.shape != expected:
            raise ValueError(
                f"[{self._label}] lengths must have shape {expected} (one per sequence) "
                f"but has {value.shape}"
            )
        bad = (value < 0) | (value > T)
        if np.any(bad):
            raise ValueError(
                f"[{self._label}] lengths must lie in [0, {T}] (the sequence length) but "
                f"holds {value[bad].flat[0]}"
            )
        return value.reshape(N).astype(np.int64)

    def _forward_op(self, inp, arrays, inits, desc, lengths):
        return layer_forward(self._kind, inp, arrays, inits, desc, self.device, lengths)

    def _gradient_op(self, inp, arrays, inits, result, dy, dc, desc, lengths):
        return layer_gradients(
            self._kind, inp, arrays, inits, result, dy, dc, desc, self.device, lengths
        )

    def _run(self, x, hidden, cell=None, lengths=None):
        seq, unbatched = self._sequence(x)
        T, N = seq.shape[:2]
        h0 = self._state("hidden", hidden, N, unbatched, T)
        c0 = self._state("cell", cell, N, unbatched, T)
        lengths = self._lengths(self.lengths if lengths is None else lengths, N, T, unbatched)
        desc = self._descriptor(self.training)
        tape = []
        inp = seq
        result = None
        for layer in range(self.num_layers):
            arrays = self._layer_arrays(layer)
            inits = {"init_state": self._layer_state(h0, layer, N)}
            if c0 is not None:
                inits["init_cell"] = self._layer_state(c0, layer, N)
            result = self._forward_op(inp, arrays, inits, desc, lengths)
            tape.append((inp, arrays, inits, result))
            inp = result.state
        self._tape = (
            (tape, unbatched, hidden is not None, cell is not None, lengths)
            if self.training
            else None
        )
        return result, unbatched

    def _backward(self, d_state, d_cell=None):
        if self._tape is None:
            raise RuntimeError(
                f"[{self._label}] backward() needs a forward call in training mode (layer.train())"
            )
        tape, unbatched, had_hidden, had_cell, lengths = self._tape
        dy, _ = self._output_gradient("d_output", d_state, tape, unbatched)
        dc = None
        if d_cell is not None:
            dc, _ = self._output_gradient("d_cell", d_cell, tape, unbatched)
        desc = self._descriptor(False)
        grads = {}
        d_hidden0, d_cell0 = [], []
        for layer in reversed(range(self.num_layers)):
            inp, arrays, inits, result = tape[layer]
            g = self._gradient_op(inp, arrays, inits, result, dy, dc, desc, lengths)
            self._store_gradients(layer, g, grads)
            d_hidden0.append(g.init_state)
            d_cell0.append(getattr(g, "init_cell", None))
            dy, dc = g.source, None
        N = tape[0][0].shape[1]
        grads["x"] = self._from_sequence(dy, unbatched)
        for name, had, per_layer in (
            ("hidden", had_hidden, d_hidden0),
            ("cell", had_cell, d_cell0),
        ):
            if had:
                grads[name] = self._state_gradient(per_layer[::-1], N, unbatched)
        return grads

    def _output_gradient(self, arg, value, tape, unbatched):
        T, N = tape[0][0].shape[:2]
        DH = self.directions * self.hidden_size
        value = np.asarray(value, dtype=self.dtype)
        if unbatched:
            expected = (T, DH)
        else:
            expected = (N, T, DH) if self.batch_first else (T, N, DH)
        if value.shape != expected:
            raise ValueError(
                f"[{self._label}] {arg} must have shape {expected} but has {value.shape}"
            )
        if unbatched:
            return np.ascontiguousarray(value[:, None, :]), expected
        return np.ascontiguousarray(
            value.transpose(1, 0, 2) if self.batch_first else value
        ), expected

    def _state_gradient(self, per_layer, N, unbatched):
        """Per layer [N, D * H] -> the user's hidden-state shape."""
        D, H = self.directions, self.hidden_size
        out = np.concatenate([g.reshape(N, D, H).transpose(1, 0, 2) for g in per_layer])
        if self.num_layers * D == 1:
            out = out[0]
        return out[..., 0, :] if unbatched else np.ascontiguousarray(out)

    def _store_gradients(self, layer, g, grads):
        GH = self._gates * self.hidden_size
        H = self.hidden_size
        for d in range(self.directions):
            sfx = self._suffix(layer, d)
            w, r = self._weights[0], self._weights[1]
            grads[w + sfx] = g.input_weight[d * GH : (d + 1) * GH]
            grads[r + sfx] = g.recurrent_weight[d] if self.bidirectional else g.recurrent_weight
            if g.bias is not None:
                grads[self._weights[2] + sfx] = g.bias[d * GH : (d + 1) * GH]
            if len(self._weights) == 4 and g.secondary_bias is not None:
                grads[self._weights[3] + sfx] = g.secondary_bias[d * H : (d + 1) * H]

    def backward(self, d_output):
        """Gradients of every parameter (by name) and of the input ``x`` (and ``hidden`` when
        the forward was given one), for ``d_output``, the gradient of the loss with respect to
        the output of the last forward call (made in training mode), in that output's shape.
        """
        return self._backward(d_output)


class GRU(_Recurrent):
    """A GRU layer: ``mlx.nn.GRU``'s API (PyTorch's gate order r, z, n and reset-after
    form; ``b`` is added to the input projection, ``bhn`` inside the reset product), plus
    ``num_layers``, ``bidirectional``, ``batch_first``, ``device``, ``dtype`` and
    :meth:`backward`. ``layer(x, hidden=None)`` returns all hidden states."""

    _kind, _gates = "gru", 3
    _descriptor_class = GRUDescriptor

    def __init__(self, input_size, hidden_size, bias=True, *, reset_after=True, **options):
        # Reset-before (Keras' reset_after=False, ONNX's linear_before_reset=0) has no bhn.
        self.reset_after = bool(reset_after)
        self._weights = ("Wx", "Wh", "b", "bhn") if reset_after else ("Wx", "Wh", "b")
        super().__init__(input_size, hidden_size, bias, **options)
        self.bias = bias

    def _fields(self):
        return {"reset_gate_first": True, "reset_after": self.reset_after}

    def __call__(self, x, hidden=None, *, lengths=None):
        result, unbatched = self._run(x, hidden, lengths=lengths)
        return self._from_sequence(result.state, unbatched)


class RNN(_Recurrent):
    """An Elman layer: ``mlx.nn.RNN``'s API (``Wxh``, ``Whh``, ``bias``; ``nonlinearity`` a
    callable such as ``mlx.nn.tanh`` / ``mlx.nn.relu``, or a name: tanh, relu, sigmoid,
    hard_sigmoid, identity; default tanh), plus the options of every rnncore.nn layer."""

    _kind, _gates = "rnn", 1
    _weights = ("Wxh", "Whh", "bias")
    _descriptor_class = RNNDescriptor

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity=None, **options):
        self.nonlinearity = _activation(nonlinearity)
        super().__init__(input_size, hidden_size, bias, **options)

    def _fields(self):
        return {"activation": self.nonlinearity}

    def __call__(self, x, hidden=None, *, lengths=None):
        result, unbatched = self._run(x, hidden, lengths=lengths)
        return self._from_sequence(result.state, unbatched)


class LSTM(_Recurrent):
    """An LSTM layer: ``mlx.nn.LSTM``'s API (gates i, f, g, o; one bias), plus the options of
    every rnncore.nn layer. ``layer(x, hidden=None, cell=None)`` returns all hidden states
    and all cells of the last layer, in the same shape."""

    _kind, _gates = "lstm", 4
    _weights = ("Wx", "Wh", "bias")
    _descriptor_class = LSTMDescriptor

    def _fields(self):
        return {"produce_cell": True}

    def __call__(self, x, hidden=None, cell=None, *, lengths=None):
        result, unbatched = self._run(x, hidden, cell, lengths)
        return (
            self._from_sequence(result.state, unbatched),
            self._from_sequence(result.cell, unbatched),
        )

    def backward(self, d_output, d_cell=None):
        """Gradients of every parameter and of ``x`` (and ``hidden`` / ``cell`` when given)
        for the gradients of the loss with respect to the two outputs of the last forward
        call: the hidden states ``d_output`` and, optionally, the cells ``d_cell``."""
        return self._backward(d_output, d_cell)


def _activation(nonlinearity):
    if nonlinearity is None:
        return Activation.TANH
    if isinstance(nonlinearity, Activation):
        return nonlinearity
    name = nonlinearity if isinstance(nonlinearity, str) else getattr(nonlinearity, "__name__", "")
    key = name.lower().replace("hardsigmoid", "hard_sigmoid")
    if key not in _NONLINEARITIES:
        raise ValueError(
            f"[rnncore.nn.RNN] nonlinearity must be one of {sorted(_NONLINEARITIES)} "
            f"(or a callable of that name) but is {nonlinearity!r}"
        )
    return _NONLINEARITIES[key]


# ---- importers ------------------------------------------------------------------------------
# Each returns an rnncore.nn layer holding the source's weights in the layer's own layout
# (MLX's names, PyTorch's gate order); the mappings are the contract's ("Mapping other
# frameworks onto the descriptors").

_GATE_ORDERS = {"gru": ("r", "z", "n"), "lstm": ("i", "f", "g", "o"), "rnn": ("h",)}


def _blocks(a, order):
    """Reorders the gate blocks of `a` (axis 0): block k of the result is block order[k]."""
    parts = np.split(np.asarray(a), len(order), axis=0)
    return np.concatenate([parts[k] for k in order], axis=0)


def _set_direction(layer, index, direction, values):
    """values: the layer's parameter values of one direction, by base name."""
    suffix = layer._suffix(index, direction)
    layer.update({base + suffix: v for base, v in values.items() if v is not None})


def from_torch(module, kind=None, *, nonlinearity="tanh", batch_first=False, **options):
    """An rnncore.nn layer with the options and weights of a ``torch.nn.GRU``, ``LSTM`` or
    ``RNN`` (any num_layers, bidirectional, batch_first, bias, nonlinearity), or of such a
    module's ``state_dict`` with its `kind` ("gru", "lstm" or "rnn"; the sizes, layers,
    directions and biases are read from the tensors, `nonlinearity` and `batch_first` given
    as for torch). The layer's ``hidden`` is torch's ``h_0`` ([num_layers * D, N, H]; [N, H]
    with one layer and one direction). `options` (device, dtype, ...) go to the layer."""
    from . import convert

    where = "[rnncore.nn.from_torch]"
    if isinstance(module, Mapping):
        state = module
        if kind not in _CLASSES:
            raise ValueError(
                f"{where} a state_dict needs kind='gru', 'lstm' or 'rnn', not {kind!r}"
            )
        if "weight_ih_l0" not in state:
            raise ValueError(f"{where} the state_dict has no weight_ih_l0: {sorted(state)[:4]}")
        num_layers = sum(1 for k in state if re.fullmatch(r"weight_ih_l\d+", k))
        bidirectional = "weight_ih_l0_reverse" in state
        bias = "bias_ih_l0" in state
        input_size = state["weight_ih_l0"].shape[1]
        hidden_size = state["weight_hh_l0"].shape[1]
    else:
        kind = convert.torch_kind(module)
        state = module.state_dict()
        num_layers, bidirectional, bias = module.num_layers, module.bidirectional, module.bias
        input_size, hidden_size = module.input_size, module.hidden_size
        nonlinearity = getattr(module, "nonlinearity", nonlinearity)
        batch_first = module.batch_first
    if any(k.startswith("weight_hr") for k in state):
        raise ValueError(f"{where} proj_size > 0 has no rnncore counterpart")
    dtype = options.pop("dtype", None) or _numpy_dtype(state["weight_ih_l0"])
    extra = {"nonlinearity": nonlinearity} if kind == "rnn" else {}
    layer = _CLASSES[kind](
        input_size,
        hidden_size,
        bias,
        num_layers=num_layers,
        bidirectional=bidirectional,
        batch_first=batch_first,
        dtype=dtype,
        **extra,
        **options,
    )
    for index in range(num_layers):
        for d, p in enumerate(convert.torch_directions(state, index, bidirectional)):
            w = convert.weights_from_torch(kind, [p])
            values = dict(zip(layer._weights, (w["input_weight"], w["recurrent_weight"])))
            if bias:
                values[layer._weights[2]] = w["bias"]
                if kind == "gru":
                    values["bhn"] = w["secondary_bias"]
            _set_direction(layer, index, d, values)
    return layer


def _numpy_dtype(tensor):
    """numpy's dtype of a torch tensor or of an array."""
    return np.dtype(str(tensor.dtype).replace("torch.", ""))


def from_mlx(module, **options):
    """An rnncore.nn layer with the weights of an ``mlx.nn.GRU``, ``LSTM`` or ``RNN`` (or of
    an rnncore.mlx layer): the same names, so they load unchanged."""
    import mlx.nn as mnn
    from mlx.utils import tree_flatten

    classes = ((mnn.GRU, "gru"), (mnn.LSTM, "lstm"), (mnn.RNN, "rnn"))
    kind = next((k for cls, k in classes if isinstance(module, cls)), None)
    if kind is None:
        raise TypeError(
            f"[rnncore.nn.from_mlx] module must be an mlx.nn.GRU, LSTM or RNN, "
            f"not {type(module).__name__}"
        )
    params = {k: np.array(v) for k, v in tree_flatten(module.parameters())}
    first = "Wxh" if kind == "rnn" else "Wx"
    extra = {"nonlinearity": module.nonlinearity} if kind == "rnn" else {}
    has_bias = any(k in params for k in ("b", "bias"))
    layer = _CLASSES[kind](params[first].shape[1], module.hidden_size, has_bias, **extra, **options)
    return layer.update(params)


# Keras' and ONNX's activation names; Keras 3's hard_sigmoid is relu6(x + 3) / 6, not the
# contract's clamp(0.2 x + 0.5, 0, 1), so it is refused.
_KERAS_ACTIVATIONS = {
    "tanh": Activation.TANH,
    "sigmoid": Activation.SIGMOID,
    "relu": Activation.RELU,
    "linear": Activation.NONE,
}
_ONNX_ACTIVATIONS = {
    "Tanh": Activation.TANH,
    "Sigmoid": Activation.SIGMOID,
    "Relu": Activation.RELU,
    "HardSigmoid": Activation.HARD_SIGMOID,
    "Affine": Activation.NONE,
}


def _keras_activation(config, key):
    value = config[key]
    name = value if isinstance(value, str) else getattr(value, "__name__", str(value))
    if name not in _KERAS_ACTIVATIONS:
        raise ValueError(
            f"[rnncore.nn.from_keras] {key}={name!r} has no counterpart in the contract's "
            f"activations ({sorted(_KERAS_ACTIVATIONS)})"
        )
    return _KERAS_ACTIVATIONS[name]


def from_keras(layer, **options):
    """An rnncore.nn layer (batch-first) with the options and weights of a Keras 3 ``GRU``
    (both ``reset_after`` settings), ``LSTM`` or ``SimpleRNN``; ``go_backwards`` becomes
    ``reverse`` (outputs in processing order, as Keras returns them)."""
    kind = {"GRU": "gru", "LSTM": "lstm", "SimpleRNN": "rnn"}.get(type(layer).__name__)
    if kind is None:
        raise TypeError(
            f"[rnncore.nn.from_keras] layer must be a Keras GRU, LSTM or SimpleRNN, "
            f"not {type(layer).__name__}"
        )
    config = layer.get_config()
    import keras

    # The variables' backend values: torch's through .numpy() (np.array of a Keras Variable
    # or a torch Parameter warns under numpy 2), the other backends' through Keras.
    weights = [
        w.value.detach().cpu().numpy()
        if hasattr(w.value, "detach")
        else keras.ops.convert_to_numpy(w.value)
        for w in layer.weights
    ]
    if len(weights) < 2:
        raise ValueError("[rnncore.nn.from_keras] the layer is not built: call it once first")
    kernel, recurrent = weights[0], weights[1]
    bias = weights[2] if config.get("use_bias", True) and len(weights) > 2 else None
    I, H = kernel.shape[0], config["units"]  # noqa: E741
    act = _keras_activation(config, "activation")
    options.setdefault("dtype", kernel.dtype)
    common = dict(batch_first=True, reverse=bool(config.get("go_backwards")), **options)
    if kind == "rnn":
        out = RNN(I, H, bias is not None, nonlinearity=act, **common)
        return out.update(
            {"Wxh": kernel.T, "Whh": recurrent.T, "bias": bias}
            if bias is not None
            else {"Wxh": kernel.T, "Whh": recurrent.T}
        )
    rec = _keras_activation(config, "recurrent_activation")
    if kind == "lstm":
        acts = {
            "input_gate_activation": rec,
            "forget_gate_activation": rec,
            "output_gate_activation": rec,
            "cell_gate_activation": act,
            "activation": act,
        }
        out = LSTM(I, H, bias is not None, activations=acts, **common)
        values = {"Wx": kernel.T, "Wh": recurrent.T, "bias": bias}
    else:
        order = (1, 0, 2)  # Keras' z, r, h -> r, z, h
        reset_after = bool(config.get("reset_after", True))
        acts = {
            "update_gate_activation": rec,
            "reset_gate_activation": rec,
            "output_gate_activation": act,
        }
        out = GRU(I, H, bias is not None, reset_after=reset_after, activations=acts, **common)
        values = {"Wx": _blocks(kernel.T, order), "Wh": _blocks(recurrent.T, order)}
        if bias is not None and reset_after:
            b_in, b_rec = _blocks(bias[0], order), _blocks(bias[1], order)
            values["b"] = np.concatenate([b_in[: 2 * H] + b_rec[: 2 * H], b_in[2 * H :]])
            values["bhn"] = b_rec[2 * H :]
        elif bias is not None:
            values["b"] = _blocks(bias, order)
    return out.update({k: v for k, v in values.items() if v is not None})


def from_onnx(model, node=None, **options):
    """An rnncore.nn layer with the options and weights of an ONNX ``RNN``, ``GRU`` or
    ``LSTM`` node (`model` an ``onnx.ModelProto`` or a path; `node` its name when the
    graph has several). ``layout = 0`` gives a time-major layer, ``layout = 1`` a
    batch-first one; ``direction = "reverse"`` a reverse layer, whose outputs are in
    processing order (ONNX's ``Y`` is them flipped in time; docs/semantics.md, "ONNX
    layouts and directions"). What the contract cannot express (``clip``,
    ``activation_alpha`` / ``activation_beta`` other than HardSigmoid's 0.2 / 0.5,
    ``input_forget``, non-zero peepholes) raises. The node's ``sequence_lens`` is the layer's
    ``lengths=`` argument; a constant one (a graph initializer) becomes ``layer.lengths``,
    used by calls that give none."""
    import onnx
    from onnx import helper, numpy_helper

    from .convert import ONNX_GATE_ORDER

    where = "[rnncore.nn.from_onnx]"
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model)
    nodes = [n for n in model.graph.node if n.op_type in ("RNN", "GRU", "LSTM")]
    if node is not None:
        nodes = [n for n in nodes if n.name == node]
    if len(nodes) != 1:
        names = [n.name for n in model.graph.node if n.op_type in ("RNN", "GRU", "LSTM")]
        raise ValueError(
            f"{where} node={node!r} must name one RNN, GRU or LSTM node; the graph has {names}"
        )
    n = nodes[0]
    kind = n.op_type.lower()
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    names = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
    inputs = dict(zip(names, list(n.input) + [""] * 8))

    def const(name):
        if not inputs[name]:
            return None
        if inputs[name] not in consts:
            raise ValueError(f"{where} {name} ({inputs[name]!r}) must be a graph initializer")
        return consts[inputs[name]]

    for refused in ("clip", "input_forget"):
        if attrs.get(refused):
            raise ValueError(f"{where} {refused}={attrs[refused]} has no counterpart in rnncore")
    P = const("P")
    if P is not None and np.any(P):
        raise ValueError(f"{where} peepholes P (non-zero) have no counterpart in rnncore.nn")
    W, R, B = const("W"), const("R"), const("B")
    D, GH, I = W.shape  # noqa: E741
    H = int(attrs.get("hidden_size", R.shape[-1]))
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    per_dir = {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"], "lstm": ["Sigmoid", "Tanh", "Tanh"]}
    default = per_dir[kind]
    acts = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    acts = acts or default * D
    if D == 2 and acts[: len(default)] != acts[len(default) :] or len(acts) != len(default) * D:
        raise ValueError(f"{where} activations {acts}: both directions must use the same ones")
    # Parameterised activations consume activation_alpha / activation_beta in order; the
    # contract has HardSigmoid(0.2, 0.5) and Affine(1, 0) (the identity) among them.
    alphas = list(attrs.get("activation_alpha", []))
    betas = list(attrs.get("activation_beta", []))
    expressible = {"HardSigmoid": (0.2, 0.5), "Affine": (1.0, 0.0)}
    for a in acts:
        if a in expressible:
            want = expressible[a]
            got = (alphas.pop(0) if alphas else want[0], betas.pop(0) if betas else want[1])
            if any(abs(g - w) > 1e-7 for g, w in zip(got, want)):
                raise ValueError(
                    f"{where} {a} with alpha, beta = ({got[0]:.6g}, {got[1]:.6g}) differs "
                    f"from the contract's {want}"
                )
        elif a not in _ONNX_ACTIVATIONS:
            raise ValueError(
                f"{where} activation {a!r} has no counterpart in the contract's activations"
            )
    if alphas or betas:
        raise ValueError(f"{where} activation_alpha/beta left over: {alphas}/{betas}")
    f = [_ONNX_ACTIVATIONS[a] for a in acts[: len(default)]]
    options.setdefault("dtype", W.dtype)
    common = dict(
        num_layers=1,
        bidirectional=direction == "bidirectional",
        reverse=direction == "reverse",
        batch_first=int(attrs.get("layout", 0)) == 1,
        **options,
    )
    inverse = np.argsort(ONNX_GATE_ORDER[kind])  # ONNX blocks -> PyTorch's (the layer's)
    bias = B is not None
    if kind == "rnn":
        layer = RNN(I, H, bias, nonlinearity=f[0], **common)
    elif kind == "gru":
        reset_after = bool(attrs.get("linear_before_reset", 0))
        acts_ = {
            "update_gate_activation": f[0],
            "reset_gate_activation": f[0],
            "output_gate_activation": f[1],
        }
        layer = GRU(I, H, bias, reset_after=reset_after, activations=acts_, **common)
    else:
        acts_ = {
            "input_gate_activation": f[0],
            "forget_gate_activation": f[0],
            "output_gate_activation": f[0],
            "cell_gate_activation": f[1],
            "activation": f[2],
        }
        layer = LSTM(I, H, bias, activations=acts_, **common)
    for d in range(D):
        values = dict(zip(layer._weights, (_blocks(W[d], inverse), _blocks(R[d], inverse))))
        if bias:
            wb, rb = _blocks(B[d][:GH], inverse), _blocks(B[d][GH:], inverse)
            if kind == "gru" and layer.reset_after:
                values["b"] = np.concatenate([wb[: 2 * H] + rb[: 2 * H], wb[2 * H :]])
                values["bhn"] = rb[2 * H :]
            else:
                values[layer._weights[2]] = wb + rb
        _set_direction(layer, 0, d, values)
    if inputs["sequence_lens"] in consts:
        layer.lengths = np.asarray(consts[inputs["sequence_lens"]], np.int64)
    return layer


_CLASSES = {"gru": GRU, "lstm": LSTM, "rnn": RNN}

"""What the bench times: the configurations, their random problems, and rnncore and its
peers (PyTorch, ONNX Runtime, MLX, a numpy loop) behind one small interface.

The weights are drawn once in PyTorch's layout and given to every implementation through
rnncore.convert (the contract's mappings, docs/semantics.md, "Mapping other frameworks
onto the descriptors"). Results are compared in one layout: "y" [T, N, D*H] (time-aligned),
and for training "dx" [T, N, I] plus the weight gradients under PyTorch's parameter names
(``weight_ih_l0``, ``bias_hh_l0_reverse``, ...; rnncore's by convert.gradients_to_torch).
"""

from __future__ import annotations

import importlib.util
import zlib
from dataclasses import dataclass
from typing import Callable, NamedTuple

import ml_dtypes  # noqa: F401 (registers bfloat16 with numpy: np.dtype("bfloat16"))
import numpy as np

from .. import convert
from .._ops import KINDS, rel_err
from .numpy_loop import NumpyLayer

MODES = ("inference", "training")
SHORT_DTYPE = {"float32": "", "float16": "-f16", "float64": "-f64", "bfloat16": "-bf16"}


@dataclass(frozen=True)
class Config:
    """One recurrent layer: kind ("rnn" with tanh; "lstm"; "gru" in PyTorch's flavour,
    reset after, gate blocks r, z, n), sizes, direction and the dtype of every array."""

    kind: str
    T: int
    N: int
    H: int
    I: int = 0  # noqa: E741 (the contract's name for the input size; 0: equal to H)
    bidirectional: bool = False
    dtype: str = "float32"

    def __post_init__(self):
        if not self.I:
            object.__setattr__(self, "I", self.H)

    @property
    def D(self):
        return 2 if self.bidirectional else 1

    @property
    def G(self):
        return KINDS[self.kind].gates

    @property
    def name(self):
        prefix = "bi" if self.bidirectional else ""
        size = f"-I{self.I}-H{self.H}" if self.I != self.H else f"-H{self.H}"
        return f"{prefix}{self.kind}-T{self.T}-N{self.N}{size}{SHORT_DTYPE[self.dtype]}"

    def describe(self):
        bi = "bidirectional " if self.bidirectional else ""
        return f"{bi}{self.kind.upper()} T={self.T} N={self.N} I={self.I} H={self.H} {self.dtype}"

    def flops(self, mode):
        """Approximate floating-point operations: the GEMM work, 2*T*N*G*H*(I+H) per
        direction for the forward; training (forward + backward) counts three times that."""
        forward = 2 * self.D * self.T * self.N * self.G * self.H * (self.I + self.H)
        return forward if mode == "inference" else 3 * forward


CONFIGS = [
    Config("gru", 100, 1, 256),
    Config("lstm", 100, 1, 256),
    Config("gru", 100, 32, 256),
    Config("lstm", 100, 32, 256),
    Config("gru", 50, 128, 1024),
    Config("gru", 1000, 1, 64),
    # One step at batch 1: a decoder calling its layer a step at a time.
    Config("gru", 1, 1, 256),
    Config("lstm", 1, 1, 256),
    # One step of 8 sequences: a decoder's batch or beam.
    Config("gru", 1, 8, 256),
    Config("lstm", 1, 8, 256),
    Config("gru", 100, 32, 256, bidirectional=True),
    Config("lstm", 100, 32, 256, bidirectional=True),
    Config("gru", 100, 32, 256, dtype="float64"),
    Config("rnn", 100, 32, 256),
    # float16 storage (float32 arithmetic) on every device; peers that lack it are skipped.
    Config("gru", 100, 32, 256, dtype="float16"),
    Config("lstm", 100, 32, 256, dtype="float16"),
    Config("gru", 100, 1, 256, dtype="float16"),
    Config("lstm", 100, 1, 256, dtype="float16"),
    # bfloat16 storage on the CPU; PyTorch's bfloat16 layers (oneDNN) are the peer.
    Config("gru", 100, 1, 256, dtype="bfloat16"),
    Config("lstm", 100, 1, 256, dtype="bfloat16"),
    Config("gru", 100, 32, 256, dtype="bfloat16"),
    Config("lstm", 100, 32, 256, dtype="bfloat16"),
]
BY_NAME = {c.name: c for c in CONFIGS}
# What --quick runs unless configurations are named.
QUICK = [
    "gru-T100-N1-H256",
    "lstm-T100-N32-H256",
    "gru-T1000-N1-H64",
    "bigru-T100-N32-H256",
    "gru-T100-N32-H256-f64",
    "gru-T100-N32-H256-f16",
]
# metal-emulated --quick: sizes the host emulator of the Metal kernels runs in a moment.
EMULATED_QUICK = [
    Config(kind, 5, 2, 16, dtype=dtype)
    for dtype in ("float32", "float16")
    for kind in ("gru", "lstm")
]
BY_NAME.update((c.name, c) for c in EMULATED_QUICK)


class Problem:
    """Input x [T, N, I], upstream gradient dy [T, N, D*H] and, per direction, the weights
    in PyTorch's layout (``torch_params``: weight_ih, weight_hh, bias_ih, bias_hh), all
    holding values of the configuration's dtype (rounded once, so every implementation
    gets the same numbers). Seeded by the configuration's name unless `seed` is given."""

    def __init__(self, config, seed=None):
        c = self.config = config
        rng = np.random.default_rng(zlib.crc32(c.name.encode()) if seed is None else seed)
        dtype = np.dtype(c.dtype)
        GH = c.G * c.H

        def normal(shape, scale):
            return (scale * rng.standard_normal(shape)).astype(dtype)

        self.x = normal((c.T, c.N, c.I), 1.0)
        self.dy = normal((c.T, c.N, c.D * c.H), 1.0)
        self.torch_params = [
            {
                "weight_ih": normal((GH, c.I), 1.0 / np.sqrt(c.I)),
                "weight_hh": normal((GH, c.H), 0.8 / np.sqrt(c.H)),
                "bias_ih": normal((GH,), 0.2),
                "bias_hh": normal((GH,), 0.2),
            }
            for _ in range(c.D)
        ]

    def rnncore_weights(self):
        return convert.weights_from_torch(self.config.kind, self.torch_params)

    def descriptor(self, training):
        c = self.config
        return convert.descriptor_for_torch(
            c.kind, bidirectional=c.bidirectional, training=training
        )

    def torch_state_dict(self):
        """The parameters under PyTorch's names (``weight_ih_l0``, ...)."""
        return {
            name + convert.torch_suffix(0, d): value
            for d, params in enumerate(self.torch_params)
            for name, value in params.items()
        }


def compare(actual, expected):
    """Relative error of every field of `expected` in `actual` (inf where it is missing)."""
    return {k: rel_err(actual[k], v) if k in actual else float("inf") for k, v in expected.items()}


# ---- implementations ---------------------------------------------------------------------


class NotSupported(Exception):
    """What an implementation cannot run (a dtype, a mode, a device): reported, not failed."""


class Prepared(NamedTuple):
    """run() is the timed work; sync() waits for the device and is timed with it;
    result(run()) gives numpy arrays in the layout of the module docstring."""

    run: Callable
    result: Callable
    sync: Callable = lambda: None


def _gradient_result(kind, bidirectional, y, dx, gradients):
    """The compared fields of a training run from rnncore-layout weight gradients."""
    out = {"y": y, "dx": dx}
    out.update(convert.gradients_to_torch(kind, gradients, bidirectional=bidirectional))
    return out


class RnncoreImpl:
    """rnncore on the benchmarked device."""

    name = "rnncore"

    def __init__(self, device):
        import rnncore

        self.rc, self.device = rnncore, device
        self.label = "rnncore"

    def prepare(self, problem, mode, threads=None):
        rc, c, device = self.rc, problem.config, self.device
        kind = KINDS[c.kind]
        w = problem.rnncore_weights()
        R = w.pop("recurrent_weight")
        x, dy = problem.x, problem.dy
        forward, gradients = getattr(rc, kind.forward), getattr(rc, kind.gradients)
        desc = problem.descriptor(training=mode == "training")

        def call_forward():
            try:
                return forward(x, R, **w, descriptor=desc, device=device)
            except TypeError as e:  # "[gru] device 'cpu' computes ..., not float16"
                if f"not {c.dtype}" not in str(e):
                    raise
                raise NotSupported("rnncore: " + str(e).split(";")[0].split("] ", 1)[-1]) from None

        call_forward()  # what the device cannot compute is found before timing
        if mode == "inference":
            return Prepared(call_forward, lambda out: {"y": out.state})
        # The inputs the gradient function takes after source_gradient and z_state.
        saved = {"gru": "state", "lstm": "cell", "rnn": None}[c.kind]

        def run():
            out = call_forward()
            extra = [getattr(out, saved)] if saved else []
            return out, gradients(
                x, R, dy, out.z_state, *extra, **w, descriptor=desc, device=device
            )

        def result(out_grads):
            out, g = out_grads
            return _gradient_result(c.kind, c.bidirectional, out.state, g.source, g)

        return Prepared(run, result)


def _tensor(torch, a):
    """A torch tensor of numpy array a (ml_dtypes.bfloat16 through its bits)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _array(t):
    """A numpy array of tensor t (bfloat16 widened to float32: numpy has no bfloat16)."""
    t = t.detach().cpu()
    return (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()


class TorchImpl:
    """PyTorch's nn.RNN / nn.GRU / nn.LSTM; training is the forward and y.backward(dy)."""

    name = "torch"

    def __init__(self, device="cpu"):
        import torch

        if device == "mps" and not torch.backends.mps.is_available():
            raise RuntimeError("torch has no MPS device")
        self.torch, self.device = torch, device
        self.label = f"torch ({device})"
        self.sync = torch.mps.synchronize if device == "mps" else (lambda: None)

    def set_threads(self, threads):
        self.torch.set_num_threads(threads)

    def module(self, problem, dtype=None):
        """The layer holding problem's weights, in `dtype` (default: problem's), on the
        device."""
        torch, c = self.torch, problem.config
        cls = {"rnn": torch.nn.RNN, "gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[c.kind]
        dtype = dtype or getattr(torch, c.dtype)
        module = cls(c.I, c.H, bidirectional=c.bidirectional, dtype=dtype)
        state = {k: _tensor(torch, v).to(dtype) for k, v in problem.torch_state_dict().items()}
        module.load_state_dict(state)
        return module.to(self.device)

    def prepare(self, problem, mode, threads=None, dtype=None):
        torch, c = self.torch, problem.config
        module = self.module(problem, dtype)
        dtype = dtype or getattr(torch, c.dtype)
        x = _tensor(torch, problem.x).to(self.device, dtype)
        numpy = _array
        if mode == "inference":
            module.eval()

            def run():
                with torch.inference_mode():
                    return module(x)[0]

            return Prepared(run, lambda y: {"y": numpy(y)}, self.sync)

        module.train()
        x.requires_grad_(True)
        dy = _tensor(torch, problem.dy).to(self.device, dtype)
        params = dict(module.named_parameters())

        def run():
            x.grad = None
            for p in params.values():
                p.grad = None
            y = module(x)[0]
            y.backward(dy)
            return y

        def result(y):
            out = {"y": numpy(y), "dx": numpy(x.grad)}
            out.update({name: numpy(p.grad) for name, p in params.items()})
            return out

        return Prepared(run, result, self.sync)

    def reference(self, problem):
        """Outputs and gradients in float64 on the CPU from the same (rounded) numbers."""
        cpu = TorchImpl("cpu") if self.device != "cpu" else self
        run, result, _ = cpu.prepare(problem, "training", dtype=self.torch.float64)
        return result(run())


class OnnxRuntimeImpl:
    """ONNX Runtime's RNN / GRU / LSTM operators (one-node models; inference only). Its CPU
    operators take float32 and float64 only: a float16 or bfloat16 configuration runs them
    in float32 on the same values, in the same rounds as rnncore's narrow storage (the
    float32 time that storage is meant to halve)."""

    name = label = "onnxruntime"

    def __init__(self, device="cpu"):
        import onnxruntime

        self.ort = onnxruntime

    def where(self, config):
        """Where a configuration runs: float32 for float16 and bfloat16 ones."""
        return f"{self.label} (float32)" if config.dtype in ("float16", "bfloat16") else self.label

    def model(self, problem):
        """A one-node ONNX model (opset 14) with the weights as initializers."""
        from onnx import TensorProto, helper, numpy_helper

        c = problem.config
        W, R, B = convert.onnx_weights_from_torch(c.kind, problem.torch_params)
        if c.dtype != "float64":
            W, R, B = (a.astype(np.float32) for a in (W, R, B))
        elem = TensorProto.DOUBLE if c.dtype == "float64" else TensorProto.FLOAT
        attrs = {"hidden_size": c.H, "direction": "bidirectional" if c.bidirectional else "forward"}
        if c.kind == "gru":
            attrs["linear_before_reset"] = 1  # PyTorch's GRU (the contract's reset_after)
        if c.kind == "rnn":
            attrs["activations"] = ["Tanh"] * c.D
        node = helper.make_node(c.kind.upper(), ["X", "W", "R", "B"], ["Y"], **attrs)
        graph = helper.make_graph(
            [node],
            "bench",
            [helper.make_tensor_value_info("X", elem, [c.T, c.N, c.I])],
            [helper.make_tensor_value_info("Y", elem, [c.T, c.D, c.N, c.H])],
            initializer=[numpy_helper.from_array(a, n) for n, a in (("W", W), ("R", R), ("B", B))],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        model.ir_version = 8
        return model.SerializeToString()

    def prepare(self, problem, mode, threads=None):
        if mode != "inference":
            raise NotSupported("ONNX Runtime has no training for these operators")
        ort, c = self.ort, problem.config
        narrow = c.dtype in ("float16", "bfloat16")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or 0  # 0: its own default
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 4  # its refusals are reported here, not logged
        feed = {"X": problem.x.astype(np.float32) if narrow else problem.x}
        try:
            session = ort.InferenceSession(
                self.model(problem), options, providers=["CPUExecutionProvider"]
            )
            session.run(None, feed)  # some refusals (float64 GRU) only come at run time
        except Exception as e:  # noqa: BLE001 (onnxruntime raises its own exception types)
            message = str(e)
            if "support" not in message.lower():
                raise
            reason = message.split("Status Message:")[-1].strip()
            raise NotSupported(f"onnxruntime: {reason}") from None

        def result(outputs):
            Y = outputs[0]  # [T, D, N, H]
            return {"y": Y.transpose(0, 2, 1, 3).reshape(c.T, c.N, c.D * c.H)}

        return Prepared(lambda: session.run(None, feed), result)


class MlxImpl:
    """MLX's mlx.nn.RNN / GRU / LSTM (bidirectional: a second layer on reversed time).

    MLX's layers hold rnncore's weights under other names (docs/semantics.md): the GRU's
    ``Wx``, ``Wh``, ``b`` and ``bhn`` are input_weight, recurrent_weight, bias and
    secondary_bias; the LSTM's ``bias`` and the RNN's are the summed bias. Some MLX
    versions store the weights transposed ([in, out]): `transposed` asks the installed one.
    Inputs are batch-major [N, T, I].
    """

    name = "mlx"
    NAMES = {  # rnncore's name -> MLX's, per kind
        "gru": {
            "input_weight": "Wx",
            "recurrent_weight": "Wh",
            "bias": "b",
            "secondary_bias": "bhn",
        },
        "lstm": {"input_weight": "Wx", "recurrent_weight": "Wh", "bias": "bias"},
        "rnn": {"input_weight": "Wxh", "recurrent_weight": "Whh", "bias": "bias"},
    }

    def __init__(self, stream="cpu"):
        import mlx.core as mx
        import mlx.nn as nn

        if stream == "gpu" and not mx.metal.is_available():
            raise RuntimeError("mlx has no Metal device")
        self.mx, self.nn = mx, nn
        mx.set_default_device(mx.gpu if stream == "gpu" else mx.cpu)
        self.label = f"mlx ({stream})"

    def layer_class(self, kind):
        return {"rnn": self.nn.RNN, "gru": self.nn.GRU, "lstm": self.nn.LSTM}[kind]

    def transposed(self, kind):
        """Whether this MLX stores weights as [in, out] (a layer whose sizes differ tells)."""
        layer = self.layer_class(kind)(1, 2)
        return tuple(getattr(layer, self.NAMES[kind]["input_weight"]).shape)[0] == 1

    def layers(self, problem):
        """One layer per direction, holding problem's weights."""
        mx, c = self.mx, problem.config
        names, transpose = self.NAMES[c.kind], self.transposed(c.kind)
        layers = []
        for p in problem.torch_params:
            layer = self.layer_class(c.kind)(c.I, c.H)
            w = convert.weights_from_torch(c.kind, [p])
            layer.update(
                {
                    names[k]: mx.array(
                        np.ascontiguousarray(v.T if v.ndim == 2 and transpose else v)
                    )
                    for k, v in w.items()
                }
            )
            layers.append(layer)
        return layers

    def prepare(self, problem, mode, threads=None):
        mx, c = self.mx, problem.config
        if c.dtype == "float64":
            raise NotSupported("benchmarked in float32 and float16 only")
        layers = self.layers(problem)
        x = mx.array(np.ascontiguousarray(problem.x.transpose(1, 0, 2)))  # [N, T, I]
        dy = mx.array(np.ascontiguousarray(problem.dy.transpose(1, 0, 2)))
        numpy = lambda a: np.array(a.astype(mx.float32))  # noqa: E731

        def forward(params, x):
            outs = []
            for d, (layer, p) in enumerate(zip(layers, params)):
                layer.update(p)
                out = layer(x if d == 0 else x[:, ::-1, :])
                out = out[0] if isinstance(out, tuple) else out  # the LSTM's (hidden, cell)
                outs.append(out if d == 0 else out[:, ::-1, :])
            return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=-1)

        params = [layer.trainable_parameters() for layer in layers]
        to_y = lambda y: numpy(y).transpose(1, 0, 2)  # noqa: E731
        if mode == "inference":

            def run():
                y = forward(params, x)
                mx.eval(y)
                return y

            return Prepared(run, lambda y: {"y": to_y(y)})

        # One vjp gives the output and the gradients of x and every parameter.
        keys = [(d, k) for d, p in enumerate(params) for k in p]

        def flat_forward(x, *flat):
            tree = [{} for _ in params]
            for (d, k), v in zip(keys, flat):
                tree[d][k] = v
            return [forward(tree, x)]

        primals = [x] + [params[d][k] for d, k in keys]

        def run():
            (y,), (dx, *dflat) = mx.vjp(flat_forward, primals, [dy])
            mx.eval(y, dx, *dflat)
            return y, dx, dict(zip(keys, dflat))

        transpose = self.transposed(c.kind)

        def result(out):
            y, dx, dflat = out
            grads = {}
            for ours, theirs in self.NAMES[c.kind].items():
                parts = [numpy(dflat[(d, theirs)]) for d in range(c.D)]
                if parts[0].ndim == 2 and transpose:
                    parts = [a.T for a in parts]
                join = np.stack if ours == "recurrent_weight" and c.D == 2 else np.concatenate
                grads[ours] = join(parts) if c.D == 2 else parts[0]
            return _gradient_result(c.kind, c.bidirectional, to_y(y), to_y(dx), grads)

        return Prepared(run, result)


class NumpyImpl:
    """The loop of rnncore.bench.numpy_loop on rnncore's (PyTorch-mapped) weights."""

    name = label = "numpy"

    def __init__(self, device="cpu"):
        pass

    def prepare(self, problem, mode, threads=None):
        c = problem.config
        if c.dtype not in ("float32", "float64"):
            raise NotSupported("benchmarked in float32 and float64 only")
        layer = NumpyLayer(c, problem.rnncore_weights())
        x, dy = problem.x, problem.dy
        if mode == "inference":
            return Prepared(lambda: layer.forward(x), lambda y: {"y": y})

        def result(out):
            return _gradient_result(c.kind, c.bidirectional, out["y"], out["dx"], out)

        return Prepared(lambda: layer.forward_backward(x, dy), result)


def numpy_reference(problem):
    """Float64 outputs and gradients by the numpy loop (the reference without torch)."""
    c = problem.config
    weights = {k: v.astype(np.float64) for k, v in problem.rnncore_weights().items()}
    out = NumpyLayer(c, weights).forward_backward(
        problem.x.astype(np.float64), problem.dy.astype(np.float64)
    )
    return _gradient_result(c.kind, c.bidirectional, out["y"], out["dx"], out)


# Peers in table order, with the module each needs and where it runs for each rnncore
# device (None: not on that device).
PEERS = {
    "torch": ("torch", TorchImpl, {"cpu": "cpu", "metal": "mps", "metal-emulated": "cpu"}),
    "onnxruntime": ("onnxruntime", OnnxRuntimeImpl, {"cpu": "cpu"}),
    "mlx": ("mlx", MlxImpl, {"cpu": "cpu", "metal": "gpu", "metal-emulated": "cpu"}),
    "numpy": ("numpy", NumpyImpl, {"cpu": "cpu"}),
}


def make_peers(device):
    """The peers for rnncore's `device`, instantiated; and why the others are absent."""
    peers, missing = [], {}
    for name, (module, cls, where) in PEERS.items():
        if device not in where:
            continue
        if importlib.util.find_spec(module) is None:
            missing[name] = f"{module} is not installed"
            continue
        try:
            peers.append(cls(where[device]))
        except Exception as e:  # noqa: BLE001 (an installed but broken peer is reported)
            missing[name] = f"{type(e).__name__}: {e}"
    return peers, missing

"""The implementations timed: rnncore and its peers, each behind the same small interface.

`prepare(problem, mode, threads)` returns a pair (run, result): `run()` is the timed call
(for "training": forward with training on, plus backward with the upstream gradient
problem.dy); `result(run())` turns its output into a dict of numpy arrays in rnncore's
layout for the agreement check: "y" [T, N, D·H] (time-aligned) and, for training, the
gradients named in problem.py. `prepare` raises NotSupported for what a peer cannot run.
"""

import importlib.util

import numpy as np
from numpy_loop import NumpyLayer
from problem import torch_grads_to_canonical


class NotSupported(Exception):
    pass


def installed(module):
    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------------------- rnncore


class RnncoreImpl:
    name = "rnncore"

    def __init__(self):
        import rnncore

        self.rc = rnncore

    def descriptor(self, config, training):
        rc = self.rc
        bi = config.bidirectional
        if config.kind == "gru":
            return rc.GRUDescriptor(
                bidirectional=bi, training=training, reset_gate_first=True, reset_after=True
            )
        if config.kind == "lstm":
            return rc.LSTMDescriptor(bidirectional=bi, training=training)
        return rc.RNNDescriptor(bidirectional=bi, training=training, activation=rc.Activation.TANH)

    def prepare(self, problem, mode, threads):
        rc, c = self.rc, problem.config
        w = problem.rnncore_weights()
        x, dy = problem.x, problem.dy
        R = w.pop("recurrent_weight")
        forward = {"rnn": rc.single_gate_rnn, "lstm": rc.lstm, "gru": rc.gru}[c.kind]
        if mode == "inference":
            desc = self.descriptor(c, training=False)
            return (lambda: forward(x, R, **w, descriptor=desc)), (lambda out: {"y": out.state})

        desc = self.descriptor(c, training=True)

        def run():
            out = forward(x, R, **w, descriptor=desc)
            if c.kind == "gru":
                grads = rc.gru_gradients(x, R, dy, out.z_state, out.state, **w, descriptor=desc)
            elif c.kind == "lstm":
                grads = rc.lstm_gradients(x, R, dy, out.z_state, out.cell, **w, descriptor=desc)
            else:
                grads = rc.single_gate_rnn_gradients(x, R, dy, out.z_state, **w, descriptor=desc)
            return out, grads

        def result(out_grads):
            out, g = out_grads
            r = {
                "y": out.state,
                "dx": g.source,
                "dW": g.input_weight,
                "dR": g.recurrent_weight,
                "dbias": g.bias,
            }
            if c.kind == "gru":
                r["db2"] = g.secondary_bias
            return r

        return run, result


# ---------------------------------------------------------------------------- PyTorch


class TorchImpl:
    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch

    def set_threads(self, threads):
        self.torch.set_num_threads(threads)

    def module(self, problem, dtype):
        """nn.RNN / nn.GRU / nn.LSTM holding problem's weights (cast to `dtype`)."""
        torch, c = self.torch, problem.config
        cls = {"rnn": torch.nn.RNN, "gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[c.kind]
        module = cls(c.I, c.H, bidirectional=c.bidirectional, dtype=dtype)
        with torch.no_grad():
            for d, params in enumerate(problem.torch_params):
                suffix = "_l0_reverse" if d else "_l0"
                for name, value in params.items():
                    getattr(module, name + suffix).copy_(torch.from_numpy(value))
        return module

    def _prepare(self, problem, mode, dtype):
        torch, c = self.torch, problem.config
        module = self.module(problem, dtype)
        x = torch.from_numpy(problem.x).to(dtype)
        if mode == "inference":
            module.eval()

            def run():
                with torch.inference_mode():
                    return module(x)[0]

            return run, lambda y: {"y": y.numpy()}

        module.train()
        x.requires_grad_(True)
        dy = torch.from_numpy(problem.dy).to(dtype)
        params = list(module.parameters())

        def run():
            x.grad = None
            for p in params:
                p.grad = None
            y = module(x)[0]
            y.backward(dy)
            return y

        def result(y):
            grads = []
            for d in range(c.D):
                suffix = "_l0_reverse" if d else "_l0"
                grads.append(
                    {
                        name: getattr(module, name + suffix).grad.numpy()
                        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
                    }
                )
            out = torch_grads_to_canonical(c, grads)
            out["y"] = y.detach().numpy()
            out["dx"] = x.grad.numpy()
            return out

        return run, result

    def prepare(self, problem, mode, threads):
        dtype = {"float32": self.torch.float32, "float64": self.torch.float64}[problem.config.dtype]
        return self._prepare(problem, mode, dtype)

    def reference(self, problem):
        """Outputs and gradients computed in float64 from the same (rounded) numbers."""
        run, result = self._prepare(problem, "training", self.torch.float64)
        return result(run())


# ---------------------------------------------------------------------------- ONNX Runtime


class OnnxRuntimeImpl:
    name = "onnxruntime"

    def __init__(self):
        import onnx
        import onnxruntime

        self.onnx, self.ort = onnx, onnxruntime

    def model(self, problem):
        """A one-node ONNX model (opset 14) with the weights as initializers."""
        from onnx import TensorProto, helper, numpy_helper

        c = problem.config
        W, R, B = problem.onnx_weights()
        elem = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}[c.dtype]
        attrs = {
            "hidden_size": c.H,
            "direction": "bidirectional" if c.bidirectional else "forward",
        }
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
            initializer=[
                numpy_helper.from_array(a, name) for name, a in (("W", W), ("R", R), ("B", B))
            ],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        model.ir_version = 8
        return model.SerializeToString()

    def prepare(self, problem, mode, threads):
        if mode != "inference":
            raise NotSupported("ONNX Runtime has no training for these operators")
        ort, c = self.ort, problem.config
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 4  # its refusals are reported here, not logged
        feed = {"X": problem.x}
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

        return (lambda: session.run(None, feed)), result


# ---------------------------------------------------------------------------- MLX


class MlxImpl:
    """MLX's nn.RNN / nn.GRU / nn.LSTM (bidirectional: a second layer on reversed time)."""

    name = "mlx"

    def __init__(self):
        import mlx.core as mx
        import mlx.nn as nn

        self.mx, self.nn = mx, nn

    def transposed(self, kind):
        """Whether this MLX stores weights as [in, out] (some versions) instead of PyTorch's
        [out, in]: asked of a small layer whose two sizes differ."""
        layer = {"rnn": self.nn.RNN, "gru": self.nn.GRU, "lstm": self.nn.LSTM}[kind](1, 2)
        weight = layer.Wxh if kind == "rnn" else layer.Wx
        return tuple(weight.shape)[0] == 1

    def layers(self, problem):
        """One layer per direction, with problem's weights."""
        mx, nn, c = self.mx, self.nn, problem.config
        transpose = self.transposed(c.kind)
        H = c.H
        layers = []
        for p in problem.torch_params:
            if c.kind == "gru":
                layer = nn.GRU(c.I, H)
                b = np.concatenate(
                    [p["bias_ih"][: 2 * H] + p["bias_hh"][: 2 * H], p["bias_ih"][2 * H :]]
                )
                values = {
                    "Wx": p["weight_ih"],
                    "Wh": p["weight_hh"],
                    "b": b,
                    "bhn": p["bias_hh"][2 * H :],
                }
            elif c.kind == "lstm":
                layer = nn.LSTM(c.I, H)
                values = {
                    "Wx": p["weight_ih"],
                    "Wh": p["weight_hh"],
                    "bias": p["bias_ih"] + p["bias_hh"],
                }
            else:
                layer = nn.RNN(c.I, H)
                values = {
                    "Wxh": p["weight_ih"],
                    "Whh": p["weight_hh"],
                    "bias": p["bias_ih"] + p["bias_hh"],
                }
            params = {}
            for name, value in values.items():
                if value.ndim == 2 and transpose:
                    value = value.T
                params[name] = mx.array(np.ascontiguousarray(value))
            layer.update(params)
            layers.append(layer)
        return layers

    def prepare(self, problem, mode, threads):
        mx, c = self.mx, problem.config
        if c.dtype != "float32":
            raise NotSupported("benchmarked in float32 only")
        layers = self.layers(problem)
        x = mx.array(np.ascontiguousarray(problem.x.transpose(1, 0, 2)))  # [N, T, I]
        dy = mx.array(np.ascontiguousarray(problem.dy.transpose(1, 0, 2)))

        def forward(params, x):
            outs = []
            for d, (layer, p) in enumerate(zip(layers, params)):
                layer.update(p)
                xd = x if d == 0 else x[:, ::-1, :]
                out = layer(xd)
                out = out[0] if isinstance(out, tuple) else out  # LSTM: (hidden, cell)
                outs.append(out if d == 0 else out[:, ::-1, :])
            return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=-1)

        params = [layer.trainable_parameters() for layer in layers]
        to_y = lambda y: {"y": np.array(y).transpose(1, 0, 2)}  # noqa: E731
        if mode == "inference":

            def run():
                y = forward(params, x)
                mx.eval(y)
                return y

            return run, to_y

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
            dparams = [{} for _ in params]
            for (d, k), v in zip(keys, dflat):
                dparams[d][k] = v
            return y, dparams, dx

        def result(out):
            y, dparams, dx = out
            grads = []
            for g in dparams:
                g = {k: np.array(v) for k, v in g.items()}
                names = {
                    "gru": ("Wx", "Wh", "b"),
                    "lstm": ("Wx", "Wh", "bias"),
                    "rnn": ("Wxh", "Whh", "bias"),
                }[c.kind]
                w_ih, w_hh, b = (g[n] for n in names)
                if self.transposed(c.kind):
                    w_ih, w_hh = w_ih.T, w_hh.T
                bias_hh = np.zeros_like(b)
                if c.kind == "gru":
                    bias_hh[2 * c.H :] = g["bhn"]
                grads.append(
                    {"weight_ih": w_ih, "weight_hh": w_hh, "bias_ih": b, "bias_hh": bias_hh}
                )
            r = torch_grads_to_canonical(c, grads)
            r.update(to_y(y))
            r["dx"] = np.array(dx).transpose(1, 0, 2)
            return r

        return run, result


# ---------------------------------------------------------------------------- numpy loop


class NumpyImpl:
    name = "numpy"

    def prepare(self, problem, mode, threads):
        layer = NumpyLayer(problem.config, problem.rnncore_weights())
        x, dy = problem.x, problem.dy
        if mode == "inference":
            return (lambda: layer.forward(x)), (lambda y: {"y": y})
        return (lambda: layer.forward_backward(x, dy)), (lambda out: out)


# Peers in table order; rnncore is always first.
PEERS = {
    "torch": ("torch", TorchImpl),
    "onnxruntime": ("onnxruntime", OnnxRuntimeImpl),
    "mlx": ("mlx", MlxImpl),
    "numpy": ("numpy", NumpyImpl),
}


def available_impls():
    """rnncore and every installed peer, instantiated; and the reasons others are absent."""
    impls, missing = [RnncoreImpl()], {}
    for name, (module, cls) in PEERS.items():
        if not installed(module):
            missing[name] = f"{module} is not installed"
            continue
        try:
            impls.append(cls())
        except Exception as e:  # noqa: BLE001 (an installed but broken peer is reported, not fatal)
            missing[name] = f"import failed: {e}"
    return impls, missing

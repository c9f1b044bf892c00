"""The layer section (``--layers``): one training step (forward, a sum loss, backward) of a
2-layer bidirectional LSTM and GRU through ``rnncore.torch`` beside ``torch.nn``, a 2-layer
LSTM and GRU through ``rnncore.mlx`` beside ``mlx.nn`` (which has no bidirectional layer),
and the torch modules' overhead over the raw operations they call (the same weights through
rnncore.convert, one forward and one gradient call per layer)."""

from __future__ import annotations

import numpy as np

SIZE = (100, 32, 256, 256)  # T, N, I, H
QUICK_SIZE = (20, 8, 64, 64)


def torch_step(module, x):
    def step():
        module.zero_grad(set_to_none=True)
        out, _ = module(x)
        out.sum().backward()

    return step


def raw_step(module, x):
    """The operations rnncore.torch calls for `module`, without torch around them."""
    from rnncore.convert import from_torch
    from rnncore.nn import layer_forward, layer_gradients

    layers = from_torch(module, training=True)
    kind = layers[0].kind
    x = x.detach().numpy()

    def step():
        inputs, results = [x], []
        for layer in layers:
            results.append(
                layer_forward(kind, inputs[-1], layer.weights, {}, layer.descriptor, None)
            )
            inputs.append(results[-1].state)
        dy = np.ones_like(inputs[-1])
        for layer, inp, out in zip(layers[::-1], inputs[-2::-1], results[::-1]):
            g = layer_gradients(kind, inp, layer.weights, {}, out, dy, None, layer.descriptor, None)
            dy = g.source

    return step


def mlx_step(layers, x, mx, nn):
    def loss(model, x):
        y = x
        for layer in model.layers:
            y = layer(y)
            y = y[0] if isinstance(y, tuple) else y
        return y.sum()

    model = nn.Module()
    model.layers = layers
    value_and_grad = nn.value_and_grad(model, loss)

    def step():
        value, grads = value_and_grad(model, x)
        mx.eval(value, grads)

    return step


def run_layers(quick, measure, timing, allowed):
    """Rows (layer, implementation, ms, ratio) of the layer section; peers that are not
    installed are left out."""
    T, N, I, H = QUICK_SIZE if quick else SIZE  # noqa: E741
    rows = []
    try:
        import torch

        import rnncore.torch as rt
    except ImportError:
        torch = None
    if torch is not None:
        for kind in ("LSTM", "GRU"):
            torch.manual_seed(0)
            theirs = getattr(torch.nn, kind)(I, H, 2, batch_first=True, bidirectional=True)
            ours = getattr(rt, kind)(I, H, 2, batch_first=True, bidirectional=True)
            ours.load_state_dict(theirs.state_dict())
            x = torch.randn(N, T, I)
            name = f"2-layer bidirectional {kind} T={T} N={N} I={I} H={H}"
            t_ours = measure(torch_step(ours, x), timing, allowed)["median_s"]
            t_torch = measure(torch_step(theirs, x), timing, allowed)["median_s"]
            tm = x.transpose(0, 1).contiguous()  # the operations are time-major
            t_raw = measure(raw_step(ours, tm), timing, allowed)["median_s"]
            rows.append((name, "rnncore.torch", t_ours, t_ours / t_torch, "vs torch.nn"))
            rows.append((name, "torch.nn", t_torch, None, ""))
            rows.append((name, "raw operations", t_raw, t_ours / t_raw, "overhead of the module"))
    try:
        import mlx.core as mx
        import mlx.nn as nn

        import rnncore.mlx as rm
    except ImportError:
        mx = None
    if mx is not None:
        for kind in ("LSTM", "GRU"):
            theirs = [getattr(nn, kind)(I if k == 0 else H, H) for k in range(2)]
            ours = [getattr(rm, kind)(I if k == 0 else H, H) for k in range(2)]
            for a, b in zip(ours, theirs):
                a.update(b.parameters())
            x = mx.random.normal((N, T, I))
            name = f"2-layer {kind} T={T} N={N} I={I} H={H}"
            t_ours = measure(mlx_step(ours, x, mx, nn), timing, allowed)["median_s"]
            t_mlx = measure(mlx_step(theirs, x, mx, nn), timing, allowed)["median_s"]
            rows.append((name, "rnncore.mlx", t_ours, t_ours / t_mlx, "vs mlx.nn"))
            rows.append((name, "mlx.nn", t_mlx, None, ""))
    return rows


def table(rows):
    lines = ["layer training step (forward, sum loss, backward)", ""]
    for name, impl, seconds, ratio, what in rows:
        r = "" if ratio is None else f"{ratio:.2f} {what}"
        lines.append(f"  {name:46} {impl:15} {seconds * 1e3:9.2f} ms  {r}")
    return "\n".join(lines)

"""A plain numpy implementation: one GEMM for the input projection, then a per-step loop.

It works on rnncore's weights as mapped from PyTorch (gate blocks r, z, n for the GRU with
the reset gate applied after the recurrent product; i, f, g, o for the LSTM; tanh for the
single-gate RNN), and back-propagates through time with the recurrent-weight gradient
accumulated in one GEMM at the end. This is the "straightforward" baseline.
"""

import numpy as np


def sigmoid(a):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-a))


def _forward_direction(kind, xp, R, b2, H):
    """One direction in processing order. xp [T, N, G·H]. Returns h [T, N, H] and the
    per-step values the backward pass needs."""
    T, N, _ = xp.shape
    h = np.zeros((N, H), xp.dtype)
    hs = np.empty((T, N, H), xp.dtype)
    cache = {}
    if kind == "gru":
        cache["rz"] = np.empty((T, N, 2 * H), xp.dtype)
        cache["n"] = np.empty((T, N, H), xp.dtype)
        cache["q"] = np.empty((T, N, H), xp.dtype)
    elif kind == "lstm":
        c = np.zeros((N, H), xp.dtype)
        cache["gates"] = np.empty((T, N, 4 * H), xp.dtype)
        cache["tanh_c"] = np.empty((T, N, H), xp.dtype)
        cache["c"] = np.empty((T, N, H), xp.dtype)
    for t in range(T):
        hp = h @ R.T
        if kind == "rnn":
            h = np.tanh(xp[t] + hp)
        elif kind == "gru":
            rz = sigmoid(xp[t, :, : 2 * H] + hp[:, : 2 * H])
            r, z = rz[:, :H], rz[:, H:]
            q = hp[:, 2 * H :] + b2
            n = np.tanh(xp[t, :, 2 * H :] + r * q)
            h = n + z * (h - n)
            cache["rz"][t], cache["n"][t], cache["q"][t] = rz, n, q
        else:
            a = xp[t] + hp
            gates = np.concatenate(
                [sigmoid(a[:, : 2 * H]), np.tanh(a[:, 2 * H : 3 * H]), sigmoid(a[:, 3 * H :])],
                axis=1,
            )
            i, f, g, o = (gates[:, k * H : (k + 1) * H] for k in range(4))
            c = f * c + i * g
            tanh_c = np.tanh(c)
            h = o * tanh_c
            cache["gates"][t], cache["tanh_c"][t], cache["c"][t] = gates, tanh_c, c
        hs[t] = h
    return hs, cache


def _backward_direction(kind, dy, hs, cache, R, H):
    """BPTT of one direction in processing order: d xp [T, N, G·H], dR, d b2."""
    T, N, _ = dy.shape
    GH = R.shape[0]
    dxp = np.empty((T, N, GH), dy.dtype)
    dhp = np.empty((T, N, GH), dy.dtype) if kind == "gru" else dxp  # d (h[t-1]·Rᵀ)
    dh_next = np.zeros((N, H), dy.dtype)
    dc_next = np.zeros((N, H), dy.dtype)
    zeros = np.zeros((N, H), dy.dtype)
    for t in range(T - 1, -1, -1):
        dh = dy[t] + dh_next
        if kind == "rnn":
            dxp[t] = dh * (1 - hs[t] * hs[t])
            dh_next = dxp[t] @ R
        elif kind == "gru":
            h_prev = hs[t - 1] if t > 0 else zeros
            r, z = cache["rz"][t, :, :H], cache["rz"][t, :, H:]
            n, q = cache["n"][t], cache["q"][t]
            da_n = dh * (1 - z) * (1 - n * n)
            da_r = da_n * q * r * (1 - r)
            da_z = dh * (h_prev - n) * z * (1 - z)
            dxp[t, :, :H], dxp[t, :, H : 2 * H], dxp[t, :, 2 * H :] = da_r, da_z, da_n
            dhp[t, :, : 2 * H] = dxp[t, :, : 2 * H]
            dhp[t, :, 2 * H :] = da_n * r
            dh_next = dhp[t] @ R + dh * z
        else:
            gates = cache["gates"][t]
            i, f, g, o = (gates[:, k * H : (k + 1) * H] for k in range(4))
            tanh_c = cache["tanh_c"][t]
            c_prev = cache["c"][t - 1] if t > 0 else zeros
            dc = dh * o * (1 - tanh_c * tanh_c) + dc_next
            dxp[t, :, :H] = dc * g * i * (1 - i)
            dxp[t, :, H : 2 * H] = dc * c_prev * f * (1 - f)
            dxp[t, :, 2 * H : 3 * H] = dc * i * (1 - g * g)
            dxp[t, :, 3 * H :] = dh * tanh_c * o * (1 - o)
            dh_next = dxp[t] @ R
            dc_next = dc * f
    h_prev = np.concatenate([zeros[None], hs[:-1]]).reshape(-1, H)
    dR = dhp.reshape(-1, GH).T @ h_prev
    db2 = dhp[:, :, 2 * H :].sum(axis=(0, 1)) if kind == "gru" else None
    return dxp, dR, db2


class NumpyLayer:
    """Forward (and optional BPTT) of a whole layer, given rnncore's (PyTorch-mapped) weights."""

    def __init__(self, config, weights):
        self.c = config
        self.W = weights["input_weight"]
        self.bias = weights["bias"]
        R = weights["recurrent_weight"]
        self.R = [R[d] for d in range(2)] if config.D == 2 else [R]
        b2 = weights.get("secondary_bias")
        H = config.H
        self.b2 = [None if b2 is None else b2[d * H : (d + 1) * H] for d in range(config.D)]

    def _directions(self, a):
        """Split a [T, N, D·K] tensor into processing-order directions."""
        D = self.c.D
        K = a.shape[-1] // D
        parts = [a[..., d * K : (d + 1) * K] for d in range(D)]
        return [p if d == 0 else p[::-1] for d, p in enumerate(parts)]

    def _join(self, parts):
        """Inverse of _directions: concatenate processing-order parts, time-aligned."""
        return np.concatenate([p if d == 0 else p[::-1] for d, p in enumerate(parts)], axis=-1)

    def forward(self, x, keep=False):
        c = self.c
        xp = (x.reshape(-1, c.I) @ self.W.T + self.bias).reshape(c.T, c.N, -1)
        results = [
            _forward_direction(c.kind, xp_d, self.R[d], self.b2[d], c.H)
            for d, xp_d in enumerate(self._directions(xp))
        ]
        y = self._join([hs for hs, _ in results])
        return (y, results) if keep else y

    def forward_backward(self, x, dy):
        """The output "y", "dx" and the weight gradients under rnncore's names."""
        c = self.c
        y, results = self.forward(x, keep=True)
        parts = [
            _backward_direction(c.kind, dy_d, hs, cache, self.R[d], c.H)
            for d, (dy_d, (hs, cache)) in enumerate(zip(self._directions(dy), results))
        ]
        dxp = self._join([p[0] for p in parts])
        flat = dxp.reshape(-1, dxp.shape[-1])
        out = {
            "y": y,
            "dx": (flat @ self.W).reshape(x.shape),
            "input_weight": flat.T @ x.reshape(-1, c.I),
            "recurrent_weight": np.stack([p[1] for p in parts]) if c.D == 2 else parts[0][1],
            "bias": flat.sum(axis=0),
        }
        if c.kind == "gru":
            out["secondary_bias"] = np.concatenate([p[2] for p in parts])
        return out

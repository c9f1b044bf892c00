"""Readable float64 numpy reference of the rnncore contract.

This module implements, step by step, the forward and gradient operations described in
the contract (``semantics.md``): the single-gate RNN, the LSTM and the GRU, their
wrapper (input projection, bias, time flips, bidirectional halves, mask broadcasting)
and their back-propagation through time. It is slow on purpose: every time step is a
plain Python loop over the equations of the contract, so it doubles as documentation.
Section names in the comments ("How every forward operation is built", "Gradient
operations", ...) refer to that document.

It imports numpy only, so it can be used without the compiled extension::

    from rnncore import reference
    y, z = reference.single_gate_rnn(x, r, w, descriptor=desc)

``descriptor`` is ``None`` (MPSGraph's defaults) or any object with the attributes
named in the public API (``reverse``, ``bidirectional``, ``training``, ``activation``,
...); missing attributes take their default values. Activations are the integers 0..4
of the activation table (or ``IntEnum`` members such as ``rnncore.Activation.TANH``).

All results are float64 numpy arrays. Outputs the contract says are absent, and
gradients of inputs that were not given, are ``None``.
"""

from __future__ import annotations

import numpy as np

# The result types are shared with the compiled module (numpy-only, like this file).
from ._ops import (
    KINDS,
    GRUGradients,
    GRUResult,
    LSTMGradients,
    LSTMResult,
    RNNGradients,
    RNNResult,
)

__all__ = [
    "NONE",
    "RELU",
    "TANH",
    "SIGMOID",
    "HARD_SIGMOID",
    "activate",
    "activate_derivative",
    "sigmoid",
    *(kind.result.__name__ for kind in KINDS.values()),
    *(kind.gradient_result.__name__ for kind in KINDS.values()),
    *(kind.forward for kind in KINDS.values()),
    *(kind.gradients for kind in KINDS.values()),
]

# --------------------------------------------------------------------------------------
# Activations (contract: "Activations")
# --------------------------------------------------------------------------------------

NONE, RELU, TANH, SIGMOID, HARD_SIGMOID = range(5)


def sigmoid(x):
    """1 / (1 + e^-x), computed from e^-|x| so that it never overflows."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def activate(x, activation):
    """f(x) of the activation table."""
    a = _check_activation(activation)
    x = np.asarray(x, dtype=np.float64)
    if a == NONE:
        return x.copy()
    if a == RELU:
        return np.maximum(x, 0.0)
    if a == TANH:
        return np.tanh(x)
    if a == SIGMOID:
        return sigmoid(x)
    return np.clip(0.2 * x + 0.5, 0.0, 1.0)  # HARD_SIGMOID


def activate_derivative(x, activation):
    """f'(x) of the activation table, from the pre-activation x."""
    a = _check_activation(activation)
    x = np.asarray(x, dtype=np.float64)
    if a == NONE:
        return np.ones_like(x)
    if a == RELU:
        return (x > 0).astype(np.float64)
    if a == TANH:
        return 1.0 - np.tanh(x) ** 2
    if a == SIGMOID:
        s = sigmoid(x)
        return s * (1.0 - s)
    return np.where(np.abs(x) <= 2.5, 0.2, 0.0)  # HARD_SIGMOID


def _check_activation(activation):
    a = int(activation)
    if a not in (NONE, RELU, TANH, SIGMOID, HARD_SIGMOID):
        raise ValueError(f"activation must be one of 0..4, got {activation!r}")
    return a


# --------------------------------------------------------------------------------------
# Descriptor fields (defaults: the public API's, i.e. MPSGraph's)
# --------------------------------------------------------------------------------------


def _field(descriptor, name, default):
    return default if descriptor is None else getattr(descriptor, name, default)


def _flag(descriptor, name):
    return bool(_field(descriptor, name, False))


def _act_field(descriptor, name, default):
    return _check_activation(_field(descriptor, name, default))


def _lstm_gate_activations(descriptor):
    return dict(
        i=_act_field(descriptor, "input_gate_activation", SIGMOID),
        f=_act_field(descriptor, "forget_gate_activation", SIGMOID),
        z=_act_field(descriptor, "cell_gate_activation", TANH),
        o=_act_field(descriptor, "output_gate_activation", SIGMOID),
    )


def _gru_gate_activations(descriptor):
    return dict(
        z=_act_field(descriptor, "update_gate_activation", SIGMOID),
        r=_act_field(descriptor, "reset_gate_activation", SIGMOID),
        o=_act_field(descriptor, "output_gate_activation", TANH),
    )


def _lstm_gate_order(descriptor):
    """Block index of each LSTM gate (contract: "LSTM", gate blocks)."""
    if _flag(descriptor, "forget_gate_last"):
        return dict(i=0, z=1, f=2, o=3)
    return dict(i=0, f=1, z=2, o=3)


def _gru_gate_order(descriptor):
    """Block index of each GRU gate (contract: "GRU", gate blocks)."""
    if _flag(descriptor, "reset_gate_first"):
        return dict(r=0, z=1, o=2)
    return dict(z=0, r=1, o=2)


def _lstm_config(descriptor):
    """Gate blocks, gate activations and the cell activation of an LSTM."""
    act = _act_field(descriptor, "activation", TANH)
    return _lstm_gate_order(descriptor), _lstm_gate_activations(descriptor), act


def _gru_config(descriptor):
    """Gate blocks, gate activations, resetAfter and flipZ of a GRU."""
    flags = _flag(descriptor, "reset_after"), _flag(descriptor, "flip_z")
    return (_gru_gate_order(descriptor), _gru_gate_activations(descriptor), *flags)


def _block(a, k, H):
    """A_k: the k-th H-wide block of the last axis (a view)."""
    return a[..., k * H : (k + 1) * H]


def _rows(R, k, H):
    """R_k: the k-th H-row block of an output-major [G*H, H] weight (a view)."""
    return R[k * H : (k + 1) * H]


# --------------------------------------------------------------------------------------
# The wrapper (contract: "How every forward operation is built")
# --------------------------------------------------------------------------------------


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


class _Layer:
    """Shapes, directions and per-direction pieces of one call.

    Two time layouts occur:
    - *input time*: ``x'`` and its gradient ``dX'``; a direction that processes time
      backwards (``reverse``, or the backward half) reads it flipped;
    - *output layout*: ``h``, ``c``, ``zState`` and the gradients w.r.t. them;
      unidirectional outputs are in processing order (not flipped back, even with
      ``reverse``), bidirectional outputs have the backward half flipped back to input
      time.
    """

    def __init__(self, op, descriptor, G, source, recurrent_weight, input_weight, bias):
        self.op = op
        self.G = G
        self.bidirectional = _flag(descriptor, "bidirectional")
        self.reverse = _flag(descriptor, "reverse") and not self.bidirectional
        self.D = 2 if self.bidirectional else 1

        self.source = _f64(source)
        self.R = _f64(recurrent_weight)
        self.W = _f64(input_weight)
        self.bias = _f64(bias)
        if self.source.ndim != 3:
            raise ValueError(f"[{op}] source must be [T, N, C], got {self.source.shape}")
        self.H = self.R.shape[-1]
        self.T, self.N = self.source.shape[:2]
        D, GH, H = self.D, G * self.H, self.H
        r_shape = (2, GH, H) if self.bidirectional else (GH, H)
        if self.R.shape != r_shape:
            raise ValueError(f"[{op}] recurrent_weight must be {r_shape}, got {self.R.shape}")
        channels = self.source.shape[2] if self.W is None else self.W.shape[0]
        if channels != D * GH:
            raise ValueError(
                f"[{op}] the projected source must have {D * GH} channels, got {channels}"
            )

    # -- directions -------------------------------------------------------------------

    @property
    def directions(self):
        return range(self.D)

    def runs_backwards(self, d):
        return d == 1 if self.bidirectional else self.reverse

    def from_input_time(self, x, d, width):
        """Direction d's slice of an input-time tensor, in its processing order."""
        xd = _block(x, d, width)
        return xd[::-1] if self.runs_backwards(d) else xd

    def to_input_time(self, parts):
        """Per-direction tensors in processing order -> one input-time tensor."""
        parts = [p[::-1] if self.runs_backwards(d) else p for d, p in enumerate(parts)]
        return np.concatenate(parts, axis=-1)

    def from_output_layout(self, y, d, width):
        """Direction d's slice of an output-layout tensor, in its processing order."""
        yd = _block(y, d, width)
        return yd[::-1] if self.bidirectional and d == 1 else yd

    def to_output_layout(self, parts):
        """Per-direction outputs in processing order -> the op's output layout."""
        parts = [p[::-1] if self.bidirectional and d == 1 else p for d, p in enumerate(parts)]
        return np.concatenate(parts, axis=-1)

    def each_direction(self, run):
        """run(d) for every direction d; its results regrouped per output, each a list
        with one entry per direction."""
        return tuple(map(list, zip(*(run(d) for d in self.directions))))

    # -- per-direction inputs ("Bidirectional halves") --------------------------------

    def recurrent(self, d):
        return self.R.reshape(self.D, self.G * self.H, self.H)[d]

    def state_half(self, state, d):
        """initState / initCell / stateGradient half [N, H]; zeros when not given."""
        if state is None:
            return np.zeros((self.N, self.H))
        return _block(_f64(state).reshape(self.N, self.D * self.H), d, self.H)

    def mask_half(self, mask, d):
        """The mask, broadcast to [N, D*H] first, then split per direction."""
        if mask is None:
            return np.ones((self.N, self.H))
        mask = _f64(mask)
        if mask.ndim > 2:
            raise ValueError(
                f"[{self.op}] mask must broadcast to [N, D*H] (no time axis), got {mask.shape}"
            )
        return _block(np.broadcast_to(mask, (self.N, self.D * self.H)), d, self.H)

    def peephole_part(self, peephole, d):
        if peephole is None:
            return np.zeros(4 * self.H)
        return _f64(peephole).reshape(self.D, 4 * self.H)[d]

    def secondary_bias_half(self, secondary_bias, d):
        if secondary_bias is None:
            return np.zeros(self.H)
        return _block(_f64(secondary_bias), d, self.H)

    # -- projection and its gradient --------------------------------------------------

    def projected_source(self):
        """x' = source . W^T (+ bias), [T, N, D*G*H], in input time."""
        x = self.source if self.W is None else self.source @ self.W.T
        if self.bias is not None:
            x = x + self.bias
        return x

    def weight_gradients(self, dx_parts, dR_parts):
        """From the per-direction dX' and dR (processing order) to the gradients of
        source, recurrent_weight, input_weight and bias, by field name.

        Contract, "Gradient operations", last paragraph.
        """
        dx = self.to_input_time(dx_parts)  # [T, N, D*G*H], input time
        dsource = dx if self.W is None else dx @ self.W
        dW = dbias = None
        if self.W is not None:
            # Explicit row counts: reshape(-1, 0) is ambiguous when I or H is 0.
            rows = self.T * self.N
            flat_dx = dx.reshape(rows, dx.shape[-1])
            dW = flat_dx.T @ self.source.reshape(rows, self.source.shape[-1])
        if self.bias is not None:
            dbias = dx.sum(axis=(0, 1)).reshape(self.bias.shape)
        dR = np.stack(dR_parts).reshape(self.R.shape)
        return dict(source=dsource, recurrent_weight=dR, input_weight=dW, bias=dbias)

    def initial_state_gradient(self, parts, like):
        """Concatenate per-direction [N, H] gradients into the given input's shape."""
        if like is None:
            return None
        return np.concatenate(parts, axis=-1).reshape(np.shape(like))


# --------------------------------------------------------------------------------------
# Single-gate RNN (contract: "Single-gate RNN")
# --------------------------------------------------------------------------------------


def _rnn_core(x, R, h0, m, act):
    """One direction, processing order. Returns h, z ([T, N, H] each)."""
    h = np.empty_like(x)
    z = np.empty_like(x)
    h_prev = h0
    for t in range(x.shape[0]):
        z[t] = x[t] + (h_prev * m) @ R.T
        h[t] = activate(z[t], act)
        h_prev = h[t]
    return h, z


def single_gate_rnn(
    source,
    recurrent_weight,
    input_weight=None,
    bias=None,
    init_state=None,
    mask=None,
    *,
    descriptor=None,
):
    layer = _Layer("single_gate_rnn", descriptor, 1, source, recurrent_weight, input_weight, bias)
    act = _act_field(descriptor, "activation", RELU)
    H = layer.H
    x = layer.projected_source()
    hs, zs = layer.each_direction(
        lambda d: _rnn_core(
            layer.from_input_time(x, d, H),
            layer.recurrent(d),
            layer.state_half(init_state, d),
            layer.mask_half(mask, d),
            act,
        )
    )
    z_state = layer.to_output_layout(zs) if _flag(descriptor, "training") else None
    return RNNResult(layer.to_output_layout(hs), z_state)


def _rnn_core_backward(dy, z, R, h0, m, act, dh_final):
    """BPTT of one direction, processing order. Returns dX', dR, dinitState."""
    dx = np.zeros_like(z)
    dR = np.zeros_like(R)
    dh_next = dh_final.copy()  # stateGradient enters at the last processed step
    for t in reversed(range(z.shape[0])):
        h_prev = activate(z[t - 1], act) if t > 0 else h0
        dh = dy[t] + dh_next
        dz = dh * activate_derivative(z[t], act)
        dx[t] = dz
        dR += dz.T @ (h_prev * m)
        dh_next = (dz @ R) * m
    return dx, dR, dh_next


def single_gate_rnn_gradients(
    source,
    recurrent_weight,
    source_gradient,
    z_state,
    *,
    state_gradient=None,
    input_weight=None,
    bias=None,
    init_state=None,
    mask=None,
    descriptor=None,
):
    layer = _Layer(
        "single_gate_rnn_gradients", descriptor, 1, source, recurrent_weight, input_weight, bias
    )
    act = _act_field(descriptor, "activation", RELU)
    H = layer.H
    dy, z_state = _f64(source_gradient), _f64(z_state)
    dxs, dRs, dh0s = layer.each_direction(
        lambda d: _rnn_core_backward(
            layer.from_output_layout(dy, d, H),
            layer.from_output_layout(z_state, d, H),
            layer.recurrent(d),
            layer.state_half(init_state, d),
            layer.mask_half(mask, d),
            act,
            layer.state_half(state_gradient, d),
        )
    )
    return RNNGradients(
        **layer.weight_gradients(dxs, dRs),
        init_state=layer.initial_state_gradient(dh0s, init_state),
    )


# --------------------------------------------------------------------------------------
# LSTM (contract: "LSTM")
# --------------------------------------------------------------------------------------


def _lstm_core(x, R, h0, c0, m, P, gates, acts, act):
    """One direction, processing order. Returns h, c ([T, N, H]) and a ([T, N, 4H])."""
    T, N = x.shape[:2]
    H = R.shape[1]
    h = np.empty((T, N, H))
    c = np.empty((T, N, H))
    a = np.empty((T, N, 4 * H))
    h_prev, c_prev = h0, c0
    for t in range(T):
        # The peephole reads c[t-1] for all four blocks, in gate order.
        a[t] = x[t] + (h_prev * m) @ R.T + P * np.tile(c_prev, 4)
        i, f, z, o = (activate(_block(a[t], gates[g], H), acts[g]) for g in "ifzo")
        c[t] = f * c_prev + i * z
        h[t] = o * activate(c[t], act)
        h_prev, c_prev = h[t], c[t]
    return h, c, a


def lstm(
    source,
    recurrent_weight,
    input_weight=None,
    bias=None,
    init_state=None,
    init_cell=None,
    mask=None,
    peephole=None,
    *,
    descriptor=None,
):
    layer = _Layer("lstm", descriptor, 4, source, recurrent_weight, input_weight, bias)
    gates, acts, act = _lstm_config(descriptor)
    H = layer.H
    x = layer.projected_source()
    hs, cs, zs = layer.each_direction(
        lambda d: _lstm_core(
            layer.from_input_time(x, d, 4 * H),
            layer.recurrent(d),
            layer.state_half(init_state, d),
            layer.state_half(init_cell, d),
            layer.mask_half(mask, d),
            layer.peephole_part(peephole, d),
            gates,
            acts,
            act,
        )
    )
    training = _flag(descriptor, "training")
    cell = layer.to_output_layout(cs) if training or _flag(descriptor, "produce_cell") else None
    z_state = layer.to_output_layout(zs) if training else None
    return LSTMResult(layer.to_output_layout(hs), cell, z_state)


def _lstm_core_backward(dy, dc_steps, a, c, R, h0, c0, m, P, gates, acts, act, dh_final, dc_final):
    """BPTT of one direction, processing order.

    ``dc_steps`` is the per-step cellGradient ([T, N, H]) or None; ``dc_final`` the
    final-cell form (zeros when not given). Returns dX', dR, dP, dinitState, dinitCell.
    """
    T = a.shape[0]
    H = R.shape[1]
    dx = np.zeros_like(a)
    dR = np.zeros_like(R)
    dP = np.zeros_like(P)
    dh_next = dh_final.copy()  # stateGradient enters at the last processed step
    dc_next = dc_final.copy()  # final-cell form of cellGradient
    P_blocks = {g: _block(P, k, H) for g, k in gates.items()}
    for t in reversed(range(T)):
        c_prev = c[t - 1] if t > 0 else c0
        if t > 0:  # h[t-1] = o[t-1] * phi(c[t-1]), from the stored pre-activations
            o_prev = activate(_block(a[t - 1], gates["o"], H), acts["o"])
            h_prev = o_prev * activate(c[t - 1], act)
        else:
            h_prev = h0
        pre = {g: _block(a[t], k, H) for g, k in gates.items()}
        val = {g: activate(pre[g], acts[g]) for g in gates}

        dh = dy[t] + dh_next
        dc = dh * val["o"] * activate_derivative(c[t], act) + dc_next
        if dc_steps is not None:
            dc = dc + dc_steps[t]
        da = {
            "o": dh * activate(c[t], act) * activate_derivative(pre["o"], acts["o"]),
            "i": dc * val["z"] * activate_derivative(pre["i"], acts["i"]),
            "z": dc * val["i"] * activate_derivative(pre["z"], acts["z"]),
            "f": dc * c_prev * activate_derivative(pre["f"], acts["f"]),
        }
        for g, k in gates.items():
            _block(dx[t], k, H)[...] = da[g]
            _block(dP, k, H)[...] += (da[g] * c_prev).sum(axis=0)
        dR += dx[t].T @ (h_prev * m)
        dh_next = (dx[t] @ R) * m
        dc_next = dc * val["f"] + sum(da[g] * P_blocks[g] for g in gates)
    return dx, dR, dP, dh_next, dc_next


def lstm_gradients(
    source,
    recurrent_weight,
    source_gradient,
    z_state,
    cell_output_fwd,
    *,
    state_gradient=None,
    cell_gradient=None,
    input_weight=None,
    bias=None,
    init_state=None,
    init_cell=None,
    mask=None,
    peephole=None,
    descriptor=None,
):
    layer = _Layer("lstm_gradients", descriptor, 4, source, recurrent_weight, input_weight, bias)
    gates, acts, act = _lstm_config(descriptor)
    H = layer.H
    dy, z_state, cell = _f64(source_gradient), _f64(z_state), _f64(cell_output_fwd)
    cell_gradient = _f64(cell_gradient)
    per_step = cell_gradient is not None and cell_gradient.ndim == 3
    dxs, dRs, dPs, dh0s, dc0s = layer.each_direction(
        lambda d: _lstm_core_backward(
            layer.from_output_layout(dy, d, H),
            layer.from_output_layout(cell_gradient, d, H) if per_step else None,
            layer.from_output_layout(z_state, d, 4 * H),
            layer.from_output_layout(cell, d, H),
            layer.recurrent(d),
            layer.state_half(init_state, d),
            layer.state_half(init_cell, d),
            layer.mask_half(mask, d),
            layer.peephole_part(peephole, d),
            gates,
            acts,
            act,
            layer.state_half(state_gradient, d),
            layer.state_half(None if per_step else cell_gradient, d),
        )
    )
    return LSTMGradients(
        **layer.weight_gradients(dxs, dRs),
        peephole=None if peephole is None else np.stack(dPs).reshape(np.shape(peephole)),
        init_state=layer.initial_state_gradient(dh0s, init_state),
        init_cell=layer.initial_state_gradient(dc0s, init_cell),
    )


# --------------------------------------------------------------------------------------
# GRU (contract: "GRU")
# --------------------------------------------------------------------------------------


def _gru_core(x, R, h0, m, b2, gates, acts, reset_after, flip_z):
    """One direction, processing order.

    Returns h ([T, N, H]) and the training state: [T, N, 3H] (pre-activations of z, r,
    o in gate order), or with reset_after [T, N, 4H] (z, r pre-activations, q in the o
    block, then x'_o).
    """
    T, N = x.shape[:2]
    H = R.shape[1]
    R_ = {g: _rows(R, k, H) for g, k in gates.items()}  # R_g: [H, H]
    h = np.empty((T, N, H))
    zs = np.empty((T, N, (4 if reset_after else 3) * H))
    h_prev = h0
    for t in range(T):
        xt = {g: _block(x[t], k, H) for g, k in gates.items()}
        h_m = h_prev * m  # h~
        a_z = xt["z"] + h_m @ R_["z"].T
        a_r = xt["r"] + h_m @ R_["r"].T
        z = activate(a_z, acts["z"])
        r = activate(a_r, acts["r"])
        if reset_after:
            q = h_m @ R_["o"].T + b2
            a_o = xt["o"] + r * q
        else:
            a_o = xt["o"] + (r * h_m) @ R_["o"].T
        o = activate(a_o, acts["o"])
        if flip_z:
            h[t] = (1.0 - z) * h_prev + z * o  # the blend uses the unmasked h[t-1]
        else:
            h[t] = z * h_prev + (1.0 - z) * o
        _block(zs[t], gates["z"], H)[...] = a_z
        _block(zs[t], gates["r"], H)[...] = a_r
        if reset_after:
            _block(zs[t], gates["o"], H)[...] = q
            _block(zs[t], 3, H)[...] = xt["o"]
        else:
            _block(zs[t], gates["o"], H)[...] = a_o
        h_prev = h[t]
    return h, zs


def gru(
    source,
    recurrent_weight,
    input_weight=None,
    bias=None,
    init_state=None,
    mask=None,
    secondary_bias=None,
    *,
    descriptor=None,
):
    layer = _Layer("gru", descriptor, 3, source, recurrent_weight, input_weight, bias)
    gates, acts, reset_after, flip_z = _gru_config(descriptor)
    H = layer.H
    x = layer.projected_source()
    hs, zs = layer.each_direction(
        lambda d: _gru_core(
            layer.from_input_time(x, d, 3 * H),
            layer.recurrent(d),
            layer.state_half(init_state, d),
            layer.mask_half(mask, d),
            layer.secondary_bias_half(secondary_bias if reset_after else None, d),
            gates,
            acts,
            reset_after,
            flip_z,
        )
    )
    z_state = layer.to_output_layout(zs) if _flag(descriptor, "training") else None
    return GRUResult(layer.to_output_layout(hs), z_state)


def _gru_core_backward(dy, zs, h, R, h0, m, gates, acts, reset_after, flip_z, dh_final):
    """BPTT of one direction, processing order. Returns dX', dR, db2, dinitState."""
    T = zs.shape[0]
    H = R.shape[1]
    R_ = {g: _rows(R, k, H) for g, k in gates.items()}  # R_g: [H, H]
    dx = np.zeros((T, h.shape[1], 3 * H))
    dR = np.zeros_like(R)
    dR_ = {g: _rows(dR, k, H) for g, k in gates.items()}  # views into dR
    db2 = np.zeros(H)
    dh_next = dh_final.copy()  # stateGradient enters at the last processed step
    for t in reversed(range(T)):
        h_prev = h[t - 1] if t > 0 else h0
        h_m = h_prev * m  # h~
        a_z = _block(zs[t], gates["z"], H)
        a_r = _block(zs[t], gates["r"], H)
        z = activate(a_z, acts["z"])
        r = activate(a_r, acts["r"])
        if reset_after:
            q = _block(zs[t], gates["o"], H)
            a_o = _block(zs[t], 3, H) + r * q
        else:
            a_o = _block(zs[t], gates["o"], H)
        o = activate(a_o, acts["o"])

        dh = dy[t] + dh_next
        if flip_z:
            dz, do, dh_direct = dh * (o - h_prev), dh * z, dh * (1.0 - z)
        else:
            dz, do, dh_direct = dh * (h_prev - o), dh * (1.0 - z), dh * z
        da_o = do * activate_derivative(a_o, acts["o"])
        if reset_after:
            dr = da_o * q
            dq = da_o * r
            dR_["o"] += dq.T @ h_m
            db2 += dq.sum(axis=0)
            dh_m = dq @ R_["o"]
        else:
            u = r * h_m
            du = da_o @ R_["o"]
            dr = du * h_m
            dh_m = du * r
            dR_["o"] += da_o.T @ u
        da_z = dz * activate_derivative(a_z, acts["z"])
        da_r = dr * activate_derivative(a_r, acts["r"])
        dR_["z"] += da_z.T @ h_m
        dR_["r"] += da_r.T @ h_m
        dh_m = dh_m + da_z @ R_["z"] + da_r @ R_["r"]
        _block(dx[t], gates["z"], H)[...] = da_z
        _block(dx[t], gates["r"], H)[...] = da_r
        _block(dx[t], gates["o"], H)[...] = da_o
        dh_next = dh_m * m + dh_direct
    return dx, dR, db2, dh_next


def gru_gradients(
    source,
    recurrent_weight,
    source_gradient,
    z_state,
    output_fwd,
    *,
    state_gradient=None,
    input_weight=None,
    bias=None,
    init_state=None,
    mask=None,
    secondary_bias=None,
    descriptor=None,
):
    layer = _Layer("gru_gradients", descriptor, 3, source, recurrent_weight, input_weight, bias)
    gates, acts, reset_after, flip_z = _gru_config(descriptor)
    H = layer.H
    zw = (4 if reset_after else 3) * H  # training state width per direction
    dy, z_state, h = _f64(source_gradient), _f64(z_state), _f64(output_fwd)
    dxs, dRs, db2s, dh0s = layer.each_direction(
        lambda d: _gru_core_backward(
            layer.from_output_layout(dy, d, H),
            layer.from_output_layout(z_state, d, zw),
            layer.from_output_layout(h, d, H),
            layer.recurrent(d),
            layer.state_half(init_state, d),
            layer.mask_half(mask, d),
            gates,
            acts,
            reset_after,
            flip_z,
            layer.state_half(state_gradient, d),
        )
    )
    dsecondary = None
    if secondary_bias is not None:  # zeros when resetAfter is false (db2 stays 0)
        dsecondary = np.concatenate(db2s).reshape(np.shape(secondary_bias))
    return GRUGradients(
        **layer.weight_gradients(dxs, dRs),
        init_state=layer.initial_state_gradient(dh0s, init_state),
        secondary_bias=dsecondary,
    )

"""Run a PyTorch nn.GRU's weights through rnncore, forward and backward, and compare.

The mapping is the contract's (docs/semantics.md, "Mapping other frameworks"): PyTorch's
GRU is reset_gate_first + reset_after, its weights are used as stored, the r and z biases
are summed, and b_hn becomes the secondary bias.
"""

import numpy as np
import torch

import rnncore

T, N, I, H = 20, 4, 8, 16  # noqa: E741 (the contract's names)
torch.manual_seed(0)
gru = torch.nn.GRU(I, H, bidirectional=True)
x = torch.randn(T, N, I, requires_grad=True)
h0 = torch.randn(2, N, H, requires_grad=True)

# PyTorch forward and backward of sum(y * dy).
y, hn = gru(x, h0)
dy = torch.randn_like(y)
(y * dy).sum().backward()

# The same layer in rnncore.
p = {k: v.detach().numpy() for k, v in gru.named_parameters()}
sfx = ["_l0", "_l0_reverse"]
W = np.concatenate([p["weight_ih" + s] for s in sfx])  # [2*3H, I]
R = np.stack([p["weight_hh" + s] for s in sfx])  # [2, 3H, H]
bias = np.concatenate(
    [
        np.concatenate(
            [p["bias_ih" + s][: 2 * H] + p["bias_hh" + s][: 2 * H], p["bias_ih" + s][2 * H :]]
        )
        for s in sfx
    ]
)
b2 = np.concatenate([p["bias_hh" + s][2 * H :] for s in sfx])
init = np.concatenate([h0.detach().numpy()[0], h0.detach().numpy()[1]], axis=1)  # [N, 2H]
desc = rnncore.GRUDescriptor(
    bidirectional=True, reset_gate_first=True, reset_after=True, training=True
)

xs = x.detach().numpy()
out = rnncore.gru(xs, R, W, bias, init, None, b2, descriptor=desc)
grads = rnncore.gru_gradients(
    xs, R, dy.numpy(), out.z_state, out.state,
    input_weight=W, bias=bias, init_state=init, secondary_bias=b2, descriptor=desc,
)  # fmt: skip


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


print(f"state      rel. error {rel(out.state, y.detach().numpy()):.1e}")
print(f"d source   rel. error {rel(grads.source, x.grad.numpy()):.1e}")
dW_torch = np.concatenate([gru.get_parameter("weight_ih" + s).grad.numpy() for s in sfx])
print(f"d W        rel. error {rel(grads.input_weight, dW_torch):.1e}")
dR_torch = np.stack([gru.get_parameter("weight_hh" + s).grad.numpy() for s in sfx])
print(f"d R        rel. error {rel(grads.recurrent_weight, dR_torch):.1e}")
dh0 = np.concatenate([h0.grad.numpy()[0], h0.grad.numpy()[1]], axis=1)
print(f"d h0       rel. error {rel(grads.init_state, dh0):.1e}")
worst = max(
    rel(out.state, y.detach().numpy()),
    rel(grads.source, x.grad.numpy()),
    rel(grads.input_weight, dW_torch),
    rel(grads.recurrent_weight, dR_torch),
    rel(grads.init_state, dh0),
)
assert worst < 1e-4, worst
print("rnncore matches PyTorch")

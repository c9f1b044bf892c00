"""Run a PyTorch nn.GRU's weights through rnncore, forward and backward, and compare.

rnncore.convert maps the layer (docs/semantics.md, "Mapping other frameworks"): PyTorch's
GRU is reset_gate_first + reset_after, its weights are used as stored, the r and z biases
are summed and b_hn becomes the secondary bias; the gradients map back to PyTorch's names.
"""

import numpy as np
import torch

import rnncore
from rnncore.convert import from_torch, gradients_to_torch

T, N, I, H = 20, 4, 8, 16  # noqa: E741 (the contract's names)
torch.manual_seed(0)
gru = torch.nn.GRU(I, H, bidirectional=True)
x = torch.randn(T, N, I, requires_grad=True)
h0 = torch.randn(2, N, H, requires_grad=True)

# PyTorch forward and backward of sum(y * dy).
y, hn = gru(x, h0)
dy = torch.randn_like(y)
(y * dy).sum().backward()

# The same layer in rnncore; PyTorch's initial state [2, N, H] is rnncore's [N, 2H].
(layer,) = from_torch(gru, training=True)
w = layer.weights
init = np.concatenate([h0.detach().numpy()[0], h0.detach().numpy()[1]], axis=1)
xs = x.detach().numpy()
out = rnncore.gru(xs, init_state=init, **layer.arguments())
grads = rnncore.gru_gradients(
    xs, w["recurrent_weight"], dy.numpy(), out.z_state, out.state,
    input_weight=w["input_weight"], bias=w["bias"], init_state=init,
    secondary_bias=w["secondary_bias"], descriptor=layer.descriptor,
)  # fmt: skip


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


errors = {
    "state": rel(out.state, y.detach().numpy()),
    "d source": rel(grads.source, x.grad.numpy()),
    "d h0": rel(grads.init_state, np.concatenate([h0.grad.numpy()[0], h0.grad.numpy()[1]], 1)),
}
for name, g in gradients_to_torch("gru", grads, bidirectional=True).items():
    errors["d " + name] = rel(g, gru.get_parameter(name).grad.numpy())
for name, err in errors.items():
    print(f"{name:22} rel. error {err:.1e}")
worst = max(errors.values())
assert worst < 1e-4, worst
print("rnncore matches PyTorch")

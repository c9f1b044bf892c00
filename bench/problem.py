"""Random inputs and weights for one configuration, and their layout in each framework.

The weights are drawn once in PyTorch's layout (per direction: weight_ih, weight_hh,
bias_ih, bias_hh, gate blocks r, z, n for the GRU and i, f, g, o for the LSTM) and mapped
onto rnncore with the contract's mappings (docs/semantics.md, "Mapping other
frameworks onto the descriptors"), and onto ONNX and MLX with their own conventions.

Gradients are compared in rnncore's layout ("canonical"): dx [T, N, I], dW [D·G·H, I],
dR [G·H, H] or [2, G·H, H], dbias [D·G·H] and, for the GRU, db2 [D·H].
"""

import zlib

import numpy as np

from rnncore.bench import rel_err

# Gate blocks of PyTorch's layout, in the order ONNX stores them.
ONNX_GATE_ORDER = {"rnn": (0,), "gru": (1, 0, 2), "lstm": (0, 3, 1, 2)}  # z,r,h / i,o,f,c


class Problem:
    """Inputs, upstream gradient and weights of one configuration, in its dtype."""

    def __init__(self, config):
        self.config = config
        c = config
        self.dtype = np.dtype(c.dtype)
        rng = np.random.default_rng(zlib.crc32(c.name.encode()))
        GH = c.G * c.H

        def normal(shape, scale):
            return (scale * rng.standard_normal(shape)).astype(self.dtype)

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
        """input_weight, recurrent_weight, bias (and secondary_bias) per the contract's
        PyTorch mappings; bidirectional layers concatenate / stack the two directions."""
        c, H = self.config, self.config.H
        p = self.torch_params
        weights = {
            "input_weight": np.concatenate([d["weight_ih"] for d in p]),
            "recurrent_weight": np.stack([d["weight_hh"] for d in p])
            if c.D == 2
            else p[0]["weight_hh"],
        }
        if c.kind == "gru":
            # bias = [b_ir + b_hr, b_iz + b_hz, b_in], secondary_bias = b_hn.
            weights["bias"] = np.concatenate(
                [
                    np.concatenate(
                        [d["bias_ih"][: 2 * H] + d["bias_hh"][: 2 * H], d["bias_ih"][2 * H :]]
                    )
                    for d in p
                ]
            )
            weights["secondary_bias"] = np.concatenate([d["bias_hh"][2 * H :] for d in p])
        else:
            weights["bias"] = np.concatenate([d["bias_ih"] + d["bias_hh"] for d in p])
        return {k: np.ascontiguousarray(v) for k, v in weights.items()}

    def onnx_weights(self):
        """ONNX's W [D, G·H, I], R [D, G·H, H], B [D, 2·G·H] (gate blocks reordered)."""
        order = ONNX_GATE_ORDER[self.config.kind]

        def reorder(a):
            blocks = np.split(a, len(order), axis=0)
            return np.concatenate([blocks[k] for k in order], axis=0)

        p = self.torch_params
        W = np.stack([reorder(d["weight_ih"]) for d in p])
        R = np.stack([reorder(d["weight_hh"]) for d in p])
        B = np.stack([np.concatenate([reorder(d["bias_ih"]), reorder(d["bias_hh"])]) for d in p])
        return W, R, B


def torch_grads_to_canonical(config, grads):
    """Gradients of PyTorch's parameters (one dict per direction) in rnncore's layout.

    With the contract's mappings, d bias = d bias_ih (the b_hh part of each summed bias
    gets the same gradient), and the GRU's d secondary_bias = d bias_hh[n block].
    """
    H = config.H
    out = {
        "dW": np.concatenate([g["weight_ih"] for g in grads]),
        "dR": np.stack([g["weight_hh"] for g in grads]) if config.D == 2 else grads[0]["weight_hh"],
        "dbias": np.concatenate([g["bias_ih"] for g in grads]),
    }
    if config.kind == "gru":
        out["db2"] = np.concatenate([g["bias_hh"][2 * H :] for g in grads])
    return out


def compare(actual, expected):
    """Relative error of every field of `expected` (a dict of arrays) in `actual`."""
    return {k: rel_err(actual[k], v) if k in actual else float("inf") for k, v in expected.items()}

"""PyTorch's recurrent layers in rnncore's terms, and rnncore's gradients in PyTorch's.

The mappings are the contract's (docs/semantics.md, "Mapping other frameworks onto the
descriptors"): ``nn.GRU`` is ``reset_gate_first`` + ``reset_after`` with its weights as
stored (gate blocks r, z, n), ``bias = [b_ir + b_hr, b_iz + b_hz, b_in]`` and
``secondary_bias = b_hn``; ``nn.LSTM`` keeps the default descriptor (blocks i, f, g, o) and
``nn.RNN`` is the single-gate RNN with its nonlinearity, both with ``bias = b_ih + b_hh``.
A bidirectional layer concatenates the two directions' input weights and biases and stacks
the recurrent weights as ``[2, G*H, H]``.

Arrays go in and come out as numpy arrays; torch is imported only by the functions that
take a torch module. Kinds are ``"rnn"``, ``"lstm"`` and ``"gru"``, as in
``rnncore._ops.KINDS``.

    import rnncore, rnncore.convert, torch

    layers = rnncore.convert.from_torch(torch.nn.GRU(8, 16, num_layers=2))
    y = x  # [T, N, 8], float32
    for layer in layers:
        y = rnncore.gru(y, **layer.arguments()).state
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ._ops import KINDS

# PyTorch's names for one direction's parameters (the suffix ``_l{layer}`` and, for the
# reverse direction of a bidirectional layer, ``_reverse`` follow).
TORCH_PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")

# ONNX stores gate blocks in another order than PyTorch: for each ONNX block, the index of
# PyTorch's block it holds (GRU z, r, h from r, z, n; LSTM i, o, f, c from i, f, g, o).
ONNX_GATE_ORDER = {"rnn": (0,), "gru": (1, 0, 2), "lstm": (0, 3, 1, 2)}


class Layer(NamedTuple):
    """One PyTorch layer as rnncore computes it.

    ``weights`` holds ``input_weight``, ``recurrent_weight`` and, when the layer has
    biases, ``bias`` (and the GRU's ``secondary_bias``): the keyword arguments of
    ``rnncore.single_gate_rnn`` / ``lstm`` / ``gru`` besides the input and the state.
    """

    kind: str
    descriptor: Any
    weights: dict

    def arguments(self) -> dict:
        """``weights`` and ``descriptor`` as keyword arguments of the forward function."""
        return {**self.weights, "descriptor": self.descriptor}


def _numpy(value) -> np.ndarray:
    """A numpy array of a torch tensor (detached, on the CPU) or of an array-like."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def torch_kind(module) -> str:
    """``"rnn"``, ``"lstm"`` or ``"gru"`` for a torch.nn.RNN / LSTM / GRU."""
    import torch

    for cls, kind in ((torch.nn.GRU, "gru"), (torch.nn.LSTM, "lstm"), (torch.nn.RNN, "rnn")):
        if isinstance(module, cls):
            return kind
    raise TypeError(f"not a torch.nn.RNN, LSTM or GRU: {type(module).__name__}")


def torch_suffix(layer: int = 0, direction: int = 0) -> str:
    """The suffix of PyTorch's parameter names: ``_l0``, ``_l0_reverse``, ``_l1`` ..."""
    return f"_l{layer}" + ("_reverse" if direction else "")


def torch_directions(state_dict: Mapping, layer: int = 0, bidirectional: bool = False) -> list:
    """One layer's parameters per direction, as numpy arrays keyed by TORCH_PARAMETERS
    (the biases only when the state dict has them)."""
    directions = []
    for d in range(2 if bidirectional else 1):
        suffix = torch_suffix(layer, d)
        directions.append(
            {
                n: _numpy(state_dict[n + suffix])
                for n in TORCH_PARAMETERS
                if n + suffix in state_dict
            }
        )
    return directions


def descriptor_for_torch(kind: str, *, nonlinearity: str = "tanh", **fields):
    """The descriptor of PyTorch's layer of `kind` (``nonlinearity`` is nn.RNN's, "tanh" or
    "relu"); `fields` (bidirectional, training, produce_cell, ...) are set as given."""
    import rnncore

    cls = getattr(rnncore, KINDS[kind].descriptor)
    if kind == "gru":
        fields = {"reset_gate_first": True, "reset_after": True, "flip_z": False, **fields}
    elif kind == "rnn":
        fields = {"activation": getattr(rnncore.Activation, nonlinearity.upper()), **fields}
    return cls(**fields)


def weights_from_torch(kind: str, directions: Sequence[Mapping]) -> dict:
    """rnncore's ``input_weight``, ``recurrent_weight``, ``bias`` (and the GRU's
    ``secondary_bias``) from one layer's PyTorch parameters, one mapping per direction
    (TORCH_PARAMETERS as keys; without biases, no bias is returned). Contiguous arrays
    in the parameters' dtype."""
    if len(directions) == 1 and all(isinstance(v, np.ndarray) for v in directions[0].values()):
        return _one_direction(kind, directions[0])  # a layer's call: the same, faster
    p = [{k: _numpy(v) for k, v in d.items()} for d in directions]
    # One direction's arrays are used as they are (no copy a call: a layer called a step
    # at a time spent more on copying W than on its step).
    weights = {
        "input_weight": np.concatenate([d["weight_ih"] for d in p])
        if len(p) == 2
        else p[0]["weight_ih"],
        "recurrent_weight": np.stack([d["weight_hh"] for d in p])
        if len(p) == 2
        else p[0]["weight_hh"],
    }
    if "bias_ih" in p[0]:
        if kind == "gru":
            H = p[0]["weight_hh"].shape[1]
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


def _one_direction(kind: str, d: Mapping) -> dict:
    """weights_from_torch of one direction's numpy arrays (rnncore.torch's layer calls)."""
    c = np.ascontiguousarray
    weights = {"input_weight": c(d["weight_ih"]), "recurrent_weight": c(d["weight_hh"])}
    b_ih, b_hh = d.get("bias_ih"), d.get("bias_hh")
    if b_ih is not None:
        if kind == "gru":
            H2 = 2 * d["weight_hh"].shape[1]
            weights["bias"] = np.concatenate([b_ih[:H2] + b_hh[:H2], b_ih[H2:]])
            weights["secondary_bias"] = c(b_hh[H2:])
        else:
            weights["bias"] = b_ih + b_hh
    return weights


def from_torch_state_dict(
    kind: str,
    state_dict: Mapping,
    *,
    num_layers: int = 1,
    bidirectional: bool = False,
    nonlinearity: str = "tanh",
    **fields,
) -> list:
    """Every layer of a PyTorch RNN / LSTM / GRU given by its state dict (tensors or
    arrays) and options, as a list of Layer. `fields` go to each descriptor (e.g.
    ``training=True``). PyTorch's ``batch_first`` changes only the input layout: transpose
    the input to [T, N, I] yourself. LSTM projections (``proj_size``) have no rnncore
    counterpart."""
    if any(k.startswith("weight_hr") for k in state_dict):
        raise ValueError("LSTM projections (proj_size > 0) have no rnncore counterpart")
    desc = descriptor_for_torch(
        kind, nonlinearity=nonlinearity, bidirectional=bidirectional, **fields
    )
    return [
        Layer(
            kind, desc, weights_from_torch(kind, torch_directions(state_dict, layer, bidirectional))
        )
        for layer in range(num_layers)
    ]


def from_torch(module, **fields) -> list:
    """Every layer of a torch.nn.RNN / LSTM / GRU as a list of Layer (see
    from_torch_state_dict; `fields` go to each descriptor, e.g. ``training=True``)."""
    if getattr(module, "proj_size", 0):
        raise ValueError("LSTM projections (proj_size > 0) have no rnncore counterpart")
    return from_torch_state_dict(
        torch_kind(module),
        module.state_dict(),
        num_layers=module.num_layers,
        bidirectional=module.bidirectional,
        nonlinearity=getattr(module, "nonlinearity", "tanh"),
        **fields,
    )


def gradients_to_torch(
    kind: str, gradients, *, layer: int = 0, bidirectional: bool = False
) -> dict:
    """rnncore's weight gradients of one layer under PyTorch's parameter names
    (``weight_ih_l0``, ``bias_hh_l0_reverse``, ...), as numpy arrays.

    `gradients` is a gradient result (or a mapping with its fields ``input_weight``,
    ``recurrent_weight``, ``bias``, ``secondary_bias``). With the mapping above each summed
    bias passes its gradient to both parts: d b_ih = d bias, and d b_hh = d bias (the GRU:
    ``[d bias_r, d bias_z, d secondary_bias]``, left out without a secondary bias). Fields
    that are None are left out.
    """
    g = gradients._asdict() if hasattr(gradients, "_asdict") else dict(gradients)
    D = 2 if bidirectional else 1

    def part(a):  # direction d's rows of a (np.split cost 5-10 us a call at T=1)
        a = np.asarray(a)
        n = a.shape[0] // D
        return a[d * n : (d + 1) * n]

    out = {}
    for d in range(D):
        suffix = torch_suffix(layer, d)
        if g.get("input_weight") is not None:
            out["weight_ih" + suffix] = part(g["input_weight"])
        R = np.asarray(g["recurrent_weight"])
        out["weight_hh" + suffix] = R[d] if bidirectional else R
        if g.get("bias") is None:
            continue
        bias = part(g["bias"])
        out["bias_ih" + suffix] = bias
        if kind == "gru":
            if g.get("secondary_bias") is not None:  # b_hn's gradient is d secondary_bias
                H = bias.shape[0] // 3
                b2 = part(g["secondary_bias"])
                out["bias_hh" + suffix] = np.concatenate([bias[: 2 * H], b2])
        else:
            out["bias_hh" + suffix] = bias
    return out


def onnx_weights_from_torch(kind: str, directions: Sequence[Mapping]) -> tuple:
    """ONNX's ``W`` [D, G*H, I], ``R`` [D, G*H, H] and ``B`` [D, 2*G*H] from one layer's
    PyTorch parameters (one mapping per direction), gate blocks in ONNX's order. The ONNX
    GRU node needs ``linear_before_reset = 1`` (PyTorch's reset-after)."""
    order = ONNX_GATE_ORDER[kind]

    def reorder(a):
        blocks = np.split(_numpy(a), len(order), axis=0)
        return np.concatenate([blocks[k] for k in order], axis=0)

    W = np.stack([reorder(d["weight_ih"]) for d in directions])
    R = np.stack([reorder(d["weight_hh"]) for d in directions])
    B = np.stack(
        [np.concatenate([reorder(d["bias_ih"]), reorder(d["bias_hh"])]) for d in directions]
    )
    return W, R, B

"""rnncore: MPSGraph's recurrent layers (single-gate RNN, LSTM, GRU) on the CPU and Apple GPUs.

The equations, layouts and shapes are the contract in shared/spec/semantics.md; every
function here takes numpy (or any buffer-protocol / DLPack CPU) arrays and returns numpy
arrays. The work is done by the compiled module ``rnncore._core``.
"""

from typing import NamedTuple, Optional

import numpy as np

from . import _core
from ._core import (
    Activation,
    GRUDescriptor,
    LSTMDescriptor,
    RNNDescriptor,
    __version__,
    build_info,
    devices,
)

__all__ = [
    "Activation",
    "GRUDescriptor",
    "GRUResult",
    "LSTMDescriptor",
    "LSTMResult",
    "RNNDescriptor",
    "RNNResult",
    "__version__",
    "build_info",
    "devices",
    "gru",
    "lstm",
    "single_gate_rnn",
]


class RNNResult(NamedTuple):
    state: np.ndarray
    z_state: Optional[np.ndarray]


class LSTMResult(NamedTuple):
    state: np.ndarray
    cell: Optional[np.ndarray]
    z_state: Optional[np.ndarray]


class GRUResult(NamedTuple):
    state: np.ndarray
    z_state: Optional[np.ndarray]


def single_gate_rnn(
    source,
    recurrent_weight,
    input_weight=None,
    bias=None,
    init_state=None,
    mask=None,
    *,
    descriptor: Optional[RNNDescriptor] = None,
    device: Optional[str] = None,
) -> RNNResult:
    """Single-gate RNN forward: ``h[t] = act(x'[t] + (h[t-1] * mask) @ R.T)``.

    source [T, N, I] (or [T, N, D*H] without input_weight), recurrent_weight [H, H]
    (or [2, H, H] when bidirectional), input_weight [D*H, I], bias [D*H],
    init_state [N, D*H], mask broadcastable to [N, D*H]. Returns state [T, N, D*H] and,
    when ``descriptor.training``, z_state (the pre-activations).
    """
    return RNNResult(
        *_core.single_gate_rnn(
            source,
            recurrent_weight,
            input_weight,
            bias,
            init_state,
            mask,
            descriptor=descriptor,
            device=device,
        )
    )


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
    descriptor: Optional[LSTMDescriptor] = None,
    device: Optional[str] = None,
) -> LSTMResult:
    """LSTM forward (gate blocks i, f, z, o; or i, z, f, o with forget_gate_last).

    source [T, N, I] (or [T, N, D*4H]), recurrent_weight [4H, H] (or [2, 4H, H]),
    input_weight [D*4H, I], bias [D*4H], init_state and init_cell [N, D*H], mask
    broadcastable to [N, D*H], peephole [4H] (or [2, 4H]). Returns state, cell (with
    produce_cell or training) and z_state (with training, [T, N, D*4H]).
    """
    return LSTMResult(
        *_core.lstm(
            source,
            recurrent_weight,
            input_weight,
            bias,
            init_state,
            init_cell,
            mask,
            peephole,
            descriptor=descriptor,
            device=device,
        )
    )


def gru(
    source,
    recurrent_weight,
    input_weight=None,
    bias=None,
    init_state=None,
    mask=None,
    secondary_bias=None,
    *,
    descriptor: Optional[GRUDescriptor] = None,
    device: Optional[str] = None,
) -> GRUResult:
    """GRU forward (gate blocks z, r, o; or r, z, o with reset_gate_first).

    source [T, N, I] (or [T, N, D*3H]), recurrent_weight [3H, H] (or [2, 3H, H]),
    input_weight [D*3H, I], bias [D*3H], init_state [N, D*H], mask broadcastable to
    [N, D*H], secondary_bias [D*H] (used with reset_after). Returns state and, with
    training, z_state ([T, N, D*3H], or [T, N, D*4H] with reset_after).
    """
    return GRUResult(
        *_core.gru(
            source,
            recurrent_weight,
            input_weight,
            bias,
            init_state,
            mask,
            secondary_bias,
            descriptor=descriptor,
            device=device,
        )
    )

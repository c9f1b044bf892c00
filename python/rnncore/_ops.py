"""What every part of rnncore knows about the three operations, in one place: the result
types and, per kind ("rnn", "lstm", "gru"), the gate count, the function and descriptor
names, the inputs and the gradient fields. Pure Python (numpy only), so that the
reference can import it without the compiled extension.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

# A result array: float32, float64 or float16, as the inputs.
Array = NDArray[np.floating]


class RNNResult(NamedTuple):
    state: Array
    z_state: Array | None


class LSTMResult(NamedTuple):
    state: Array
    cell: Array | None
    z_state: Array | None


class GRUResult(NamedTuple):
    state: Array
    z_state: Array | None


class RNNGradients(NamedTuple):
    source: Array
    recurrent_weight: Array
    input_weight: Array | None
    bias: Array | None
    init_state: Array | None


class LSTMGradients(NamedTuple):
    source: Array
    recurrent_weight: Array
    input_weight: Array | None
    bias: Array | None
    peephole: Array | None
    init_state: Array | None
    init_cell: Array | None


class GRUGradients(NamedTuple):
    source: Array
    recurrent_weight: Array
    input_weight: Array | None
    bias: Array | None
    init_state: Array | None
    secondary_bias: Array | None


class Kind(NamedTuple):
    """One operation kind. Names are attributes of the ``rnncore`` package (and of
    ``rnncore.reference`` for the functions)."""

    name: str  # "rnn", "lstm", "gru"
    gates: int  # G of the contract
    forward: str  # forward function
    gradients: str  # gradient function
    descriptor: str  # descriptor class
    result: type  # forward result type
    gradient_result: type  # gradient result type
    optional_inputs: tuple  # forward inputs besides source and recurrent_weight, in order
    # Positional inputs of the gradient function, in order.
    gradient_required: tuple

    @property
    def gradient_fields(self) -> tuple:
        return self.gradient_result._fields


KINDS = {
    "rnn": Kind(
        "rnn",
        1,
        "single_gate_rnn",
        "single_gate_rnn_gradients",
        "RNNDescriptor",
        RNNResult,
        RNNGradients,
        ("input_weight", "bias", "init_state", "mask"),
        ("source", "recurrent_weight", "source_gradient", "z_state"),
    ),
    "lstm": Kind(
        "lstm",
        4,
        "lstm",
        "lstm_gradients",
        "LSTMDescriptor",
        LSTMResult,
        LSTMGradients,
        ("input_weight", "bias", "init_state", "init_cell", "mask", "peephole"),
        ("source", "recurrent_weight", "source_gradient", "z_state", "cell_output_fwd"),
    ),
    "gru": Kind(
        "gru",
        3,
        "gru",
        "gru_gradients",
        "GRUDescriptor",
        GRUResult,
        GRUGradients,
        ("input_weight", "bias", "init_state", "mask", "secondary_bias"),
        ("source", "recurrent_weight", "source_gradient", "z_state", "output_fwd"),
    ),
}


def flag_fields(descriptor_class) -> tuple:
    """The boolean fields of a descriptor class (read from the binding, in order)."""
    d = descriptor_class()
    return tuple(f for f in descriptor_class._fields if isinstance(getattr(d, f), bool))


def activation_fields(descriptor_class) -> tuple:
    """The activation fields of a descriptor class (read from the binding, in order)."""
    d = descriptor_class()
    return tuple(f for f in descriptor_class._fields if not isinstance(getattr(d, f), bool))


def rel_err(actual, expected) -> float:
    """||actual - expected|| / ||expected|| in float64 (the absolute error when expected is
    about 0; inf when the shapes differ)."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf")
    den = float(np.linalg.norm(e))
    num = float(np.linalg.norm(a - e))
    return num / den if den > 1e-30 else num

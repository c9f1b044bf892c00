"""rnncore: MPSGraph's recurrent layers (single-gate RNN, LSTM, GRU) on the CPU and Apple GPUs.

The equations, layouts and shapes are the contract in docs/semantics.md; every
function here takes numpy (or any buffer-protocol / DLPack CPU) arrays and returns numpy
arrays. The work is done by the compiled module ``rnncore._core``.
"""

from typing import Optional

from numpy.typing import ArrayLike

from . import _core
from ._core import (
    Activation,
    GRUDescriptor,
    LSTMDescriptor,
    RNNDescriptor,
    __version__,
    build_info,
    devices,
    num_threads,
    set_num_threads,
)
from ._ops import (
    GRUGradients,
    GRUResult,
    LSTMGradients,
    LSTMResult,
    RNNGradients,
    RNNResult,
)

__all__ = [
    "Activation",
    "GRUDescriptor",
    "GRUGradients",
    "GRUResult",
    "LSTMDescriptor",
    "LSTMGradients",
    "LSTMResult",
    "RNNDescriptor",
    "RNNGradients",
    "RNNResult",
    "__version__",
    "build_info",
    "devices",
    "gru",
    "gru_gradients",
    "lstm",
    "lstm_gradients",
    "num_threads",
    "set_num_threads",
    "single_gate_rnn",
    "single_gate_rnn_gradients",
]


def __dir__():
    # The public API only: not the imports above nor the private modules.
    return list(__all__)


# The wrappers pass _core its arrays by position (in _core's order, which
# tests/test_package.py checks) and make the result type's instance from the tuple it
# returns by tuple.__new__: locals() passed as keywords and a NamedTuple's Python-level
# __new__ took a microsecond a call, where a decoder's step takes 10-30.
_result = tuple.__new__


def single_gate_rnn(
    source: ArrayLike,
    recurrent_weight: ArrayLike,
    input_weight: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    init_state: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    *,
    sequence_lengths: Optional[ArrayLike] = None,
    descriptor: Optional[RNNDescriptor] = None,
    device: Optional[str] = None,
) -> RNNResult:
    """Single-gate RNN forward: ``h[t] = act(x'[t] + (h[t-1] * mask) @ R.T)``.

    source [T, N, I] (or [T, N, D*H] without input_weight), recurrent_weight [H, H]
    (or [2, H, H] when bidirectional), input_weight [D*H, I], bias [D*H],
    init_state [N, D*H], mask broadcastable to [N, D*H]. Returns state [T, N, D*H] and,
    when ``descriptor.training``, z_state (the pre-activations).
    """
    return _result(
        RNNResult,
        _core.single_gate_rnn(
            source,
            recurrent_weight,
            input_weight,
            bias,
            init_state,
            mask,
            sequence_lengths=sequence_lengths,
            descriptor=descriptor,
            device=device,
        ),
    )


def lstm(
    source: ArrayLike,
    recurrent_weight: ArrayLike,
    input_weight: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    init_state: Optional[ArrayLike] = None,
    init_cell: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    peephole: Optional[ArrayLike] = None,
    *,
    sequence_lengths: Optional[ArrayLike] = None,
    descriptor: Optional[LSTMDescriptor] = None,
    device: Optional[str] = None,
) -> LSTMResult:
    """LSTM forward (gate blocks i, f, z, o; or i, z, f, o with forget_gate_last).

    source [T, N, I] (or [T, N, D*4H]), recurrent_weight [4H, H] (or [2, 4H, H]),
    input_weight [D*4H, I], bias [D*4H], init_state and init_cell [N, D*H], mask
    broadcastable to [N, D*H], peephole [4H] (or [2, 4H]). Returns state, cell (with
    produce_cell or training) and z_state (with training, [T, N, D*4H]).
    """
    return _result(
        LSTMResult,
        _core.lstm(
            source,
            recurrent_weight,
            input_weight,
            bias,
            init_state,
            init_cell,
            mask,
            peephole,
            sequence_lengths=sequence_lengths,
            descriptor=descriptor,
            device=device,
        ),
    )


def gru(
    source: ArrayLike,
    recurrent_weight: ArrayLike,
    input_weight: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    init_state: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    secondary_bias: Optional[ArrayLike] = None,
    *,
    sequence_lengths: Optional[ArrayLike] = None,
    descriptor: Optional[GRUDescriptor] = None,
    device: Optional[str] = None,
) -> GRUResult:
    """GRU forward (gate blocks z, r, o; or r, z, o with reset_gate_first).

    source [T, N, I] (or [T, N, D*3H]), recurrent_weight [3H, H] (or [2, 3H, H]),
    input_weight [D*3H, I], bias [D*3H], init_state [N, D*H], mask broadcastable to
    [N, D*H], secondary_bias [D*H] (used with reset_after). Returns state and, with
    training, z_state ([T, N, D*3H], or [T, N, D*4H] with reset_after).
    """
    return _result(
        GRUResult,
        _core.gru(
            source,
            recurrent_weight,
            input_weight,
            bias,
            init_state,
            mask,
            secondary_bias,
            sequence_lengths=sequence_lengths,
            descriptor=descriptor,
            device=device,
        ),
    )


def single_gate_rnn_gradients(
    source: ArrayLike,
    recurrent_weight: ArrayLike,
    source_gradient: ArrayLike,
    z_state: ArrayLike,
    *,
    state_gradient: Optional[ArrayLike] = None,
    input_weight: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    init_state: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    sequence_lengths: Optional[ArrayLike] = None,
    descriptor: RNNDescriptor,
    device: Optional[str] = None,
) -> RNNGradients:
    """Gradients of :func:`single_gate_rnn` by back-propagation through time.

    source_gradient is dL/d(state) in the state output's layout; z_state comes from a
    forward run with ``training=True``; ``descriptor`` is that run's descriptor (required:
    the defaults would give the gradients of another operation); state_gradient [N, D*H]
    is an extra gradient into each direction's final state. Returns the gradient of every
    input that was given (None for the others), each in that input's shape.
    """
    return _result(
        RNNGradients,
        _core.single_gate_rnn_gradients(
            source,
            recurrent_weight,
            source_gradient,
            z_state,
            state_gradient=state_gradient,
            input_weight=input_weight,
            bias=bias,
            init_state=init_state,
            mask=mask,
            sequence_lengths=sequence_lengths,
            descriptor=descriptor,
            device=device,
        ),
    )


def lstm_gradients(
    source: ArrayLike,
    recurrent_weight: ArrayLike,
    source_gradient: ArrayLike,
    z_state: ArrayLike,
    cell_output_fwd: ArrayLike,
    *,
    state_gradient: Optional[ArrayLike] = None,
    cell_gradient: Optional[ArrayLike] = None,
    input_weight: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    init_state: Optional[ArrayLike] = None,
    init_cell: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    peephole: Optional[ArrayLike] = None,
    sequence_lengths: Optional[ArrayLike] = None,
    descriptor: LSTMDescriptor,
    device: Optional[str] = None,
) -> LSTMGradients:
    """Gradients of :func:`lstm` by back-propagation through time.

    cell_output_fwd is the forward cell output; cell_gradient is dL/d(final cell)
    [N, D*H] or dL/d(c[t]) for every step [T, N, D*H]. See
    :func:`single_gate_rnn_gradients` for the other arguments.
    """
    return _result(
        LSTMGradients,
        _core.lstm_gradients(
            source,
            recurrent_weight,
            source_gradient,
            z_state,
            cell_output_fwd,
            state_gradient=state_gradient,
            cell_gradient=cell_gradient,
            input_weight=input_weight,
            bias=bias,
            init_state=init_state,
            init_cell=init_cell,
            mask=mask,
            peephole=peephole,
            sequence_lengths=sequence_lengths,
            descriptor=descriptor,
            device=device,
        ),
    )


def gru_gradients(
    source: ArrayLike,
    recurrent_weight: ArrayLike,
    source_gradient: ArrayLike,
    z_state: ArrayLike,
    output_fwd: ArrayLike,
    *,
    state_gradient: Optional[ArrayLike] = None,
    input_weight: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    init_state: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    secondary_bias: Optional[ArrayLike] = None,
    sequence_lengths: Optional[ArrayLike] = None,
    descriptor: GRUDescriptor,
    device: Optional[str] = None,
) -> GRUGradients:
    """Gradients of :func:`gru` by back-propagation through time.

    output_fwd is the forward state output. See :func:`single_gate_rnn_gradients` for the
    other arguments; secondary_bias gets zeros when ``reset_after`` is false.
    """
    return _result(
        GRUGradients,
        _core.gru_gradients(
            source,
            recurrent_weight,
            source_gradient,
            z_state,
            output_fwd,
            state_gradient=state_gradient,
            input_weight=input_weight,
            bias=bias,
            init_state=init_state,
            mask=mask,
            secondary_bias=secondary_bias,
            sequence_lengths=sequence_lengths,
            descriptor=descriptor,
            device=device,
        ),
    )

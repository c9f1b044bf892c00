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


def _call(name: str, result: type, args: dict):
    """Run ``_core.<name>`` with a wrapper's arguments (its ``locals()``, all by keyword)
    and wrap the tuple it returns in the named result type."""
    for arg, value in args.items():
        # A tensor in an autograd graph would leave it silently: rnncore.torch keeps it.
        if getattr(value, "requires_grad", False) is True:
            raise TypeError(
                f"[{name}] {arg} requires grad: rnncore.{name} is not part of torch's "
                "autograd; use the rnncore.torch modules, or pass tensor.detach()"
            )
    return result(*getattr(_core, name)(**args))


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
    return _call("single_gate_rnn", RNNResult, locals())


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
    return _call("lstm", LSTMResult, locals())


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
    return _call("gru", GRUResult, locals())


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
    return _call("single_gate_rnn_gradients", RNNGradients, locals())


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
    return _call("lstm_gradients", LSTMGradients, locals())


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
    return _call("gru_gradients", GRUGradients, locals())

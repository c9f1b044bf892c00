"""Forward ops against ONNX RNN / GRU / LSTM run by onnxruntime, through the contract's mappings.

onnxruntime's recurrent kernels compute in float32. rnncore float64 on the same (float32)
numbers is compared with FORWARD_TOL[float32]; rnncore float32 too (its own rounding and
onnxruntime's add up to a few 1e-7 relative on these sizes).
"""

import numpy as np
import pytest
from cases import forward_tol, make_descriptor, op, skip_unsupported
from util import assert_rel_close

import rnncore

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

T, N, I, H = 5, 3, 4, 6  # noqa: E741
OPSET = 14
DIRECTIONS = ("forward", "reverse", "bidirectional")

# ONNX activation names (with their alpha/beta when they take some) → rnncore.Activation.
ONNX_ACTIVATIONS = {
    "Sigmoid": "SIGMOID",
    "Tanh": "TANH",
    "Relu": "RELU",
    "HardSigmoid": "HARD_SIGMOID",  # ONNX defaults alpha 0.2, beta 0.5 = the contract's
    "Affine": "NONE",  # with alpha 1, beta 0
}
# ONNX LSTM gate blocks i, o, f, c → the contract's i, f, c, o.
LSTM_ORDER = (0, 2, 3, 1)


def run_onnx(op_type, inputs, *, direction, activations, linear_before_reset=None):
    """Build a one-node model with onnx.helper and run it on onnxruntime's CPU provider.

    `inputs` maps ONNX input names (X, W, R, B, initial_h, initial_c, P) to float32
    arrays; names not present become empty (absent optional) inputs.
    """
    D = 2 if direction == "bidirectional" else 1
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    if op_type != "LSTM":
        order = order[:6]
    node_inputs = [name if name in inputs else "" for name in order]
    while node_inputs[-1] == "":
        node_inputs.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if op_type == "LSTM" else [])
    attrs = dict(hidden_size=H, direction=direction, activations=list(activations) * D)
    if "Affine" in activations:
        # Only Affine takes alpha/beta among the activations used with it here.
        assert set(activations) <= {"Affine"}, activations
        attrs.update(activation_alpha=[1.0] * D, activation_beta=[0.0] * D)
    if linear_before_reset is not None:
        attrs["linear_before_reset"] = linear_before_reset
    node = helper.make_node(op_type, node_inputs, outputs, **attrs)
    graph = helper.make_graph(
        [node],
        f"{op_type.lower()}_test",
        [
            helper.make_tensor_value_info(
                k, TensorProto.INT32 if k == "sequence_lens" else TensorProto.FLOAT, list(v.shape)
            )
            for k, v in inputs.items()
        ],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        results = session.run(None, {k: np.ascontiguousarray(v) for k, v in inputs.items()})
    except Exception as e:  # noqa: BLE001 (onnxruntime raises its own exception types)
        msg = str(e)
        if "NOT_IMPLEMENTED" in msg or "not supported" in msg.lower():
            pytest.skip(f"onnxruntime does not support {op_type} {activations}: {msg[:200]}")
        raise
    return dict(zip(outputs, results))


def onnx_inputs(rng, op_type, direction, with_init, peephole=False):
    D = 2 if direction == "bidirectional" else 1
    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[op_type]

    def f32(shape, scale):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    inputs = {
        "X": f32((T, N, I), 1.0),
        "W": f32((D, G * H, I), 1.0 / np.sqrt(I)),
        "R": f32((D, G * H, H), 0.8 / np.sqrt(H)),
        "B": f32((D, 2 * G * H), 0.4),
    }
    if with_init:
        inputs["initial_h"] = f32((D, N, H), 0.7)
        if op_type == "LSTM":
            inputs["initial_c"] = f32((D, N, H), 1.0)
    if peephole:
        p = f32((D, 3 * H), 0.5)
        p[:, H : 2 * H] = 0.0  # ONNX's output-gate peephole reads c[t]; the contract's c[t-1]
        inputs["P"] = p
    return inputs


def to_init(h0):
    """ONNX's [D, N, H] initial state as the contract's [N, D·H]."""
    return np.ascontiguousarray(h0.transpose(1, 0, 2).reshape(h0.shape[1], -1))


def reorder_lstm(a, axis):
    """Reorder the 4 gate blocks along `axis` from ONNX i, o, f, c to i, f, c, o."""
    blocks = np.split(a, 4, axis=axis)
    return np.concatenate([blocks[k] for k in LSTM_ORDER], axis=axis)


def to_rnncore_args(op_type, inputs, direction, linear_before_reset=0):
    """rnncore arguments (dict) from the ONNX inputs, per the contract's ONNX mappings."""
    D = 2 if direction == "bidirectional" else 1
    W, R, B = inputs["W"], inputs["R"], inputs["B"]
    GH = W.shape[1]
    Wb, Rb = B[:, :GH], B[:, GH:]
    args = {"source": inputs["X"]}
    secondary = None
    if op_type == "LSTM":
        W, R = reorder_lstm(W, 1), reorder_lstm(R, 1)
        bias = reorder_lstm(Wb + Rb, 1)
    elif op_type == "GRU" and linear_before_reset:
        bias = np.concatenate([Wb[:, : 2 * H] + Rb[:, : 2 * H], Wb[:, 2 * H :]], axis=1)
        secondary = Rb[:, 2 * H :].reshape(D * H)
    else:
        bias = Wb + Rb
    args["recurrent_weight"] = R if D == 2 else R[0]
    args["input_weight"] = W.reshape(D * GH, I)
    args["bias"] = bias.reshape(D * GH)
    if secondary is not None:
        args["secondary_bias"] = secondary
    if "initial_h" in inputs:
        args["init_state"] = to_init(inputs["initial_h"])
    if "initial_c" in inputs:
        args["init_cell"] = to_init(inputs["initial_c"])
    if "P" in inputs:
        P = inputs["P"]  # i, o, f
        zero = np.zeros((D, H), np.float32)
        peep = np.concatenate([P[:, 0:H], P[:, 2 * H : 3 * H], zero, P[:, H : 2 * H]], axis=1)
        args["peephole"] = peep if D == 2 else peep[0]
    return args


def check_against_onnx(result, onnx_out, direction, tol, what):
    """rnncore's output against ONNX's Y [T, D, N, H] (time-aligned) and Y_h / Y_c."""
    Y = onnx_out["Y"]
    D = Y.shape[1]
    expected = Y.transpose(0, 2, 1, 3).reshape(T, N, D * H)
    state = result.state
    if direction == "reverse":
        state = state[::-1]  # rnncore's unidirectional reverse output is in processing order
    assert_rel_close(state, expected, tol, f"{what}: Y")
    # Final states: the last processed step of each direction.
    assert_rel_close(result.state[T - 1, :, 0:H], onnx_out["Y_h"][0], tol, f"{what}: Y_h[0]")
    if D == 2:
        assert_rel_close(result.state[0, :, H:], onnx_out["Y_h"][1], tol, f"{what}: Y_h[1]")
    if "Y_c" in onnx_out:
        assert result.cell is not None, f"{what}: cell missing"
        assert_rel_close(result.cell[T - 1, :, 0:H], onnx_out["Y_c"][0], tol, f"{what}: Y_c[0]")
        if D == 2:
            assert_rel_close(result.cell[0, :, H:], onnx_out["Y_c"][1], tol, f"{what}: Y_c[1]")


def run_rnncore(kind, args, desc, dtype, device, **kwargs):
    args = {k: np.asarray(v, dtype=dtype) for k, v in args.items()}
    source, rec = args.pop("source"), args.pop("recurrent_weight")
    return op(rnncore, kind)(source, rec, **args, descriptor=desc, device=device, **kwargs)


def compare_both_dtypes(kind, args, desc, onnx_out, direction, device, what):
    for dtype in (np.float64, np.float32):
        if np.dtype(dtype) == np.float64 and device != "cpu":
            continue
        result = run_rnncore(kind, args, desc, dtype, device)
        assert result.state.dtype == np.dtype(dtype)
        tol = forward_tol(np.float32)
        check_against_onnx(result, onnx_out, direction, tol, f"{what} {np.dtype(dtype).name}")


@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "init"])
@pytest.mark.parametrize("f", ["Tanh", "Relu", "HardSigmoid", "Sigmoid", "Affine"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_rnn_matches_onnx(rng, device, direction, f, with_init):
    skip_unsupported(device, np.float32)
    inputs = onnx_inputs(rng, "RNN", direction, with_init)
    out = run_onnx("RNN", inputs, direction=direction, activations=[f])
    desc = make_descriptor(
        "rnn",
        reverse=direction == "reverse",
        bidirectional=direction == "bidirectional",
        activation=ONNX_ACTIVATIONS[f],
    )
    args = to_rnncore_args("RNN", inputs, direction)
    compare_both_dtypes("rnn", args, desc, out, direction, device, f"RNN {direction} {f}")


@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "init"])
@pytest.mark.parametrize(
    ("f", "g"),
    [("Sigmoid", "Tanh"), ("HardSigmoid", "Relu"), ("HardSigmoid", "Tanh"), ("Sigmoid", "Relu")],
)
@pytest.mark.parametrize("linear_before_reset", [0, 1], ids=["lbr0", "lbr1"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gru_matches_onnx(rng, device, direction, linear_before_reset, f, g, with_init):
    skip_unsupported(device, np.float32)
    inputs = onnx_inputs(rng, "GRU", direction, with_init)
    out = run_onnx(
        "GRU",
        inputs,
        direction=direction,
        activations=[f, g],
        linear_before_reset=linear_before_reset,
    )
    # Gate order z, r, h is the default descriptor's (reset_gate_first = False).
    desc = make_descriptor(
        "gru",
        reverse=direction == "reverse",
        bidirectional=direction == "bidirectional",
        reset_after=bool(linear_before_reset),
        update_gate_activation=ONNX_ACTIVATIONS[f],
        reset_gate_activation=ONNX_ACTIVATIONS[f],
        output_gate_activation=ONNX_ACTIVATIONS[g],
    )
    args = to_rnncore_args("GRU", inputs, direction, linear_before_reset)
    what = f"GRU {direction} lbr={linear_before_reset} {f},{g}"
    compare_both_dtypes("gru", args, desc, out, direction, device, what)


@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "init"])
@pytest.mark.parametrize("peephole", [False, True], ids=["no-peephole", "peephole"])
@pytest.mark.parametrize(
    ("f", "g", "h"),
    [
        ("Sigmoid", "Tanh", "Tanh"),
        ("HardSigmoid", "Relu", "Tanh"),
        ("HardSigmoid", "Tanh", "Relu"),
        ("Sigmoid", "Relu", "Sigmoid"),
    ],
)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_matches_onnx(rng, device, direction, f, g, h, peephole, with_init):
    skip_unsupported(device, np.float32)
    inputs = onnx_inputs(rng, "LSTM", direction, with_init, peephole=peephole)
    out = run_onnx("LSTM", inputs, direction=direction, activations=[f, g, h])
    desc = make_descriptor(
        "lstm",
        reverse=direction == "reverse",
        bidirectional=direction == "bidirectional",
        produce_cell=True,
        input_gate_activation=ONNX_ACTIVATIONS[f],
        forget_gate_activation=ONNX_ACTIVATIONS[f],
        output_gate_activation=ONNX_ACTIVATIONS[f],
        cell_gate_activation=ONNX_ACTIVATIONS[g],
        activation=ONNX_ACTIVATIONS[h],
    )
    args = to_rnncore_args("LSTM", inputs, direction)
    what = f"LSTM {direction} {f},{g},{h} peephole={peephole}"
    compare_both_dtypes("lstm", args, desc, out, direction, device, what)


# ---- sequence_lens ---------------------------------------------------------------------------


@pytest.mark.parametrize("lengths", [[5, 2, 1], [1, 3, 5]], ids=["longest-first", "shortest-first"])
@pytest.mark.parametrize(
    ("op_type", "linear_before_reset"),
    [("RNN", None), ("GRU", 0), ("GRU", 1), ("LSTM", None)],
    ids=["rnn", "gru-lbr0", "gru-lbr1", "lstm"],
)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_sequence_lens_matches_onnx(rng, device, direction, op_type, linear_before_reset, lengths):
    """ONNX's sequence_lens is rnncore's sequence_lengths (the contract's ONNX mapping): Y is
    rnncore's state with the reverse direction flipped within each row's length, zero past
    it; Y_h / Y_c are each row's state at its last processed step."""
    skip_unsupported(device, np.float32)
    lengths = np.array(lengths, np.int32)
    inputs = onnx_inputs(rng, op_type, direction, True, peephole=op_type == "LSTM")
    inputs["sequence_lens"] = lengths
    activations = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
    out = run_onnx(
        op_type,
        inputs,
        direction=direction,
        activations=activations[op_type],
        linear_before_reset=linear_before_reset,
    )
    kind = op_type.lower()
    fields = {"reset_after": bool(linear_before_reset)} if kind == "gru" else {}
    if kind == "lstm":
        fields["produce_cell"] = True
    if kind == "rnn":
        fields["activation"] = "TANH"
    desc = make_descriptor(
        kind, reverse=direction == "reverse", bidirectional=direction == "bidirectional", **fields
    )
    args = to_rnncore_args(op_type, inputs, direction, linear_before_reset or 0)
    rows = np.arange(N)
    for dtype in (np.float64, np.float32):
        if np.dtype(dtype) == np.float64 and device != "cpu":
            continue
        r = run_rnncore(kind, args, desc, dtype, device, sequence_lengths=lengths)
        D = 2 if direction == "bidirectional" else 1
        Y = out["Y"].transpose(0, 2, 1, 3).reshape(T, N, D * H)
        state = np.array(r.state)
        if direction == "reverse":  # processing order -> input time, within each row
            for n, L in enumerate(lengths):  # noqa: E741
                state[:L, n] = state[:L, n][::-1]
        what = f"{op_type} {direction} lengths {lengths.tolist()} {np.dtype(dtype).name}"
        tol = forward_tol(np.float32)
        assert_rel_close(state, Y, tol, f"{what}: Y")
        last = r.state[lengths - 1, rows]  # each row's last processed step (forward half)
        assert_rel_close(last[:, :H], out["Y_h"][0], tol, f"{what}: Y_h[0]")
        if D == 2:
            assert_rel_close(r.state[0, :, H:], out["Y_h"][1], tol, f"{what}: Y_h[1]")
        if kind == "lstm":
            assert_rel_close(r.cell[lengths - 1, rows, :H], out["Y_c"][0], tol, f"{what}: Y_c[0]")
            if D == 2:
                assert_rel_close(r.cell[0, :, H:], out["Y_c"][1], tol, f"{what}: Y_c[1]")

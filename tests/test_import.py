"""rnncore.nn.from_torch / from_mlx / from_keras / from_onnx against the source framework's
own outputs (Keras on its torch backend, ONNX through ONNX Runtime), and the refusals."""

import os

import numpy as np
import pytest

import rnncore.nn as rn
from rnncore._ops import rel_err

os.environ.setdefault("KERAS_BACKEND", "torch")
# float64 sources: ~1e-15 measured; float32 ones: ~3e-7.
TOL64, TOL32 = 1e-12, 3e-6


def rng(seed=0):
    return np.random.default_rng(seed)


# ---- PyTorch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch(kind, bidirectional, batch_first, bias):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = getattr(torch.nn, kind)(
        4,
        5,
        2,
        bias=bias,
        batch_first=batch_first,
        bidirectional=bidirectional,
        dtype=torch.float64,
    )
    layer = rn.from_torch(module)
    assert layer.dtype == np.float64 and layer.batch_first == batch_first
    x = torch.randn((3, 6, 4) if batch_first else (6, 3, 4), dtype=torch.float64)
    want = module(x)[0].detach().numpy()
    got = layer(x.numpy())
    assert rel_err(got[0] if kind == "LSTM" else got, want) < TOL64


def test_from_torch_relu_and_refusal():
    torch = pytest.importorskip("torch")
    module = torch.nn.RNN(3, 4, nonlinearity="relu")
    layer = rn.from_torch(module)
    x = torch.randn(5, 2, 3)
    assert rel_err(layer(x.numpy()), module(x)[0].detach().numpy()) < TOL32
    with pytest.raises(ValueError, match=r"\[rnncore.nn.from_torch\] proj_size > 0"):
        rn.from_torch(torch.nn.LSTM(3, 4, proj_size=2))


# ---- MLX -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize("bias", [True, False])
def test_from_mlx(kind, bias):
    mx = pytest.importorskip("mlx.core")
    mnn = pytest.importorskip("mlx.nn")
    module = getattr(mnn, kind)(3, 5, bias=bias)
    layer = rn.from_mlx(module)
    x = rng().standard_normal((2, 6, 3)).astype(np.float32)
    want = module(mx.array(x))
    got = layer(x)
    if kind == "LSTM":
        got, want = got[0], want[0]
    assert rel_err(got, np.array(want)) < TOL32


def test_from_mlx_refuses_other_modules():
    mnn = pytest.importorskip("mlx.nn")
    with pytest.raises(TypeError, match=r"\[rnncore.nn.from_mlx\] module must be"):
        rn.from_mlx(mnn.Linear(2, 3))


# ---- Keras -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keras():
    pytest.importorskip("torch")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip("the Keras tests run on Keras' torch backend")
    return keras


KERAS_CASES = [
    ("GRU", {"reset_after": True}),
    ("GRU", {"reset_after": False}),
    ("GRU", {"go_backwards": True}),
    ("GRU", {"use_bias": False}),
    ("GRU", {"activation": "relu", "recurrent_activation": "sigmoid"}),
    ("LSTM", {}),
    ("LSTM", {"go_backwards": True, "activation": "relu"}),
    ("LSTM", {"use_bias": False}),
    ("SimpleRNN", {}),
    ("SimpleRNN", {"activation": "relu", "use_bias": False}),
]


@pytest.mark.parametrize("kind, config", KERAS_CASES)
def test_from_keras(keras, kind, config):
    layer = getattr(keras.layers, kind)(5, return_sequences=True, **config)
    x = rng(1).standard_normal((2, 6, 3)).astype(np.float32)
    want = np.asarray(layer(x).detach().cpu().numpy())
    ours = rn.from_keras(layer)
    got = ours(x)
    assert rel_err(got[0] if kind == "LSTM" else got, want) < TOL32


def test_from_keras_refuses(keras):
    layer = keras.layers.GRU(4, recurrent_activation="hard_sigmoid")
    layer(np.zeros((1, 2, 3), np.float32))
    with pytest.raises(ValueError, match=r"recurrent_activation='hard_sigmoid' has no counterpart"):
        rn.from_keras(layer)
    with pytest.raises(TypeError, match=r"must be a Keras GRU, LSTM or SimpleRNN"):
        rn.from_keras(keras.layers.Dense(3))


# ---- ONNX ------------------------------------------------------------------------------------


def onnx_model(
    op,
    *,
    direction="forward",
    layout=0,
    H=5,
    I=3,  # noqa: E741
    bias=True,
    P=None,
    lens=None,
    **attrs,
):
    """A one-node model; `lens` None (no sequence_lens), "input" (a graph input) or an array
    (a graph initializer)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    D = 2 if direction == "bidirectional" else 1
    r = rng(G * 10 + D)
    W = (r.standard_normal((D, G * H, I)) * 0.5).astype(np.float32)
    R = (r.standard_normal((D, G * H, H)) * 0.5).astype(np.float32)
    B = (r.standard_normal((D, 2 * G * H)) * 0.5).astype(np.float32)
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(R, "R")]
    inputs = ["X", "W", "R"]
    if bias:
        inits.append(numpy_helper.from_array(B, "B"))
        inputs.append("B")
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)]
    if lens is not None:
        inputs = inputs + [""] * (4 - len(inputs)) + ["sequence_lens"]
        if isinstance(lens, str):
            graph_inputs.append(
                helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, None)
            )
        else:
            inits.append(numpy_helper.from_array(np.asarray(lens, np.int32), "sequence_lens"))
    if P is not None:
        inits.append(numpy_helper.from_array(P.astype(np.float32), "P"))
        inputs = inputs + [""] * (7 - len(inputs)) + ["P"]
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(
        op,
        inputs,
        outputs,
        name="rnn0",
        hidden_size=H,
        direction=direction,
        layout=layout,
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "g",
        graph_inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return onnx, model


ONNX_CASES = [
    ("RNN", {}),
    ("RNN", {"activations": ["Relu"]}),
    ("GRU", {"linear_before_reset": 1}),
    ("GRU", {"linear_before_reset": 0}),
    ("GRU", {"activations": ["HardSigmoid", "Tanh"]}),
    ("LSTM", {}),
    ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}),
]


@pytest.mark.parametrize("op, attrs", ONNX_CASES)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_from_onnx(op, attrs, direction, layout):
    ort = pytest.importorskip("onnxruntime")
    D = 2 if direction == "bidirectional" else 1
    if "activations" in attrs:
        attrs = dict(attrs, activations=attrs["activations"] * D)
    # ONNX Runtime runs layout 0 only: the layout-1 model, with the same weights, is imported
    # and given the batch-first input.
    _, model = onnx_model(op, direction=direction, **attrs)
    _, imported = onnx_model(op, direction=direction, layout=layout, **attrs)
    T, N = 6, 2
    x = rng(5).standard_normal((T, N, 3)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    Y = session.run(None, {"X": x})[0]  # [T, D, N, H], every direction time-aligned
    layer = rn.from_onnx(imported)
    assert layer.batch_first == bool(layout)
    got = layer(x.transpose(1, 0, 2) if layout else x)
    got = got[0] if op == "LSTM" else got
    if layout:
        got = got.transpose(1, 0, 2)
    want = Y.transpose(0, 2, 1, 3).reshape(T, N, -1)
    # A reverse layer returns processing order (docs/semantics.md, "ONNX layouts").
    if direction == "reverse":
        got = got[::-1]
    assert rel_err(got, want) < TOL32


@pytest.mark.parametrize("op, attrs", ONNX_CASES[::2] + ONNX_CASES[5:6])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", ["input", "constant"])
def test_from_onnx_sequence_lens(op, attrs, direction, lens):
    """A node's sequence_lens: at run time the layer's lengths=, a constant its .lengths."""
    ort = pytest.importorskip("onnxruntime")
    D = 2 if direction == "bidirectional" else 1
    if "activations" in attrs:
        attrs = dict(attrs, activations=attrs["activations"] * D)
    T, N = 6, 3
    lengths = np.array([4, 6, 1], np.int32)
    _, model = onnx_model(
        op, direction=direction, lens="input" if lens == "input" else lengths, **attrs
    )
    x = rng(5).standard_normal((T, N, 3)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"X": x, "sequence_lens": lengths} if lens == "input" else {"X": x}
    Y, Y_h = session.run(None, feed)[:2]
    layer = rn.from_onnx(model)
    got = layer(x, lengths=lengths) if lens == "input" else layer(x)
    got = got[0] if op == "LSTM" else got
    want = Y.transpose(0, 2, 1, 3).reshape(T, N, -1)
    if direction == "reverse":  # processing order -> input time, within each row
        got = got.copy()
        for n, L in enumerate(lengths):  # noqa: E741
            got[:L, n] = got[:L, n][::-1]
    assert rel_err(got, want) < TOL32
    finals = got[lengths - 1, np.arange(N)] if direction != "reverse" else got[0]
    assert rel_err(finals[:, :5], Y_h[0]) < TOL32


@pytest.mark.parametrize(
    "op, attrs, message",
    [
        ("GRU", {"clip": 3.0}, r"clip=3.0 has no counterpart"),
        ("LSTM", {"input_forget": 1}, r"input_forget=1 has no counterpart"),
        ("RNN", {"activations": ["Softsign"]}, r"activation 'Softsign' has no counterpart"),
        (
            "GRU",
            {"activations": ["HardSigmoid", "Tanh"], "activation_alpha": [0.3]},
            r"HardSigmoid with alpha, beta = \(0.3, 0.5\) differs",
        ),
    ],
)
def test_from_onnx_refuses(op, attrs, message):
    _, model = onnx_model(op, **attrs)
    with pytest.raises(ValueError, match=message):
        rn.from_onnx(model)


def test_from_onnx_peephole_and_node_choice(tmp_path):
    onnx, model = onnx_model("LSTM", P=np.ones((1, 15)))
    with pytest.raises(ValueError, match=r"peepholes P \(non-zero\)"):
        rn.from_onnx(model)
    onnx, model = onnx_model("LSTM", P=np.zeros((1, 15)))
    path = tmp_path / "lstm.onnx"
    onnx.save(model, str(path))
    assert isinstance(rn.from_onnx(str(path)), rn.LSTM)
    with pytest.raises(ValueError, match=r"node='other' must name one RNN, GRU or LSTM node"):
        rn.from_onnx(model, node="other")


@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
def test_from_torch_state_dict(kind):
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    module = getattr(torch.nn, kind)(4, 5, 2, bidirectional=True, dtype=torch.float64)
    layer = rn.from_torch(module.state_dict(), kind.lower())
    assert (layer.num_layers, layer.bidirectional, layer.batch_first) == (2, True, False)
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    got = layer(x.numpy())
    assert rel_err(got[0] if kind == "LSTM" else got, module(x)[0].detach().numpy()) < TOL64
    with pytest.raises(ValueError, match=r"a state_dict needs kind='gru', 'lstm' or 'rnn'"):
        rn.from_torch(module.state_dict())

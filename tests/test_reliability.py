"""The reproducers of the reliability review (issue 10): arrays without storage, presence
never inferred from a data pointer, sizes that overflow, misaligned arrays, gradient ops
without their descriptor, common mistakes with clear messages, a reference leak in the
descriptor fields, and allocation failures named. Each failed (crash, wrong answer or
unclear error) before its fix."""

import re
import sys

import numpy as np
import pytest
from cases import GATES, op
from cases import make_descriptor as descriptor

import rnncore
from rnncore import _ops, reference

torch = pytest.importorskip("torch")

FORWARD = {k: kind.forward for k, kind in _ops.KINDS.items()}
GRADIENTS = {k: kind.gradients for k, kind in _ops.KINDS.items()}


def forward(kind, *args, **kw):
    return op(rnncore, kind)(*args, **kw)


def extras(kind, fwd):
    """The forward outputs a gradient op takes after z_state (LSTM: cell; GRU: state)."""
    return {"rnn": (), "lstm": (getattr(fwd, "cell", None),), "gru": (fwd.state,)}[kind]


def compare(actual, expected, dtype):
    """Outputs against the float64 reference: float32 to a few ulp of the values' scale."""
    tol = 4e-7 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


# ---- 1, 2: zero-size arrays without storage --------------------------------------------


def test_zero_size_torch_tensors_as_source_and_input_weight(device):
    # Both have NULL data pointers; this crashed with SIGSEGV on the CPU.
    R = np.random.default_rng(0).standard_normal((27, 9)).astype(np.float32)
    h0 = np.random.default_rng(1).standard_normal((3, 9)).astype(np.float32)
    x, W = torch.zeros(2, 3, 0), torch.zeros(27, 0)
    assert x.data_ptr() == 0 and W.data_ptr() == 0
    y, _ = rnncore.gru(x, R, W, None, h0, device=device)
    ref = reference.gru(np.zeros((2, 3, 0)), R, np.zeros((27, 0)), None, h0)
    compare(y, ref.state, np.float32)


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_empty_input_weight_without_storage_means_zero_projection(device, kind):
    # The input weight is present but empty (I = 0): x' = bias, never a copy of the source.
    rng = np.random.default_rng(2)
    G, H, N, T = GATES[kind], 5, 7, 3
    R = (0.5 * rng.standard_normal((G * H, H))).astype(np.float32)
    b = rng.standard_normal(G * H).astype(np.float32)
    h0 = rng.standard_normal((N, H)).astype(np.float32)
    x = np.zeros((T, N, 0), np.float32)
    W = torch.zeros(G * H, 0)
    assert W.data_ptr() == 0
    got = forward(kind, x, R, W, b, h0, device=device)
    ref = getattr(reference, FORWARD[kind])(x, R, np.zeros((G * H, 0)), b, h0)
    compare(got.state, ref.state, np.float32)
    # Without a bias x' = 0: the single-gate RNN is relu(h0 R^T) at the first step.
    got = rnncore.single_gate_rnn(np.zeros((1, 7, 0), np.float32), R[:H], torch.zeros(H, 0))
    np.testing.assert_array_equal(got.state, 0.0)
    got = rnncore.single_gate_rnn(x[:1], R[:H], torch.zeros(H, 0), None, h0, device=device)
    first = np.maximum(h0.astype(np.float64) @ R[:H].T.astype(np.float64), 0)
    compare(got.state[0], first, np.float32)


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_zero_size_storage_free_gradient_inputs(device, kind):
    rng = np.random.default_rng(3)
    G, H, N, T = GATES[kind], 4, 2, 3
    R = (0.5 * rng.standard_normal((G * H, H))).astype(np.float32)
    x = torch.zeros(T, N, 0)
    W = torch.zeros(G * H, 0)
    desc = descriptor(kind, training=True)
    fwd = forward(kind, x, R, W, descriptor=desc, device=device)
    dy = rng.standard_normal(fwd.state.shape).astype(np.float32)
    extra = extras(kind, fwd)
    g = getattr(rnncore, GRADIENTS[kind])(
        x, R, dy, fwd.z_state, *extra, input_weight=W, descriptor=desc, device=device
    )
    assert g.source.shape == (T, N, 0) and g.input_weight.shape == (G * H, 0)
    xr = np.zeros((T, N, 0))
    ref_fwd = getattr(reference, FORWARD[kind])(xr, R, np.zeros((G * H, 0)), descriptor=desc)
    ref_extra = extras(kind, ref_fwd)
    ref = getattr(reference, GRADIENTS[kind])(
        xr,
        R,
        dy,
        ref_fwd.z_state,
        *ref_extra,
        input_weight=np.zeros((G * H, 0)),
        descriptor=desc,
    )
    np.testing.assert_allclose(g.recurrent_weight, ref.recurrent_weight, rtol=1e-5, atol=1e-6)


# ---- 3: sizes that overflow --------------------------------------------------------------


def test_overflowing_element_counts_are_refused(device):
    x = np.empty((2**30, 2**30, 0), np.float32)
    msg = re.escape("[gru] the state output would have T*N*D*H = 1073741824*1073741824*1*16")
    with pytest.raises(ValueError, match=msg):
        rnncore.gru(x, np.zeros((48, 16), np.float32), np.zeros((48, 0), np.float32), device=device)
    # A reset-after GRU's training state (4H a direction) is its largest array.
    x = np.empty((2**27, 2**27, 0), np.float32)
    with pytest.raises(ValueError, match=r"^\[gru\] z_state would have T\*N\*D\*ZG\*H = "):
        rnncore.gru(
            x,
            np.zeros((3 * 10, 10), np.float32),
            np.zeros((3 * 10, 0), np.float32),
            descriptor=rnncore.GRUDescriptor(training=True, reset_after=True),
            device=device,
        )
    # A recurrent weight whose square overflows.
    with pytest.raises(ValueError, match=r"^\[single_gate_rnn\] "):
        rnncore.single_gate_rnn(
            np.empty((0, 1, 2**31), np.float32),
            np.empty((2**31, 0), np.float32),
            device=device,
        )


def test_sizes_too_large_to_allocate_raise_memory_error_naming_the_op(device):
    # 2^48 state elements (2^50 bytes): past any address space, below the 2^59 bound.
    x = np.empty((2**22, 2**22, 0), np.float32)
    with pytest.raises((MemoryError, ValueError), match=r"^\[gru\] "):
        rnncore.gru(x, np.zeros((48, 16), np.float32), np.zeros((48, 0), np.float32), device=device)


def test_metal_refuses_past_its_32_bit_indices_before_allocating():
    if "metal-emulated" not in rnncore.devices():
        pytest.skip("no metal-emulated device in this build")
    x = np.empty((2**17, 2**15, 0), np.float32)  # state: 2^32 elements, 16 GiB
    with pytest.raises(ValueError, match=r"^\[gru\] device 'metal'.*at most 2147483647"):
        rnncore.gru(
            x, np.zeros((3, 1), np.float32), np.zeros((3, 0), np.float32), device="metal-emulated"
        )


def test_strided_copy_that_cannot_be_allocated_is_a_memory_error():
    R = np.lib.stride_tricks.as_strided(
        np.zeros(1, np.float32), shape=(3 * 2**22, 2**22), strides=(0, 0)
    )
    with pytest.raises(MemoryError, match=r"^\[gru\] recurrent_weight is a strided ndarray"):
        rnncore.gru(np.zeros((1, 1, 2**22), np.float32), R, device="cpu")


def test_cpu_indexes_past_2_to_the_31_elements():
    """An input with more than 2^31 elements (the projection's K = I = 2^31 + 64) is read
    whole on the CPU: 64-bit offsets, and BLAS calls split below its 32-bit dimensions.
    The arrays are calloc'd zeros, so untouched pages cost no memory."""
    big = 2**31 + 64
    x = np.zeros((1, 1, big), np.float32)
    W = np.zeros((1, big), np.float32)
    x[0, 0, 5], W[0, 5] = 1.0, 0.25  # before 2^31
    x[0, 0, big - 3], W[0, big - 3] = 2.0, 0.5  # past 2^31: a 32-bit index would miss it
    y, _ = rnncore.single_gate_rnn(x, np.zeros((1, 1), np.float32), W, device="cpu")
    assert y[0, 0, 0] == np.float32(1.25)


# ---- 4: misaligned arrays ---------------------------------------------------------------


def misaligned(a):
    buf = bytearray(a.nbytes + 1)
    m = np.frombuffer(buf, a.dtype, offset=1, count=a.size).reshape(a.shape)
    m[...] = a
    assert not m.flags.aligned
    return m


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_misaligned_arrays_are_copied_and_give_the_same_results(device, kind):
    rng = np.random.default_rng(4)
    T, N, I, H, G = 4, 3, 5, 6, GATES[kind]  # noqa: E741 (the contract's names)
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    R = (0.3 * rng.standard_normal((G * H, H))).astype(np.float32)
    W = (0.3 * rng.standard_normal((G * H, I))).astype(np.float32)
    b = rng.standard_normal(G * H).astype(np.float32)
    desc = descriptor(kind, training=True)
    want = forward(kind, x, R, W, b, descriptor=desc, device=device)
    got = forward(
        kind,
        misaligned(x),
        misaligned(R),
        misaligned(W),
        misaligned(b),
        descriptor=desc,
        device=device,
    )
    for a, e in zip(got, want):
        np.testing.assert_array_equal(a, e)
    dy = rng.standard_normal(want.state.shape).astype(np.float32)
    extra = extras(kind, want)
    grad = getattr(rnncore, GRADIENTS[kind])
    g0 = grad(
        x, R, dy, want.z_state, *extra, input_weight=W, bias=b, descriptor=desc, device=device
    )
    g1 = grad(
        misaligned(x),
        R,
        misaligned(dy),
        misaligned(want.z_state),
        *[misaligned(e) for e in extra],
        input_weight=misaligned(W),
        bias=b,
        descriptor=desc,
        device=device,
    )
    for a, e in zip(g1, g0):
        if e is not None:
            np.testing.assert_array_equal(a, e)


def test_large_outputs_of_successive_calls_are_separate_arrays():
    # Outputs of 1 MiB or more come from the CPU's block cache: a block is reused only once
    # every array on it is gone, so results held across calls stay intact and distinct.
    rng = np.random.default_rng(5)
    T, N, H = 40, 32, 256  # state 1.25 MiB, z_state 5 MiB (float32)
    x = rng.standard_normal((T, N, 4 * H)).astype(np.float32)  # x' itself: no input weight
    R = (0.05 * rng.standard_normal((4 * H, H))).astype(np.float32)
    desc = descriptor("lstm", training=True)
    first = rnncore.lstm(x, R, descriptor=desc, device="cpu")
    kept = [first.state.copy(), first.z_state.copy()]
    view = first.state[3:5]  # a view alone keeps its block
    del first
    second = rnncore.lstm(2 * x, R, descriptor=desc, device="cpu")
    third = rnncore.lstm(x, R, descriptor=desc, device="cpu")
    assert not np.shares_memory(view, second.state)
    assert not np.shares_memory(view, third.state)
    assert not np.shares_memory(second.z_state, third.z_state)
    np.testing.assert_array_equal(view, kept[0][3:5])
    np.testing.assert_array_equal(third.state, kept[0])
    np.testing.assert_array_equal(third.z_state, kept[1])
    assert not np.array_equal(second.state, third.state)


# ---- 7: gradient ops require their descriptor --------------------------------------------


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_gradient_ops_require_the_descriptor(kind):
    rng = np.random.default_rng(5)
    T, N, H, G = 3, 2, 4, GATES[kind]
    x = rng.standard_normal((T, N, G * H)).astype(np.float32)
    R = (0.3 * rng.standard_normal((G * H, H))).astype(np.float32)
    flags = {
        "rnn": {"reverse": True},
        "lstm": {"reverse": True, "forget_gate_last": True},
        "gru": {"reverse": True, "flip_z": True, "reset_gate_first": True},
    }[kind]
    desc = descriptor(kind, training=True, **flags)
    fwd = forward(kind, x, R, descriptor=desc)
    extra = extras(kind, fwd)
    grad = getattr(rnncore, GRADIENTS[kind])
    with pytest.raises(TypeError, match=f"{GRADIENTS[kind]}.*descriptor"):
        grad(x, R, np.ones_like(fwd.state), fwd.z_state, *extra)
    with pytest.raises(TypeError, match=re.escape(f"[{GRADIENTS[kind]}] descriptor is required")):
        grad(x, R, np.ones_like(fwd.state), fwd.z_state, *extra, descriptor=None)
    with pytest.raises(TypeError, match=re.escape(f"[{GRADIENTS[kind]}] descriptor is required")):
        getattr(rnncore._core, GRADIENTS[kind])(x, R, np.ones_like(fwd.state), fwd.z_state, *extra)


# ---- 8: clear messages for common mistakes ----------------------------------------------


def test_missing_z_state_names_the_fix():
    x = np.zeros((2, 1, 6), np.float32)
    R = np.zeros((6, 2), np.float32)
    d = rnncore.GRUDescriptor()
    y, z = rnncore.gru(x, R, descriptor=d)  # not training: z is None
    assert z is None
    msg = "[gru_gradients] z_state is required: run the forward with descriptor.training=True"
    with pytest.raises(TypeError, match=re.escape(msg)):
        rnncore.gru_gradients(x, R, y, z, y, descriptor=d)
    msg = "[lstm_gradients] cell_output_fwd is required"
    with pytest.raises(TypeError, match=re.escape(msg)):
        rnncore.lstm_gradients(
            np.zeros((2, 1, 8), np.float32),
            np.zeros((8, 2), np.float32),
            np.zeros((2, 1, 2), np.float32),
            np.zeros((2, 1, 8), np.float32),
            None,
            descriptor=rnncore.LSTMDescriptor(),
        )


MISTAKES = [
    # (call, exception, message pattern)
    (
        lambda x, R: rnncore.gru(x.tolist(), R),
        TypeError,
        r"^\[gru\] source must be an array \(numpy, buffer protocol or DLPack\) but got list$",
    ),
    (
        lambda x, R: rnncore.gru(x, R, rnncore.GRUDescriptor()),
        TypeError,
        r"^\[gru\] input_weight must be an array but got GRUDescriptor; the descriptor is "
        r"keyword-only",
    ),
    (lambda x, R: rnncore.gru(x, None), TypeError, r"^\[gru\] recurrent_weight is required$"),
    (lambda x, R: rnncore.gru(None, R), TypeError, r"^\[gru\] source is required$"),
    (
        lambda x, R: rnncore.gru(x, R, descriptor=rnncore.LSTMDescriptor()),
        TypeError,
        r"^\[gru\] descriptor must be an rnncore.GRUDescriptor but got LSTMDescriptor$",
    ),
    (
        lambda x, R: rnncore.gru(x, R, descriptor={"reverse": True}),
        TypeError,
        r"^\[gru\] descriptor must be an rnncore.GRUDescriptor but got dict$",
    ),
    (
        lambda x, R: rnncore.gru(x, R, device=0),
        TypeError,
        r"^\[gru\] device must be a str or None but got int$",
    ),
    (lambda x, R: rnncore.gru(x, R, device="gpu"), ValueError, r"^\[gru\] unknown device 'gpu'"),
    (
        lambda x, R: rnncore.gru(x, 3.0),
        TypeError,
        r"^\[gru\] recurrent_weight must be an array .* but got float$",
    ),
    (
        lambda x, R: rnncore.gru(x, R.astype(np.int32)),
        TypeError,
        r"^\[gru\] recurrent_weight must be a float32, float64, float16 or bfloat16 array but "
        r"has dtype "
        r"int32",
    ),
    (
        lambda x, R: rnncore.gru(x, np.array([[object()]])),
        TypeError,
        r"^\[gru\] recurrent_weight is a ndarray of shape \(1, 1\) and dtype object",
    ),
    (
        lambda x, R: rnncore.gru_gradients(x, R, x, [0.0], x, descriptor=rnncore.GRUDescriptor()),
        TypeError,
        r"^\[gru_gradients\] z_state must be an array",
    ),
    (
        lambda x, R: rnncore.lstm(x, R, rnncore.LSTMDescriptor()),
        TypeError,
        r"^\[lstm\] input_weight must be an array but got LSTMDescriptor",
    ),
    (
        lambda x, R: rnncore.single_gate_rnn(x, R, mask="ones"),
        TypeError,
        r"^\[single_gate_rnn\] mask must be an array",
    ),
]


@pytest.mark.parametrize("i", range(len(MISTAKES)))
def test_common_mistakes_get_messages_naming_op_and_argument(i):
    call, exc, pattern = MISTAKES[i]
    x = np.zeros((2, 1, 6), np.float32)
    R = np.zeros((6, 2), np.float32)
    with pytest.raises(exc, match=pattern) as info:
        call(x, R)
    assert "incompatible function arguments" not in str(info.value)


# ---- 9: no reference leak in the descriptor fields --------------------------------------


def test_setting_activation_fields_from_ints_leaks_no_reference():
    big = 10**30  # out of range: refused after the int is read, the path that leaked
    before = sys.getrefcount(big)
    d = rnncore.GRUDescriptor()
    for _ in range(1000):
        with pytest.raises(ValueError):
            d.update_gate_activation = big
        with pytest.raises(ValueError):
            rnncore.LSTMDescriptor(activation=big)
        with pytest.raises(ValueError):
            rnncore.GRUDescriptor.__new__(rnncore.GRUDescriptor).__setstate__(
                (False,) * 6 + (big, 3, 2)
            )
    assert sys.getrefcount(big) == before
    # In range, from numpy integers, still set the field.
    d.update_gate_activation = np.int64(4)
    assert d.update_gate_activation == rnncore.Activation.HARD_SIGMOID


def test_descriptor_and_thread_settings_refuse_bad_values_by_name():
    with pytest.raises(TypeError, match=r"^GRUDescriptor\(\) takes keyword arguments only"):
        rnncore.GRUDescriptor(True)
    with pytest.raises(TypeError, match=r"^LSTMDescriptor.__setstate__ takes a tuple of 10"):
        rnncore.LSTMDescriptor.__new__(rnncore.LSTMDescriptor).__setstate__(3)
    with pytest.raises(TypeError, match=r"^\[set_num_threads\] n must be an int but got str"):
        rnncore.set_num_threads("2")
    for bad in (-1, 2**40):
        with pytest.raises(ValueError, match=r"^\[set_num_threads\] n must be in 0\.\.4096"):
            rnncore.set_num_threads(bad)
    before = rnncore.num_threads()
    rnncore.set_num_threads(np.int64(1))
    assert rnncore.num_threads() == 1
    rnncore.set_num_threads(0)
    assert rnncore.num_threads() == before


def test_device_errors_name_the_operation():
    x, R = np.zeros((1, 1, 3), np.float32), np.zeros((3, 1), np.float32)
    with pytest.raises(ValueError, match=r"^\[gru\] unknown device ''"):
        rnncore.gru(x, R, device="")
    if "metal" not in rnncore.devices():
        with pytest.raises(RuntimeError, match=r"^\[gru\] 'metal' is not available"):
            rnncore.gru(x, R, device="metal")


def test_out_of_range_activation_message_shows_the_value():
    with pytest.raises(
        ValueError, match=r"must be an Activation \(0\.\.4\) but got 18446744073709551616$"
    ):
        rnncore.GRUDescriptor(update_gate_activation=2**64)


@pytest.mark.parametrize("activation", list(rnncore.Activation.__members__.values()))
def test_nan_in_gives_nan_out_for_every_activation(device, activation):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    x[1, 0, 2] = np.nan
    R = (0.3 * rng.standard_normal((4, 4))).astype(np.float32)
    h0 = rng.standard_normal((2, 4)).astype(np.float32)
    desc = rnncore.RNNDescriptor(activation=activation, training=True)
    y, z = rnncore.single_gate_rnn(x, R, None, None, h0, descriptor=desc, device=device)
    ref = reference.single_gate_rnn(x, R, None, None, h0, descriptor=desc)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref.state))
    assert np.isnan(y[1, 0, 2]) and np.isnan(y[2, 0]).all()  # then through R to every unit
    compare(np.nan_to_num(y, nan=7.0), np.nan_to_num(ref.state, nan=7.0), np.float32)
    g = rnncore.single_gate_rnn_gradients(
        x, R, np.ones_like(y), z, init_state=h0, descriptor=desc, device=device
    )
    ref_g = reference.single_gate_rnn_gradients(
        x, R, np.ones_like(y), ref.z_state, init_state=h0, descriptor=desc
    )
    for name in ("source", "recurrent_weight", "init_state"):
        got, want = getattr(g, name), getattr(ref_g, name)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
    for kind in ("lstm", "gru"):
        G = GATES[kind]
        fields = {"lstm": "cell_gate_activation", "gru": "output_gate_activation"}[kind]
        d = descriptor(kind, **{fields: activation})
        xs = np.zeros((2, 1, G * 2), np.float32)
        xs[0, 0, :] = np.nan
        out = forward(kind, xs, np.zeros((G * 2, 2), np.float32), descriptor=d, device=device)
        assert np.isnan(out.state).all(), (kind, activation)

"""Calls from several Python threads at once (the GIL is released while rnncore computes)
give the same results as one at a time: the thread pool is shared, and a call that finds
it busy runs on its own thread."""

import concurrent.futures

import numpy as np

import rnncore


def _case(seed, dtype):
    rng = np.random.default_rng(seed)
    T, N, I, H = 30, 24, 40, 48  # noqa: E741 (the contract's names)
    x = rng.standard_normal((T, N, I)).astype(dtype)
    W = (0.2 * rng.standard_normal((2 * 4 * H, I))).astype(dtype)
    R = (0.2 * rng.standard_normal((2, 4 * H, H))).astype(dtype)
    return x, R, W


def _run(args):
    x, R, W = args
    d = rnncore.LSTMDescriptor(bidirectional=True, training=True)
    y, c, z = rnncore.lstm(x, R, W, descriptor=d, device="cpu")
    g = rnncore.lstm_gradients(x, R, y, z, c, input_weight=W, descriptor=d, device="cpu")
    return y, g.recurrent_weight


def test_concurrent_calls_match_serial_calls():
    cases = [_case(seed, dtype) for seed in range(8) for dtype in (np.float32, np.float64)]
    serial = [_run(c) for c in cases]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(3):
            concurrent_results = list(pool.map(_run, cases))
            for (y0, g0), (y1, g1) in zip(serial, concurrent_results):
                np.testing.assert_array_equal(y0, y1)
                tol = 1e-5 if y0.dtype == np.float32 else 1e-12
                np.testing.assert_allclose(g1, g0, rtol=tol, atol=tol * np.abs(g0).max())

"""The Metal cost model (rnncore.bench.cost): the emulator's counts of what each dispatch reads,
writes and computes, checked where they can be derived from the shapes, and the model's
arithmetic on known records."""

import math
import subprocess
import sys

import numpy as np
import pytest

import rnncore
from rnncore import _core
from rnncore.bench import cost

pytestmark = pytest.mark.skipif(
    "metal-emulated" not in rnncore.devices(), reason="no metal-emulated device in this build"
)


def gru_forward(T, N, I, H, bias=False):  # noqa: N803, E741
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    W = rng.standard_normal((3 * H, I)).astype(np.float32)  # noqa: N806
    R = (rng.standard_normal((3 * H, H)) * 0.3).astype(np.float32)  # noqa: N806
    b = np.ones(3 * H, np.float32) if bias else None
    d = rnncore.GRUDescriptor(reset_after=True)
    return lambda: rnncore.gru(x, R, W, b, descriptor=d, device="metal-emulated").state


def counted(fn):
    _core.set_metal_counting(True)
    try:
        fn()
        return _core.take_metal_counts()
    finally:
        _core.set_metal_counting(False)


def test_projection_counts_follow_from_the_shapes():
    """One 64 x 64 tile: the GEMM reads x, W and the bias once, writes x' once, and does the
    tile's multiply-adds (K padded to the 16-wide slices)."""
    T, N, I, H = 2, 4, 24, 16  # noqa: N806, E741
    recs = counted(gru_forward(T, N, I, H, bias=True))
    gemm = recs[0]
    assert gemm["kernel"] == "gemm_fff" and gemm["plan"] == 0
    assert gemm["bytes_read"] == 4 * (T * N * I + 3 * H * I + 3 * H * T * N)  # bias per output
    assert gemm["bytes_written"] == 4 * T * N * 3 * H
    assert gemm["flops"] == 2 * 64 * 64 * 32


def test_step_flops_are_the_recurrent_products(monkeypatch):
    """A reset-after GRU step after the first: the three products R h, 2 G H H N FLOPs; the
    first has no initial state and no product; steps after two measured ones are repeats."""
    monkeypatch.setenv("RNNCORE_METAL_PERSISTENT", "never")
    T, N, H = 5, 8, 16  # noqa: N806
    recs = counted(gru_forward(T, N, 16, H))
    steps = [r for r in recs if r["kernel"].startswith("gru_step")]
    assert len(steps) == T
    assert steps[0]["flops"] == 0
    assert all(s["flops"] == 2 * 3 * H * H * N for s in steps[1:])
    assert [s["repeated"] for s in steps] == [False, False, True, True, True]
    assert all(s["bytes_written"] >= 4 * N * H for s in steps)  # at least the new state


def test_persistent_kernel_counts_every_step_and_barrier(monkeypatch):
    """The persistent kernel (one threadgroup, all steps): the products of every step after
    the first, and the barriers of its chain: two around the staged state of each step but
    the first (no initial state), and one after each step."""
    monkeypatch.setenv("RNNCORE_METAL_PERSISTENT", "auto")
    T, N, H = 5, 8, 16  # noqa: N806
    recs = counted(gru_forward(T, N, 16, H))
    assert [r["kernel"] for r in recs] == ["gemm_fff", "gru_persistent_b8_f32"]
    p = recs[1]
    assert p["threadgroups"] == 1 and p["threads_per_threadgroup"] == 32 * H
    assert p["flops"] == 2 * 3 * H * H * N * (T - 1)
    assert p["barriers"] == 1 + 3 * (T - 1)
    # The R rows of each step, and at least the new state of each step, move.
    assert p["bytes_read"] >= 4 * 3 * H * H * (T - 1)
    assert p["bytes_written"] >= 4 * N * H * T


def test_counting_leaves_other_calls_alone():
    run = gru_forward(6, 3, 5, 7)
    before = run()
    counted(run)
    assert np.array_equal(run(), before)
    assert _core.take_metal_counts() == []


def test_model_arithmetic():
    gpu = cost.Gpu("test", bandwidth=1e9, flops=1e12, dispatch_s=1e-6, command_buffer_s=1e-5)
    memory_bound = {"plan": 0, "bytes_read": 600, "bytes_written": 400, "flops": 10}
    compute_bound = {"plan": 0, "bytes_read": 0, "bytes_written": 0, "flops": 2e6}
    t, bounds = cost.expected([memory_bound] * 70 + [compute_bound], gpu)
    # 70 x 1 us of memory + 2 us of compute + 71 dispatches + 2 command buffers (64 each).
    assert bounds == ["memory"] * 70 + ["compute"]
    assert math.isclose(t, 70e-6 + 2e-6 + 71e-6 + 2e-5)
    # One threadgroup: one core's bandwidth (32 B a clock) and a chain of barriers.
    one = cost.Gpu("one", bandwidth=1e12, flops=1e15, cores=8, clock=1e9, dispatch_s=0,
                   command_buffer_s=0, phase_s=1e-6)  # fmt: skip
    narrow = {"plan": 0, "threadgroups": 1, "bytes_read": 32e3, "bytes_written": 0, "flops": 0}
    t, bounds = cost.expected([narrow], one)
    assert bounds == ["memory"] and math.isclose(t, 32e3 / 32e9)
    chained = dict(narrow, barriers=2000)
    t, bounds = cost.expected([chained], one)
    assert bounds == ["latency"] and math.isclose(t, 2e-3)


def test_cost_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "rnncore", "cost", "--kind", "lstm", "--T", "3", "--N", "2",
         "--H", "8", "--training"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "lstm_persistent_b2_f32" in out.stdout
    assert "lstm_backward_persistent_b2_f32" in out.stdout
    for gpu in cost.GPUS:
        assert f"expected on {gpu}" in out.stdout


def test_sampled_threadgroups_count_as_the_whole_grid():
    """Counting runs one threadgroup per class (first, interior, last along each axis) and
    weights it: a 4 x 3 grid of tiles with partial last tiles still gives the exact traffic
    of the staged GEMM (A read once per column tile, B once per row tile)."""
    T, N, I, H = 25, 8, 20, 48  # noqa: N806, E741
    M, Ncols = T * N, 3 * H  # noqa: N806
    recs = counted(gru_forward(T, N, I, H, bias=True))
    gemm = recs[0]
    row_tiles, col_tiles = math.ceil(M / 64), math.ceil(Ncols / 64)
    assert (row_tiles, col_tiles) == (4, 3)
    assert gemm["threadgroups"] == row_tiles * col_tiles
    assert gemm["bytes_read"] == 4 * (col_tiles * M * I + row_tiles * Ncols * I + M * Ncols)
    assert gemm["bytes_written"] == 4 * M * Ncols
    assert gemm["flops"] == row_tiles * col_tiles * 2 * 64 * 64 * 32


def test_shader_readme_table_is_the_models():
    """cpp/shaders/README.md's cost table is what `python -m rnncore cost` prints now."""
    import pathlib

    readme = pathlib.Path(__file__).resolve().parent.parent / "cpp" / "shaders" / "README.md"
    text = readme.read_text()
    begin, end = "<!-- cost table: begin -->\n", "\n<!-- cost table: end -->"
    committed = text[text.index(begin) + len(begin) : text.index(end)]
    assert committed == cost.table(cost.CONFIGS), (
        "regenerate the table: python -m rnncore cost > table, and paste it into "
        "cpp/shaders/README.md"
    )

"""The Metal kernels' address-space check (cpp/shaders/check): clang parses every .metal file
with Metal's device, constant and threadgroup address spaces mapped to distinct clang address
spaces, so mixing them fails as it does in Metal. Needs clang++ (CI installs it); without it
these tests fail unless RNNCORE_SKIP_CLANG_CHECK=1."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHADERS = ROOT / "cpp" / "shaders"
SCRIPT = SHADERS / "check" / "check_address_spaces.py"

_spec = importlib.util.spec_from_file_location("check_address_spaces", SCRIPT)
check_address_spaces = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_address_spaces)

KERNELS = ["gemm.metal", "rnn.metal", "lstm.metal", "gru.metal"]

# How clang names the spaces in its diagnostics: "cannot pass pointer to address space '3' as
# a pointer to address space '1'", "__attribute__((address_space(2)))", or the type spelled
# through the header's macro ('device float *').
ADDRESS_SPACE_DIAGNOSTIC = re.compile(
    r"address[ _]space|'[^'\n]*\b(device|constant|threadgroup)\b[^'\n]*'"
)


@pytest.fixture(scope="module")
def clang():
    found = check_address_spaces.find_clang()
    if found is None:
        if os.environ.get("RNNCORE_SKIP_CLANG_CHECK") == "1":
            pytest.skip("no clang++ for the Metal address-space check (RNNCORE_SKIP_CLANG_CHECK=1)")
        wanted = os.environ.get("CLANGXX") or "clang++ / clang++-19 ... clang++-14"
        pytest.fail(
            f"the Metal address-space check needs clang++ and none was found ({wanted}): "
            "install clang (apt-get install clang), point CLANGXX at one, or set "
            "RNNCORE_SKIP_CLANG_CHECK=1 to skip these tests",
            pytrace=False,
        )
    return found


def _write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(source)
    return path


def _marked_line(source):
    """The 1-based line of the snippet that carries the `// mixes` marker."""
    lines = [i for i, text in enumerate(source.splitlines(), 1) if "// mixes" in text]
    assert len(lines) == 1
    return lines[0]


def test_every_kernel_is_checked():
    """The check covers the kernels the backend compiles: every .metal file of cpp/shaders,
    including the four forward kernels."""
    names = [path.name for path in check_address_spaces.kernel_sources()]
    assert set(KERNELS) <= set(names)


@pytest.mark.parametrize(
    "source", check_address_spaces.kernel_sources(), ids=lambda path: path.name
)
def test_kernel_passes_the_address_space_check(clang, source):
    """Each .metal file parses under clang with distinct address spaces: no pointer or
    reference crosses from one of device, constant, threadgroup, thread into another, and
    nothing else in it (warnings included) fails to compile."""
    passed, output = check_address_spaces.check(clang, source)
    assert passed, f"{source.name} fails the address-space check:\n{output}"


MIXING = {
    "threadgroup_to_device": """\
inline void scale(device float *out, float s) { out[0] *= s; }

kernel void k(device float *y [[buffer(0)]], THREADGROUP_BUFFER(float, tile, 0)) {
  tile[0] = y[0];
  scale(tile, 2.0f);  // mixes
}
""",
    "device_to_constant": """\
kernel void k(device const float *x [[buffer(0)]], device float *y [[buffer(1)]]) {
  constant float *table = x;  // mixes
  y[0] = table[0];
}
""",
    "device_to_thread": """\
inline void bump(thread float *v) { v[0] += 1.0f; }

kernel void k(device float *y [[buffer(0)]]) {
  bump(y);  // mixes
}
""",
}


@pytest.mark.parametrize("case", sorted(MIXING))
def test_mixing_address_spaces_fails_the_check(clang, tmp_path, case):
    """The check catches mixing: a threadgroup pointer passed where a device pointer is
    expected, a device const pointer assigned to a constant pointer, and a device pointer
    passed to a function taking a thread (plain) pointer are each a clang error at that line,
    and the diagnostic is about address spaces."""
    source = MIXING[case]
    path = _write(tmp_path, f"{case}.metal", source)
    passed, output = check_address_spaces.check(clang, path)
    assert not passed, f"{case}: mixing address spaces passed the check"
    line = _marked_line(source)
    errors = [text for text in output.splitlines() if " error: " in text]
    assert any(text.startswith(f"{path}:{line}:") for text in errors), output
    assert ADDRESS_SPACE_DIAGNOSTIC.search(output), output


CONTROL = """\
#include "kernel_params.h"
using namespace rnncore::kernels;

FUNCTION_CONSTANT(bool, use_bias, 0)
constant float kScale = 0.5f;

inline float read_device(device const float *v, int i) { return v[i]; }
inline float read_constant(constant float *v, int i) { return v[i]; }
inline float read_params(constant StepParams &p) { return float(p.H); }
inline void stage(threadgroup float *tile, uint i, float v) { tile[i] = v; }
inline void accumulate(thread float (&acc)[4], float v) {
  for (int j = 0; j < 4; ++j) acc[j] = fma(v, kScale, acc[j]);
}
inline float sum(thread const float *v, int n) {
  float s = 0.0f;
  for (int j = 0; j < n; ++j) s += v[j];
  return s;
}

kernel void control(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                    constant float *table [[buffer(2)]],
                    constant StepParams &p [[buffer(3)]],
                    THREADGROUP_BUFFER(float, tile, 0),
                    uint3 tgid [[threadgroup_position_in_grid]],
                    uint lane [[thread_index_in_simdgroup]]) {
  stage(tile, lane, read_device(x, int(lane)) * table[0]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  accumulate(acc, tile[lane] + read_constant(table, 1) + read_params(p));
  device float *out = y + int(tgid.x) * p.y_ld;
  threadgroup const float *row = tile + 4;
  float v = simd_sum(x[lane]) + simd_max(tile[lane]) + simd_shuffle(row[0], ushort(1)) +
            simd_broadcast(table[lane], ushort(0)) + simd_shuffle_down(acc[1], ushort(2));
  v = clamp(v, -1.0f, 1.0f) + fmin(fabs(x[0]), fmax(table[0], tile[0])) + float(max(p.N, 0));
  if (use_bias) v += exp(tanh(row[1]));
  out[lane] = v + sum(acc, min(int(lane), 4));
}
"""


def test_correct_address_spaces_pass_the_check(clang, tmp_path):
    """The positive control: a kernel that uses each space correctly (device buffers,
    constant buffers, params and program-scope constants, a threadgroup buffer, thread
    arrays by reference, function constants, and the builtins on values loaded from every
    space) passes, so the failures above are the mixing and nothing else."""
    path = _write(tmp_path, "control.metal", CONTROL)
    passed, output = check_address_spaces.check(clang, path)
    assert passed, output


def test_the_script_reports_each_file(clang, tmp_path):
    """The command-line script (what CI runs) prints one line per file and exits non-zero
    when a file fails: here the control passes and a mixing snippet fails."""
    good = _write(tmp_path, "control.metal", CONTROL)
    bad = _write(tmp_path, "mixing.metal", MIXING["threadgroup_to_device"])
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", str(good), str(bad)],
        capture_output=True,
        text=True,
        env={**os.environ, "CLANGXX": clang},
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2, run.stdout
    assert lines[0].startswith("ok") and lines[0].endswith("control.metal")
    assert lines[1].startswith("FAIL") and lines[1].endswith("mixing.metal")


def test_the_script_fails_without_clang(monkeypatch, capsys):
    """Without a compiler the script fails loudly (exit 2) instead of passing silently."""
    monkeypatch.setenv("CLANGXX", "no-such-clang++")
    assert check_address_spaces.find_clang() is None
    assert check_address_spaces.main([]) == 2
    assert "no clang++ found" in capsys.readouterr().err

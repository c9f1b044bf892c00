"""The Metal kernels' static checks (cpp/shaders/check/check_msl.py): clang parses every .metal
file as C++ for OpenCL (real address spaces, no double) and as C++14 (the C++ MSL is based
on), and the script refuses what MSL does not have (lambdas, goto, recursion, std::, ...) and
every attribute MSL does not define. Each rule has a snippet here that must fail it, at the
line marked `// rejected`. Needs clang++ (CI installs it); without it these tests fail unless
RNNCORE_SKIP_CLANG_CHECK=1."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
from clang_tool import require_clang

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHADERS = ROOT / "cpp" / "shaders"
SCRIPT = SHADERS / "check" / "check_msl.py"

_spec = importlib.util.spec_from_file_location("check_msl", SCRIPT)
check_msl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_msl)

KERNELS = ["gemm.metal", "rnn.metal", "lstm.metal", "gru.metal"]

# How clang names the spaces in its diagnostics: "cannot pass pointer to address space '3' as
# a pointer to address space '1'", "__attribute__((address_space(2)))", the type spelled
# through the header's macro ('device float *'), or OpenCL's ('__global float *').
ADDRESS_SPACE_DIAGNOSTIC = re.compile(
    r"address[ _]space|'[^'\n]*\b(device|constant|threadgroup|__global|__constant|__local)\b"
    r"[^'\n]*'"
)


@pytest.fixture(scope="module")
def clang():
    return require_clang(check_msl.find_clang, "the Metal static checks")


def _write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(source)
    return path


def _marked_line(source, marker="// mixes"):
    """The 1-based line of the snippet that carries the marker."""
    lines = [i for i, text in enumerate(source.splitlines(), 1) if marker in text]
    assert len(lines) == 1
    return lines[0]


def _errors_at(output, path, line):
    """The error lines of the check's output at path:line."""
    return [
        text
        for text in output.splitlines()
        if " error: " in text and text.startswith((f"{path}:{line}:", f"{path}:{line} "))
    ]


def test_every_kernel_is_checked():
    """The check covers the kernels the backend compiles: every .metal file of cpp/shaders,
    including the four forward kernels."""
    names = [path.name for path in check_msl.kernel_sources()]
    assert set(KERNELS) <= set(names)


@pytest.mark.parametrize("source", check_msl.kernel_sources(), ids=lambda path: path.name)
def test_kernel_passes_the_static_checks(clang, source):
    """Each .metal file passes every check: it compiles as C++ for OpenCL and as C++14 with
    distinct address spaces (no pointer or reference crosses from one of device, constant,
    threadgroup, thread into another; no warning), uses nothing MSL leaves out, and only
    attributes MSL defines."""
    passed, output = check_msl.check(clang, source)
    assert passed, f"{source.name} fails the MSL static checks:\n{output}"


def test_the_emulator_selftest_kernels_pass_the_static_checks(clang):
    """The emulator's own test kernels are valid Metal too."""
    passed, output = check_msl.check(clang, ROOT / "tests" / "cpp" / "emulator_selftest.metal")
    assert passed, output


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
    passed, output = check_msl.check(clang, path)
    assert not passed, f"{case}: mixing address spaces passed the check"
    assert _errors_at(output, path, _marked_line(source)), output
    assert ADDRESS_SPACE_DIAGNOSTIC.search(output), output


# What MSL (C++14 with restrictions, no double, its own attributes) refuses and C++ allows:
# each snippet is otherwise valid and must fail the checks at the line marked `// rejected`
# with a diagnostic matching the pattern.
KERNEL = """
kernel void k(device float *y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
"""
# The arguments of KERNEL, for snippets that change another one.
OUT = "device float *y [[buffer(0)]]"
INDEX = "uint i [[thread_index_in_threadgroup]]"


def _signature(*arguments, body="y[i] = 1.0f;"):
    """`kernel void k(...)` with one argument a line (a `// rejected` mark stays on its line)
    and a one-line body."""
    head = "kernel void k("
    lines = []
    for n, argument in enumerate(arguments):
        text, mark, comment = argument.partition("  //")
        end = "," if n + 1 < len(arguments) else ") {"
        lines.append((head if n == 0 else " " * len(head)) + text + end + mark + comment)
    return "\n".join(lines) + f"\n  {body}\n}}\n"


REJECTED = {
    "goto": (
        r"goto",
        """\
inline float positive(float x) {
  if (x > 0.0f) goto done;  // rejected
  x = -x;
done:
  return x;
}
"""
        + KERNEL
        + "  y[i] = positive(y[i]);\n}\n",
    ),
    "lambda": (
        r"lambda",
        KERNEL
        + """\
  auto twice = [](float v) { return 2.0f * v; };  // rejected
  y[i] = twice(y[i]);
}
""",
    ),
    "recursion": (
        r"recursion.*depth -> depth",
        """\
inline int depth(int n) {  // rejected
  return n <= 0 ? 0 : depth(n - 1) + 1;
}
"""
        + KERNEL
        + "  y[i] = float(depth(int(i)));\n}\n",
    ),
    "mutual_recursion": (
        r"recursion.*even -> odd -> even",
        """\
inline bool odd(int n);
inline bool even(int n) { return n == 0 ? true : odd(n - 1); }  // rejected
inline bool odd(int n) { return n == 0 ? false : even(n - 1); }
"""
        + KERNEL
        + "  y[i] = even(int(i)) ? 1.0f : 0.0f;\n}\n",
    ),
    "double": (
        r"double",
        KERNEL
        + """\
  double sum = y[i];  // rejected
  y[i] = float(sum);
}
""",
    ),
    "double_literal": (
        r"double precision constant",
        KERNEL + "  y[i] = y[i] * 0.5;  // rejected\n}\n",
    ),
    "std": (
        r"std|standard library",
        KERNEL + "  std::uint32_t n = i;  // rejected\n  y[n] = 1.0f;\n}\n",
    ),
    "standard_header": (
        r"cmath",
        "#include <cmath>  // rejected\n" + KERNEL + "  y[i] = fabs(y[i]);\n}\n",
    ),
    "virtual": (
        r"virtual",
        """\
struct Scale {
  virtual float apply(float v) const { return 2.0f * v; }  // rejected
};
"""
        + KERNEL
        + "  y[i] = Scale().apply(y[i]);\n}\n",
    ),
    "derived_class": (
        r"derived",
        """\
struct Base {
  float offset;
};
struct Derived : Base {  // rejected
  float scale;
};
"""
        + KERNEL
        + "  Derived d;\n  d.offset = 1.0f;\n  d.scale = 2.0f;\n"
        + "  y[i] = y[i] * d.scale + d.offset;\n}\n",
    ),
    "throw": (
        r"exceptions",
        KERNEL + "  if (y[i] < 0.0f) throw 1;  // rejected\n}\n",
    ),
    "try": (
        r"exceptions",
        KERNEL + "  try {  // rejected\n    y[i] = 1.0f;\n  } catch (...) {\n  }\n}\n",
    ),
    "new": (
        r"new",
        KERNEL + "  thread float *p = new float(1.0f);  // rejected\n  y[i] = *p;\n}\n",
    ),
    "typeid": (
        r"typeid",
        KERNEL + "  y[i] = float(sizeof(typeid(y[i])));  // rejected\n}\n",
    ),
    "noexcept_operator": (
        r"noexcept",
        KERNEL + "  y[i] = noexcept(y[i] + 1.0f) ? 1.0f : 0.0f;  // rejected\n}\n",
    ),
    "thread_local": (
        r"thread_local|thread-local",
        "thread_local int counter = 0;  // rejected\n" + KERNEL + "  y[i] = float(counter);\n}\n",
    ),
    "register": (
        r"register",
        KERNEL + "  register float v = y[i];  // rejected\n  y[i] = v;\n}\n",
    ),
    "c++17_if_constexpr": (
        r"C\+\+17",
        KERNEL + "  if constexpr (sizeof(float) == 4) {  // rejected\n    y[i] = 1.0f;\n  }\n}\n",
    ),
    "c++17_structured_binding": (
        r"C\+\+17",
        "struct Pair {\n  float a, b;\n};\n"
        + KERNEL
        + "  auto [a, b] = Pair{y[i], 1.0f};  // rejected\n  y[i] = a + b;\n}\n",
    ),
    "variable_length_array": (
        r"variable length array",
        KERNEL + "  float scratch[i + 1];  // rejected\n  scratch[0] = y[i];\n"
        "  y[i] = scratch[0];\n}\n",
    ),
    "misspelt_buffer": (
        r"\[\[bufer\]\] is not an attribute MSL defines \(did you mean \[\[buffer\]\]\?\)",
        _signature("device float *y [[bufer(0)]]  // rejected", INDEX),
    ),
    "misspelt_position": (
        r"\[\[thread_index_in_simd_group\]\] is not an attribute MSL defines \(did you mean "
        r"\[\[thread_index_in_simdgroup\]\]\?\)",
        _signature(OUT, "uint i [[thread_index_in_simd_group]]  // rejected"),
    ),
    "scoped_attribute": (
        r"\[\[gnu::always_inline\]\] is not an attribute MSL defines",
        "[[gnu::always_inline]] inline float twice(float v) { return 2.0f * v; }  // rejected\n"
        + KERNEL
        + "  y[i] = twice(y[i]);\n}\n",
    ),
    "attribute_arguments": (
        r"\[\[thread_index_in_simdgroup\]\] takes no arguments",
        _signature(OUT, "uint i [[thread_index_in_simdgroup(0)]]  // rejected"),
    ),
    "buffer_index_range": (
        r"\[\[buffer\(31\)\]\]: index outside 0\.\.30",
        _signature("device float *y [[buffer(31)]]  // rejected", INDEX),
    ),
    "duplicate_buffer_index": (
        r"argument 'x': \[\[buffer\(0\)\]\] is also argument 'y'",
        _signature(
            OUT, "device const float *x [[buffer(0)]]  // rejected", INDEX, body="y[i] = x[i];"
        ),
    ),
    "argument_without_index": (
        r"argument 'x' needs exactly one of \[\[buffer\(i\)\]\]",
        _signature(OUT, "device const float *x  // rejected", INDEX, body="y[i] = x[i];"),
    ),
    "unknown_function_constant": (
        r"function_constant\(has_scal\)\]\]: has_scal is not a function constant",
        "FUNCTION_CONSTANT(bool, has_scale, 45)\n\n"
        + _signature(
            OUT,
            "device const float *s [[buffer(1), function_constant(has_scal)]]  // rejected",
            INDEX,
            body="if (has_scale) y[i] *= s[i];",
        ),
    ),
    "host_name_without_string": (
        r"\[\[host_name\]\] takes one string",
        "template <typename T>\nkernel void k(device T *y [[buffer(0)]], "
        "uint i [[thread_index_in_threadgroup]]) {\n  y[i] = T(1.0f);\n}\n"
        "template [[host_name(k_f32)]] [[kernel]] decltype(k<float>) k<float>;  // rejected\n",
    ),
}


@pytest.mark.parametrize("rule", sorted(REJECTED))
def test_what_msl_refuses_fails_the_check(clang, tmp_path, rule):
    """Each of MSL's restrictions is enforced: the snippet fails the checks with an error at
    the marked line that names what is wrong (and the same snippet without the marked
    construct is what the positive control below shows passing)."""
    pattern, source = REJECTED[rule]
    path = _write(tmp_path, f"{rule.replace('+', 'p')}.metal", source)
    passed, output = check_msl.check(clang, path)
    assert not passed, f"{rule}: passed the check"
    errors = _errors_at(output, path, _marked_line(source, "// rejected"))
    assert errors, output
    assert any(re.search(pattern, text) for text in errors), output


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
    passed, output = check_msl.check(clang, path)
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
    assert check_msl.find_clang() is None
    assert check_msl.main([]) == 2
    assert "no clang++ found" in capsys.readouterr().err


_spec = importlib.util.spec_from_file_location(
    "emulator_signatures", SHADERS / "check" / "emulator_signatures.py"
)
emulator_signatures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(emulator_signatures)

TEMPLATE = """\
template <typename T>
kernel void twice(device T *y [[buffer(1)]], uint i [[thread_index_in_threadgroup]]) {
  y[i] = T(2.0f * float(y[i]));
}
INSTANTIATE_KERNEL(twice_f32, twice<float>)
INSTANTIATE_KERNEL(twice_f16, twice<half>)
"""


def test_the_emulator_registers_each_instance_of_a_kernel_template(clang, tmp_path):
    """One argument table per kernel template, one registration per [[host_name]]."""
    text = emulator_signatures.generate(clang, [_write(tmp_path, "twice.metal", TEMPLATE)])
    assert text.count("inline constexpr ArgSpec twice[]") == 1
    assert '{"y", ArgKind::Buffer, (1), -1, nullptr},' in text
    assert "RNNCORE_EMULATED_KERNEL(twice_f32, twice, twice < float >)" in text
    assert "RNNCORE_EMULATED_KERNEL(twice_f16, twice, twice < half >)" in text


def test_an_instance_of_no_kernel_template_is_refused(clang, tmp_path):
    source = _write(
        tmp_path, "stray.metal", TEMPLATE + "INSTANTIATE_KERNEL(thrice_f32, thrice<float>)\n"
    )
    with pytest.raises(
        emulator_signatures.msl_source.SourceError, match="thrice_f32 instantiates thrice"
    ):
        emulator_signatures.generate(clang, [source])

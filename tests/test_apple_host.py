"""rnncore's Apple host code, checked on Linux (tests/apple_host/check.py says how).

The metal-cpp executor and the "metal" device compile with the project's warnings as errors
against metal-cpp and stand-ins for the SDK headers, and misuses fail (negative controls). The
Metal part of the CMake project builds with a stand-in xcrun: the kernels go through
.metal -> .air -> .metallib -> embedded with the right flags, metal-cpp's symbols end up local
to rnncore's object (an application defining metal-cpp's tables links with it; with the
object as compiled it does not), and the installed package links CoreGraphics. The Metal
compiler check of the configure step (AUTO without the compiler: CPU-only with a warning; ON:
an error) runs against the stand-in imitating each kind of Mac. Finally the shipped executor
object runs against a fake Objective-C runtime and a fake Metal (tests/apple_host/fake_metal.cpp,
x86-64 Linux): device discovery, GPU refusal, buffer binding.

metal-cpp comes from the pinned sdist of pymetal-cpp on PyPI: without network these tests skip,
unless RNNCORE_REQUIRE_APPLE_HOST=1 (CI), which makes that a failure. Without clang++ they fail
unless RNNCORE_SKIP_CLANG_CHECK=1, as tests/test_shaders.py does.
"""

import importlib.util
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys

import pytest
from clang_tool import require_clang

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "apple_host_check", ROOT / "tests/apple_host/check.py"
)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

pytestmark = pytest.mark.skipif(
    sys.platform not in ("linux", "darwin"), reason="the check runs on Linux (and macOS)"
)


@pytest.fixture(scope="module")
def headers():
    try:
        return check.metal_cpp()
    except check.FetchError as e:
        if os.environ.get("RNNCORE_REQUIRE_APPLE_HOST") == "1":
            pytest.fail(f"metal-cpp is required (RNNCORE_REQUIRE_APPLE_HOST=1): {e}", pytrace=False)
        pytest.skip(f"metal-cpp (pinned sdist of {check.PACKAGE} {check.VERSION}) unavailable: {e}")


@pytest.fixture(scope="module")
def clang():
    return require_clang(check.find_clang, "the Apple host checks")


# ---- compile check ---------------------------------------------------------------------------


@pytest.mark.parametrize("source", check.SOURCES, ids=lambda p: p.name)
def test_apple_host_code_compiles(clang, headers, source):
    """apple_executor.cpp and devices.cpp compile against metal-cpp and the SDK stand-ins with
    the project's warnings (CMakeLists.txt's RNNCORE_WARNINGS) as errors."""
    passed, output = check.syntax_check(clang, headers, source)
    assert passed, f"{source.name} does not compile:\n{output}"


def test_compile_check_uses_the_project_warnings():
    flags = check.compile_flags(pathlib.Path("/metal-cpp"))
    for flag in ["-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Werror", "-fblocks"]:
        assert flag in flags


@pytest.mark.parametrize("name", sorted(check.MUTATIONS))
def test_misuse_fails_the_compile_check(clang, headers, tmp_path, name):
    """Negative controls: a misspelt metal-cpp method, arguments swapped between two pointer
    types, calls through a const encoder, and a discarded dispatch_data_create() result (the
    SDK marks it warn_unused_result) each fail at the edited line: the check sees real
    signatures, so it would catch the same mistakes in the executor."""
    text, line = check.mutated_source(name)
    source = tmp_path / "apple_executor.cpp"
    source.write_text(text)
    passed, output = check.syntax_check(clang, headers, source)
    assert not passed, f"{name}: the misuse compiled"
    errors = [
        t for t in output.splitlines() if re.match(rf"{re.escape(str(source))}:\d+:\d+: error", t)
    ]
    assert any(t.startswith(f"{source}:{line}:") for t in errors), output
    assert re.search(check.MUTATIONS[name][3], output), output


@pytest.mark.parametrize(
    "header", sorted(p.relative_to(check.SDK).as_posix() for p in check.SDK.rglob("*.h"))
)
def test_sdk_stand_in_compiles_alone(clang, tmp_path, header):
    """Each stand-in header compiles on its own with every warning as an error (no system-header
    leniency), so it declares nothing malformed."""
    source = tmp_path / "one.cpp"
    source.write_text(f"#include <{header}>\n")
    run = subprocess.run(
        [clang, "-fsyntax-only", "-fblocks", "-std=c++17", "-Wall", "-Wextra", "-Werror",
         "-I", str(check.SDK), str(source)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr


# ---- Metal compiler detection (cmake/metal.cmake, rnncore_metal_enabled) --------------------


def _metal_enabled(tmp_path, mode, apple, machine, xcrun=True):
    """Runs rnncore_metal_enabled(mode, apple) with the stand-in xcrun imitating `machine`;
    returns (exit code, ENABLED, output, xcrun invocations)."""
    log = tmp_path / f"xcrun-{mode}-{machine}.log"
    env = {**os.environ, "RNNCORE_XCRUN_STANDIN": machine, "RNNCORE_XCRUN_LOG": str(log)}
    run = subprocess.run(
        ["cmake", f"-DMODE={mode}", f"-DAPPLE={apple}",
         f"-DRNNCORE_XCRUN={check.XCRUN if xcrun else ''}", "-P", str(check.METAL_ENABLED)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    output = run.stdout + run.stderr
    match = re.search(r"ENABLED=(\w+)", output)
    calls = [json.loads(t)["argv"] for t in log.read_text().splitlines()] if log.exists() else []
    return run.returncode, match.group(1) if match else None, output, calls


def test_metal_enabled_with_the_metal_compiler(tmp_path):
    """With a working Metal compiler AUTO builds the backend on Apple, and the check runs the
    compiler (`metal --version`) instead of only locating it (`-f metal`)."""
    rc, enabled, output, calls = _metal_enabled(tmp_path, "AUTO", "TRUE", "xcode")
    assert rc == 0 and enabled == "TRUE", output
    assert calls == [["-sdk", "macosx", "metal", "--version"]]


@pytest.mark.parametrize("machine", ["xcode26", "clt"])
def test_auto_without_the_metal_compiler_builds_cpu_only(tmp_path, machine):
    """AUTO on a Mac whose Metal compiler does not run (Xcode 26 without its Metal toolchain,
    where `xcrun -f metal` still succeeds; or only the Command Line Tools) configures the
    CPU-only library with a warning that says how to get the compiler, and the reason reaches
    the library (the DeviceError for 'metal')."""
    rc, enabled, output, _ = _metal_enabled(tmp_path, "AUTO", "TRUE", machine)
    assert rc == 0, output
    assert enabled == "FALSE"
    assert "CMake Warning" in output and "WITHOUT the Metal backend" in output
    for hint in ["xcode-select -s /Applications/Xcode.app",
                 "xcodebuild -downloadComponent MetalToolchain", "metal --version"]:  # fmt: skip
        assert hint in output.replace("\n", " ").replace("  ", " "), hint
    assert re.search(r"REASON=it was built without the Metal compiler", output), output


@pytest.mark.parametrize("machine", ["xcode26", "clt"])
def test_on_without_the_metal_compiler_fails(tmp_path, machine):
    """RNNCORE_METAL=ON is the one setting that fails without the compiler."""
    rc, enabled, output, _ = _metal_enabled(tmp_path, "ON", "TRUE", machine)
    assert rc != 0 and enabled is None, output
    assert "RNNCORE_METAL=ON but the Metal compiler does not run" in output


def test_cpu_only_build_says_why_in_the_library(tmp_path):
    """The reason AUTO gives reaches the library: rnncore_add_no_metal() compiles
    devices.cpp with it as its DeviceError text (parentheses, quotes of the shell and
    CMake's list separator all survive), with either generator."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\n"
        "project(no_metal LANGUAGES CXX)\n"
        "set(CMAKE_CXX_STANDARD 17)\n"
        f"include({(ROOT / 'cmake/metal.cmake').as_posix()})\n"
        f"set(RNNCORE_XCRUN {check.XCRUN.as_posix()})\n"
        "rnncore_metal_enabled(AUTO TRUE enabled reason)\n"
        "add_library(no_metal OBJECT)\n"
        f"target_include_directories(no_metal PRIVATE {(ROOT / 'cpp/include').as_posix()} "
        f"{(ROOT / 'cpp/src').as_posix()})\n"
        'rnncore_add_no_metal(no_metal "${reason}")\n'
    )
    env = {**os.environ, "RNNCORE_XCRUN_STANDIN": "clt", "RNNCORE_XCRUN_LOG": str(tmp_path / "log")}
    generators = ["Unix Makefiles"] + (["Ninja"] if shutil.which("ninja") else [])
    for generator in generators:
        build = tmp_path / generator.replace(" ", "_")
        for command in (
            ["cmake", "-S", str(project), "-B", str(build), "-G", generator],
            ["cmake", "--build", str(build)],
        ):
            run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
            assert run.returncode == 0, run.stdout + run.stderr
        objects = list(build.rglob("devices.cpp.o"))
        assert len(objects) == 1, objects
        data = objects[0].read_bytes()
        assert (
            b"no Metal backend (it was built without the Metal compiler. To get it, install" in data
        )
        assert b"downloadComponent MetalToolchain" in data and b"--force-reinstall .))" in data


def test_auto_off_apple_and_off_never_run_xcrun(tmp_path):
    for mode, apple in [("AUTO", "FALSE"), ("OFF", "TRUE")]:
        rc, enabled, output, calls = _metal_enabled(tmp_path, mode, apple, "xcode")
        assert rc == 0 and enabled == "FALSE" and calls == [], (mode, output)


def test_on_without_xcrun_fails(tmp_path):
    env_path = os.environ.get("PATH", "")
    if shutil.which("xcrun", path=env_path):
        pytest.skip("an xcrun is on PATH")
    rc, _, output, _ = _metal_enabled(tmp_path, "ON", "TRUE", "xcode", xcrun=False)
    assert rc != 0 and "xcrun was not found" in output, output


# ---- the Metal part of the CMake project, built with the stand-in xcrun --------------------


class StandIn:
    """The project configured with RNNCORE_METAL=ON and the stand-in xcrun, and the Metal part
    (target rnncore_metal_private: kernels, embedded metallib, executor) built."""

    def __init__(self, root, clang, headers):
        self.dir = root
        self.build = root / "build"
        self.xcrun = root / "bin" / "xcrun"
        self.xcrun.parent.mkdir(parents=True)
        shutil.copy2(check.XCRUN, self.xcrun)
        self.log = root / "bin" / "xcrun.log"
        flags = check.cmake_flags_for_standin(headers, self.xcrun, clang)
        env = {k: v for k, v in os.environ.items() if k not in ("RNNCORE_XCRUN_LOG",)}
        env["RNNCORE_XCRUN_STANDIN"] = "xcode"
        self.configure = subprocess.run(
            ["cmake", "-S", str(ROOT), "-B", str(self.build), *flags],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
        self.built = None
        if self.configure.returncode == 0:
            self.built = subprocess.run(
                ["cmake", "--build", str(self.build), "--target", "rnncore_metal_private",
                 "-j", "2"],
                capture_output=True, text=True, env=env, timeout=1200,
            )  # fmt: skip

    def calls(self):
        return [json.loads(t)["argv"] for t in self.log.read_text().splitlines()]

    def object(self):
        return self.build / "rnncore_metal_host.o"

    def raw_objects(self):
        return sorted((self.build / "CMakeFiles" / "rnncore_metal_host.dir").rglob("*.o"))


@pytest.fixture(scope="module")
def standin(tmp_path_factory, clang, headers):
    if shutil.which("cmake") is None:
        pytest.fail("the stand-in build needs cmake", pytrace=False)
    s = StandIn(tmp_path_factory.mktemp("standin"), clang, headers)
    assert s.configure.returncode == 0, s.configure.stdout + s.configure.stderr
    assert s.built.returncode == 0, s.built.stdout + s.built.stderr
    return s


# The two libraries cmake/metal.cmake builds: file, Metal language, macOS floor.
METALLIBS = [("rnncore.metallib", "metal3.0", "13.0"),
             ("rnncore_macos14.metallib", "metal3.1", "14.0")]  # fmt: skip


def test_kernels_go_through_the_metal_toolchain(standin):
    """Every .metal file of cpp/shaders is compiled twice to .air with the kernel flags
    (warnings as errors, no fast math, the shader includes): with Metal 3.0 for macOS 13 and
    with Metal 3.1 (bfloat) for macOS 14, each into a directory of its own; each set of .air
    files is linked into its library, rnncore.metallib and rnncore_macos14.metallib."""
    calls = standin.calls()
    assert calls[0] == ["-sdk", "macosx", "metal", "--version"], calls
    compiles = [c for c in calls if c[2:4] == ["metal", "-c"]]
    links = [c for c in calls if c[2] == "metallib"]
    kernels = sorted(p.name for p in (ROOT / "cpp/shaders").glob("*.metal"))
    assert len(links) == len(METALLIBS), calls
    air_dirs = set()
    for (name, std, floor), link in zip(METALLIBS, sorted(links, key=lambda c: c[-1])):
        assert link[-2:] == ["-o", str(standin.build / name)], link
        mine = [c for c in compiles if f"-std={std}" in c]
        assert sorted(pathlib.Path(c[c.index("-o") - 1]).name for c in mine) == kernels, std
        for c in mine:
            for flag in ["-Wall", "-Wextra", "-Werror", "-fno-fast-math",
                         f"-mmacosx-version-min={floor}"]:  # fmt: skip
                assert flag in c, (flag, c)
            assert [a for a in c if a.startswith("-std=")] == [f"-std={std}"], c
            assert c[c.index("-I") + 1] == str(ROOT / "cpp/shaders")
        airs = [a for a in link if a.endswith(".air")]
        assert sorted(airs) == sorted(c[c.index("-o") + 1] for c in mine), (airs, mine)
        dirs = {str(pathlib.Path(a).parent) for a in airs}
        assert len(dirs) == 1 and not dirs & air_dirs, (dirs, air_dirs)
        air_dirs |= dirs
        assert (standin.build / name).read_text().splitlines()[1] == f"std {std}"
    assert len(calls) == 1 + len(METALLIBS) * (len(kernels) + 1), calls


@pytest.mark.parametrize(
    "flags, error",
    [
        (["-std=metal3.1", "-mmacosx-version-min=13.0"], "needs -mmacosx-version-min=14.0"),
        (["-std=metal3.0", "-mmacosx-version-min=12.0"], "needs -mmacosx-version-min=13.0"),
        (["-std=metal3.2", "-mmacosx-version-min=15.0"], "one -std= of"),
        (["-mmacosx-version-min=14.0"], "one -std= of"),
        (["-std=metal3.1"], "one -mmacosx-version-min="),
    ],
)
def test_standin_compiler_refuses_what_metal_refuses(tmp_path, flags, error):
    """The stand-in compiler takes -std=metal3.0 (macOS 13 and later) and -std=metal3.1
    (macOS 14 and later) only, as the build uses them: metal3.1 below macOS 14 is an error of
    the real compiler too."""
    source = tmp_path / "k.metal"
    source.write_text("kernel void k() {}\n")
    env = {**os.environ, "RNNCORE_XCRUN_LOG": str(tmp_path / "log")}
    env.pop("RNNCORE_XCRUN_STANDIN", None)
    run = subprocess.run(
        [sys.executable, str(check.XCRUN), "-sdk", "macosx", "metal", "-c", "-Wall", "-Wextra",
         "-Werror", "-fno-fast-math", *flags, str(source), "-o", str(tmp_path / "k.air")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert run.returncode != 0 and error in run.stderr, run.stderr


def test_standin_linker_refuses_mixed_languages(tmp_path):
    """The stand-in metallib refuses .air files of both languages in one library (so a build
    that crossed the two libraries' inputs fails on Linux)."""
    env = {**os.environ, "RNNCORE_XCRUN_LOG": str(tmp_path / "log")}
    env.pop("RNNCORE_XCRUN_STANDIN", None)
    airs = []
    for stem, std, floor in [("a", "metal3.0", "13.0"), ("b", "metal3.1", "14.0")]:
        source = tmp_path / f"{stem}.metal"
        source.write_text("kernel void k() {}\n")
        airs.append(str(tmp_path / f"{stem}.air"))
        run = subprocess.run(
            [sys.executable, str(check.XCRUN), "-sdk", "macosx", "metal", "-c", "-Wall",
             "-Wextra", "-Werror", "-fno-fast-math", f"-std={std}",
             f"-mmacosx-version-min={floor}", str(source), "-o", airs[-1]],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
    run = subprocess.run(
        [sys.executable, str(check.XCRUN), "-sdk", "macosx", "metallib", *airs, "-o",
         str(tmp_path / "l.metallib")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert run.returncode != 0 and "different -std" in run.stderr, run.stderr


def test_metallib_is_embedded(standin):
    """Each library's embedded source carries its metallib's bytes (all of them: the two
    libraries differ only past the header), and both were compiled into the object."""
    for metallib, symbol in [("rnncore.metallib", "rnncore_metallib"),
                             ("rnncore_macos14.metallib", "rnncore_metallib_macos14")]:  # fmt: skip
        data = (standin.build / metallib).read_bytes()
        embedded = (standin.build / f"{symbol}.cpp").read_text()
        assert f"{symbol}_size = {len(data)};" in embedded
        assert f"{symbol}[] = {{" in embedded
        body = embedded.split("{", 1)[1].split("}", 1)[0]
        assert bytes(int(b, 16) for b in body.replace(",", " ").split()) == data, metallib
    names = [p.name for p in standin.raw_objects()]
    assert any(n.startswith("apple_executor") for n in names), names
    assert any(n.startswith("rnncore_metallib.") for n in names), names
    assert any(n.startswith("rnncore_metallib_macos14.") for n in names), names


def _globals(path):
    """(type, name) of the defined global symbols of an object."""
    run = subprocess.run(["nm", "-g", "--defined-only", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return [tuple(t.split()[1:3]) for t in run.stdout.splitlines() if len(t.split()) == 3]


def test_metal_cpp_symbols_are_local_to_rnncore(standin):
    """The object that goes into the library defines no global symbol but rnncore's (and weak
    ones: inline functions and templates, which never clash), while the executor as compiled
    defines ~1,600 strong metal-cpp globals (class, selector and constant tables, the four
    function pointers that the visibility macro misses)."""
    strong = "TDBRGSC"
    raw = [n for p in standin.raw_objects() for t, n in _globals(p) if t in strong]
    foreign_raw = [n for n in raw if "rnncore" not in n]
    assert len(foreign_raw) > 1000, len(foreign_raw)
    assert "_ZN3MTL7Private39MTLIOCompressionContextDefaultChunkSizeE" in foreign_raw
    final = _globals(standin.object())
    foreign = [n for t, n in final if t in strong and "rnncore" not in n]
    assert foreign == [], foreign[:20]
    own = sorted(n for t, n in final if "rnncore" in n)
    assert "_ZN7rnncore5metal14apple_executorEv" in own
    assert "_ZN7rnncore5metal19apple_gpu_availableEv" in own
    for symbol in ["rnncore_metallib", "rnncore_metallib_macos14"]:
        assert symbol in own and f"{symbol}_size" in own, own


def _link_consumer(standin, clang, headers, objects, out):
    consumer = standin.dir / "consumer.o"
    if not consumer.exists():
        flags = [f for f in check.compile_flags(headers) if f != "-Wpedantic"]
        run = subprocess.run(
            [clang, "-c", "-fPIC", *flags, str(check.CONSUMER), "-o", str(consumer)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
    # A shared library: Apple's runtime symbols stay undefined, duplicates are still errors.
    return subprocess.run(
        [clang, "-shared", str(consumer), *map(str, objects), "-o", str(standin.dir / out)],
        capture_output=True, text=True,
    )  # fmt: skip


def test_application_defining_metal_cpp_links_with_rnncore(standin, clang, headers):
    """An application that defines metal-cpp's implementation itself links with rnncore's
    Metal object; linked with the executor as compiled (the former library) it fails with a
    'multiple definition' for every metal-cpp table entry."""
    ok = _link_consumer(standin, clang, headers, [standin.object()], "libok.so")
    assert ok.returncode == 0, ok.stderr[-4000:]
    clash = _link_consumer(standin, clang, headers, standin.raw_objects(), "libclash.so")
    assert clash.returncode != 0
    assert clash.stderr.count("multiple definition") > 1000, clash.stderr[-2000:]


def test_installed_package_links_coregraphics(standin):
    """Consumers of the installed library link Metal, Foundation and CoreGraphics (without
    CoreGraphics MTLCreateSystemDefaultDevice() can return nil in a command-line process)."""
    exports = list((standin.build / "CMakeFiles" / "Export").rglob("rnncoreTargets.cmake"))
    assert exports, "no export file generated"
    text = exports[0].read_text()
    for framework in ["Metal", "Foundation", "CoreGraphics"]:
        assert f"-framework {framework}" in text, framework


def test_metal_on_fails_configure_without_the_compiler(tmp_path, clang, headers):
    """The whole project configured with RNNCORE_METAL=ON on a Mac whose Xcode 26 lacks the
    Metal toolchain (`xcrun -f metal` succeeds there) stops at configure time, saying how to get
    the compiler (before: configure passed and the build failed in the first kernel)."""
    xcrun = tmp_path / "xcrun"
    shutil.copy2(check.XCRUN, xcrun)
    env = {
        **os.environ,
        "RNNCORE_XCRUN_STANDIN": "xcode26",
        "RNNCORE_XCRUN_LOG": str(tmp_path / "log"),
    }
    run = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"),
         *check.cmake_flags_for_standin(headers, xcrun, clang)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode != 0, run.stdout
    assert "RNNCORE_METAL=ON but the Metal compiler does not run" in run.stderr, run.stderr
    assert "downloadComponent MetalToolchain" in run.stderr.replace("\n", " ")


# ---- the executor run against a fake Objective-C runtime and a fake Metal -----------------

# What the executor object needs from the rest of rnncore (plans, tensors, their checks).
FAKE_METAL_SOURCES = ["cpp/src/metal/plan.cpp", "cpp/src/core/tensor.cpp",
                      "cpp/src/core/validate.cpp", "cpp/src/core/descriptors.cpp"]  # fmt: skip


@pytest.fixture(scope="module")
def fake_metal(standin, clang):
    """tests/apple_host/fake_metal.cpp linked with the Metal object the library ships."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the fake Objective-C runtime is written for x86-64 Linux")
    exe = standin.dir / "fake_metal"
    sources = [str(check.HERE / "fake_metal.cpp"), *(str(ROOT / s) for s in FAKE_METAL_SOURCES)]
    run = subprocess.run(
        [clang, "-std=c++17", "-O0", *check.project_warnings(), "-Werror",
         "-I", str(ROOT / "cpp/include"), "-I", str(ROOT / "cpp/src"),
         "-I", str(ROOT / "cpp/shaders"), *sources, str(standin.object()),
         "-o", str(exe), "-pthread", "-ldl"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return exe


@pytest.mark.parametrize(
    "scenario",
    ["run", "steps", "nil-default", "no-gpu", "not-apple-silicon", "simd-width",
     "macos13", "macos14", "macos15", "metallib-env", "load-error"],
)  # fmt: skip
def test_executor_on_fake_metal(standin, fake_metal, scenario):
    """The executor as shipped, run against a fake Objective-C runtime and Metal (on macOS
    14.0 unless said otherwise):
    run: a plan binds an aligned 256 KiB input in place (element-aligned offset), copies a
    misaligned one (item 2), copies a small one, binds the placeholder at offset 0 for a
    zero-size input with a dummy pointer, and binds an allocate() output in place;
    nil-default: MTLCreateSystemDefaultDevice() is nil, MTLCopyAllDevices() has an AMD GPU and
    an Apple one: the Apple one is used (item 1); no-gpu: no device at all, a clear error;
    not-apple-silicon: a non-Apple7 GPU is not offered and the error says why (item 5);
    simd-width: a pipeline with 64-wide SIMD-groups is refused before anything is encoded
    (item 5). Each fails with the executor as it was before issue 11.
    macos13: on macOS 13.7 the embedded metal3.0 library is loaded (the fake Metal, like the
    real one, refuses metal3.1 there) and computes_bfloat16() is false (no gemm_bbb in it);
    macos14, macos15: on 14.0 and 15.3 the embedded metal3.1 library and true; both ask the
    library for gemm_bbb once and release the function;
    metallib-env: RNNCORE_METALLIB names rnncore.metallib (metal3.0) on macOS 14: the file is
    loaded and computes_bfloat16() is false (the library answers, not the OS);
    load-error: Metal refuses the library: the error names the macOS 13 or macOS 14 library
    that failed, and the next call, once Metal accepts it, loads it."""
    env = {k: v for k, v in os.environ.items() if k != "RNNCORE_METALLIB"}
    if scenario == "metallib-env":
        env["RNNCORE_METALLIB"] = str(standin.build / "rnncore.metallib")
    run = subprocess.run(
        [str(fake_metal), scenario], capture_output=True, text=True, env=env, timeout=120
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "FAIL" not in output, output
    assert "ok" in run.stdout, output

#!/usr/bin/env python3
"""rnncore's Apple host code, checked on Linux (no Mac, no Xcode).

The metal-cpp executor (cpp/src/metal/apple_executor.cpp) and the "metal" device
(cpp/src/metal/devices.cpp, with RNNCORE_METAL_APPLE) are compiled only on a Mac. Here clang
compiles them against metal-cpp's headers (from the pinned sdist of pymetal-cpp on PyPI, which
carries them) and the stand-ins for the SDK headers Linux lacks (sdk/, declared as Apple's SDK
declares them), with the project's warning flags and -Werror; and CMake builds the Metal part of
the project with a stand-in xcrun (./xcrun) that records its invocations, and the executor
object it builds runs against a fake Objective-C runtime and Metal (fake_metal.cpp).
tests/test_apple_host.py runs the checks (negative controls included); this script fetches
metal-cpp and runs the compile check alone:

    python tests/apple_host/check.py fetch   # download and verify the sdist (cached)
    python tests/apple_host/check.py         # fetch, then compile the two files

The download is cached under build/apple_host/ in the source tree, or $RNNCORE_APPLE_HOST_CACHE.
The compiler: $CLANGXX, else clang++ or clang++-19 ... clang++-14 on PATH.
"""

import argparse
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "cpp" / "shaders" / "check"))
from check_msl import find_clang  # noqa: E402  (the same clang++ as the shader checks)

SDK = HERE / "sdk"
XCRUN = HERE / "xcrun"
CONSUMER = HERE / "consumer.cpp"
METAL_ENABLED = HERE / "metal_enabled.cmake"
SOURCES = [ROOT / "cpp/src/metal/apple_executor.cpp", ROOT / "cpp/src/metal/devices.cpp"]

# metal-cpp (the macOS 15 / iOS 18 headers) inside pymetal-cpp's sdist, pinned by digest.
PACKAGE, VERSION = "pymetal-cpp", "0.1.5"
SDIST = "pymetal_cpp-0.1.5.tar.gz"
SDIST_SHA256 = "1118062f635277a2781659fbc4e7e5bac7d565d6948a3461c3b04d6425c15a0e"
METAL_CPP_IN_SDIST = "pymetal_cpp-0.1.5/thirdparty/metal-cpp/"


class FetchError(RuntimeError):
    """metal-cpp could not be had (no network, PyPI refused, digest mismatch)."""


def cache_dir():
    configured = os.environ.get("RNNCORE_APPLE_HOST_CACHE")
    return pathlib.Path(configured) if configured else ROOT / "build" / "apple_host"


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def metal_cpp(download=True):
    """The directory holding metal-cpp's Foundation/ and Metal/ headers, extracted from the
    pinned sdist (downloaded with pip when not cached and `download`). Raises FetchError."""
    cache = cache_dir()
    headers = cache / f"metal-cpp-{SDIST_SHA256[:12]}"
    if (headers / "Metal" / "Metal.hpp").is_file():
        return headers
    sdist = cache / SDIST
    if not sdist.is_file():
        if not download:
            raise FetchError(f"{sdist} is not there (run: python {__file__} fetch)")
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            # --no-binary for this package only: ":all:" would build CMake from source for
            # the metadata step.
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                       PACKAGE, f"{PACKAGE}=={VERSION}", "-d", tmp, "-q",
                       "--disable-pip-version-check"]  # fmt: skip
            try:
                run = subprocess.run(command, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise FetchError(f"`{' '.join(command)}` failed: {e}") from e
            got = pathlib.Path(tmp) / SDIST
            if run.returncode != 0 or not got.is_file():
                raise FetchError(
                    f"`{' '.join(command)}` failed ({run.returncode}):\n{run.stdout}{run.stderr}"
                )
            got.replace(sdist)
    digest = sha256(sdist)
    if digest != SDIST_SHA256:
        sdist.unlink()
        raise FetchError(f"{SDIST} has sha256 {digest}, expected the pinned {SDIST_SHA256}")
    staging = pathlib.Path(tempfile.mkdtemp(dir=cache))
    try:
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                name = member.name
                if (
                    not name.startswith(METAL_CPP_IN_SDIST)
                    or ".." in pathlib.PurePosixPath(name).parts
                ):
                    continue
                if not (member.isfile() or member.isdir()):
                    continue
                target = staging / name[len(METAL_CPP_IN_SDIST) :]
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
        if not (staging / "Metal" / "Metal.hpp").is_file():
            raise FetchError(f"{SDIST} has no {METAL_CPP_IN_SDIST}Metal/Metal.hpp")
        if headers.exists():
            shutil.rmtree(headers)
        staging.replace(headers)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return headers


def project_warnings():
    """RNNCORE_WARNINGS of CMakeLists.txt (what every rnncore source is compiled with)."""
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"set\(RNNCORE_WARNINGS ([^)]*)\)", text)
    if not match:
        raise RuntimeError("CMakeLists.txt sets no RNNCORE_WARNINGS")
    return match.group(1).split()


def compile_flags(headers):
    """The flags of the compile check: the project's warnings as errors, blocks (metal-cpp's
    completion handlers), the SDK stand-ins and metal-cpp as system headers (as on a Mac,
    where they are system headers too), and rnncore's include directories."""
    return [
        "-std=c++17",
        "-fblocks",
        *project_warnings(),
        "-Werror",
        "-DRNNCORE_METAL_APPLE",  # devices.cpp's "metal" device as an Apple build has it
        "-isystem",
        str(SDK),
        "-isystem",
        str(headers),
        "-I",
        str(ROOT / "cpp/include"),
        "-I",
        str(ROOT / "cpp/src"),
        "-I",
        str(ROOT / "cpp/shaders"),
    ]


def syntax_check(clang, headers, source):
    """Compiles one source with -fsyntax-only: (passed, clang's diagnostics)."""
    command = [str(clang), "-fsyntax-only", *compile_flags(headers), "-x", "c++", str(source)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return run.returncode == 0, run.stdout + run.stderr


# Negative controls: each edit of apple_executor.cpp (old -> new) is a misuse the compile check
# must reject with a diagnostic matching `pattern` on the first line, from the edit on, that
# contains `error_at`.
MUTATIONS = {
    "misspelt_method": (
        "encoder->dispatchThreadgroups(",
        "encoder->dispatchThreadGroups(",
        "dispatchThreadGroups(",
        r"no member named 'dispatchThreadGroups'",
    ),
    "swapped_arguments": (
        "library_->newFunction(ns_string(d.kernel), constants.get(), &error)",
        "library_->newFunction(constants.get(), ns_string(d.kernel), &error)",
        "newFunction(",
        r"newFunction|cannot initialize",
    ),
    "const_encoder": (
        "void encode(MTL::ComputeCommandEncoder* encoder,",
        "void encode(const MTL::ComputeCommandEncoder* encoder,",
        "encoder->setComputePipelineState(",
        r"not marked const|discards qualifiers",
    ),
    "discarded_dispatch_data": (
        "dispatch_data_t data =\n        dispatch_data_create(",
        "dispatch_data_t data = nullptr;\n        dispatch_data_create(",
        "dispatch_data_create(",
        r"ignoring return value|unused-result",
    ),
}


def mutated_source(name):
    """apple_executor.cpp with the named misuse, and the 1-based line clang must reject."""
    old, new, error_at, _ = MUTATIONS[name]
    text = SOURCES[0].read_text()
    if text.count(old) != 1:
        raise RuntimeError(f"negative control {name}: {old!r} is not in apple_executor.cpp once")
    start = text.index(old)
    mutated = text.replace(old, new)
    return mutated, mutated.count("\n", 0, mutated.index(error_at, start)) + 1


def cmake_flags_for_standin(headers, xcrun, clang):
    """Configure flags that build the Metal part of the project on Linux: clang (blocks) with
    the SDK stand-ins, the stand-in xcrun, metal-cpp from the sdist, framework paths (only
    named, never linked: the Metal part is a static library)."""
    cxx_flags = f"-fblocks -isystem {SDK} -Werror"
    return [
        f"-DCMAKE_CXX_COMPILER={clang}",
        f"-DCMAKE_CXX_FLAGS={cxx_flags}",
        "-DRNNCORE_METAL=ON",
        f"-DRNNCORE_XCRUN={xcrun}",
        f"-DFETCHCONTENT_SOURCE_DIR_METAL_CPP={headers}",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        "-DRNNCORE_METAL_FRAMEWORK=/System/Library/Frameworks/Metal.framework",
        "-DRNNCORE_FOUNDATION_FRAMEWORK=/System/Library/Frameworks/Foundation.framework",
        "-DRNNCORE_COREGRAPHICS_FRAMEWORK=/System/Library/Frameworks/CoreGraphics.framework",
        "-DCMAKE_BUILD_TYPE=Release",
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="check", choices=["fetch", "check"])
    args = parser.parse_args(argv)
    try:
        headers = metal_cpp()
    except FetchError as e:
        print(f"metal-cpp: {e}", file=sys.stderr)
        return 2
    print(f"metal-cpp: {headers}")
    if args.command == "fetch":
        return 0
    clang = find_clang()
    if clang is None:
        print("no clang++ found (apt-get install clang, or set CLANGXX)", file=sys.stderr)
        return 2
    failed = 0
    for source in SOURCES:
        passed, output = syntax_check(clang, headers, source)
        print(f"{'ok  ' if passed else 'FAIL'} {source.relative_to(ROOT)}")
        if not passed:
            failed += 1
            print(output)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

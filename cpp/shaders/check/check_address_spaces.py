#!/usr/bin/env python3
"""Address-space check of the Metal kernels with clang (no Metal compiler needed).

Parses every cpp/shaders/*.metal as C++ with msl_address_spaces.h included first, which maps
Metal's device, constant and threadgroup address spaces to distinct clang address spaces:
passing or assigning a pointer (or reference) of one space where another is expected is a
compile error, as it is in Metal. Prints one line per file and exits non-zero if any fails.

    python cpp/shaders/check/check_address_spaces.py            # the kernels
    python cpp/shaders/check/check_address_spaces.py extra.metal  # the kernels and extra.metal
    python cpp/shaders/check/check_address_spaces.py --only extra.metal

The compiler: $CLANGXX, else clang++ or clang++-19 ... clang++-14 on PATH (apt's `clang`).
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys

CHECK_DIR = pathlib.Path(__file__).resolve().parent
SHADER_DIR = CHECK_DIR.parent
HEADER = CHECK_DIR / "msl_address_spaces.h"

CANDIDATES = ["clang++"] + [f"clang++-{v}" for v in range(19, 13, -1)]

# Every warning is an error except three that MSL source cannot avoid under clang: Metal's
# attributes ([[buffer(0)]], ...) are unknown to clang, kernels take arguments they do not
# read (a shared parameter list), and `constant const T` is valid MSL while the header's
# `constant` already carries const.
FLAGS = [
    "-fsyntax-only",
    "-std=c++17",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unknown-attributes",
    "-Wno-unused-parameter",
    "-Wno-duplicate-decl-specifier",
]


def find_clang():
    """The clang++ to use: $CLANGXX if set (None if it is not an executable), else the first
    of clang++, clang++-19 ... clang++-14 on PATH, else None."""
    configured = os.environ.get("CLANGXX")
    if configured:
        return shutil.which(configured)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def kernel_sources():
    """Every .metal file of cpp/shaders, sorted."""
    return sorted(SHADER_DIR.glob("*.metal"))


def command(clang, source):
    """The clang command line that checks one .metal file."""
    return [
        str(clang),
        *FLAGS,
        "-include",
        str(HEADER),
        "-I",
        str(SHADER_DIR),
        "-x",
        "c++",
        str(source),
    ]


def check(clang, source):
    """Runs the check on one file: (passed, clang's diagnostics)."""
    result = subprocess.run(command(clang, source), capture_output=True, text=True)
    return result.returncode == 0, result.stdout + result.stderr


def _display(path):
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=pathlib.Path, help="extra files to check")
    parser.add_argument(
        "--only", action="store_true", help="check only the given files, not the kernels"
    )
    args = parser.parse_args(argv)

    clang = find_clang()
    if clang is None:
        wanted = os.environ.get("CLANGXX") or " / ".join(CANDIDATES)
        print(f"error: no clang++ found ({wanted}); install clang or set CLANGXX", file=sys.stderr)
        return 2
    sources = ([] if args.only else kernel_sources()) + list(args.files)
    if not sources:
        print("error: nothing to check", file=sys.stderr)
        return 2

    print(f"address-space check with {clang}", file=sys.stderr)
    failed = 0
    for source in sources:
        passed, output = check(clang, source)
        print(f"{'ok  ' if passed else 'FAIL'} {_display(source)}", flush=True)
        if not passed:
            failed += 1
            sys.stderr.write(output)
            sys.stderr.flush()
    if failed:
        print(f"{failed} of {len(sources)} files failed the address-space check", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

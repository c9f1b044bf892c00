"""clang++ for the tests that compile with it (tests/test_shaders.py, tests/test_apple_host.py),
found as cpp/shaders/check/check_msl.py finds it. Without one such a test fails, or skips when
RNNCORE_SKIP_CLANG_CHECK=1."""

import os

import pytest


def require_clang(find_clang, what):
    """The clang++ `find_clang()` returns, for `what` (e.g. "the Metal static checks")."""
    found = find_clang()
    if found is None:
        if os.environ.get("RNNCORE_SKIP_CLANG_CHECK") == "1":
            pytest.skip(f"no clang++ for {what} (RNNCORE_SKIP_CLANG_CHECK=1)")
        wanted = os.environ.get("CLANGXX") or "clang++ / clang++-19 ... clang++-14"
        pytest.fail(
            f"{what} need clang++ and none was found ({wanted}): install clang "
            "(apt-get install clang), point CLANGXX at one, or set RNNCORE_SKIP_CLANG_CHECK=1 "
            "to skip these tests",
            pytrace=False,
        )
    return found

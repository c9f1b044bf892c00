"""The wheel matrix and the stable ABI (README.md, "Install"): what pyproject.toml, CMakeLists.txt
and .github/workflows/wheels.yml must keep saying, since nothing here can run the workflow,
and the installed module's ABI. .ci/run builds, repairs and installs the Linux wheel and the
sdist; tests/check_wheel.py checks an installed wheel."""

import pathlib
import sys

import pytest

import rnncore._core as core

ROOT = pathlib.Path(__file__).resolve().parent.parent

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")


@pytest.fixture(scope="module")
def project():
    path = ROOT / "pyproject.toml"
    if not path.exists():
        pytest.skip("no pyproject.toml beside the tests")
    return tomllib.loads(path.read_text())


def test_installed_module_uses_the_stable_abi_from_3_12():
    name = pathlib.Path(core.__file__).name
    assert (".abi3." in name) == (sys.version_info >= (3, 12)), name


def test_abi3_wheels_from_cpython_3_12(project):
    assert project["tool"]["scikit-build"]["wheel"]["py-api"] == "cp312"
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert "nanobind_add_module(_core STABLE_ABI" in cmake
    assert "${SKBUILD_SABI_COMPONENT}" in cmake  # Development.SABIModule for abi3 builds


def test_wheel_matrix(project):
    cibw = project["tool"]["cibuildwheel"]
    assert cibw["build"] == ["cp310-*", "cp311-*", "cp312-*", "cp313-*", "cp314-*"]
    for image in ("manylinux-x86_64-image", "manylinux-aarch64-image"):
        assert cibw[image] == "manylinux_2_28"
    assert cibw["musllinux-x86_64-image"] == "musllinux_1_2"
    assert cibw["skip"] == ["*-musllinux_aarch64"]
    tests = " && ".join(cibw["test-command"])
    assert "check_wheel.py" in tests and "python -m rnncore check" in tests
    # OpenBLAS stays the scipy-openblas32 package's.
    assert "--exclude libscipy_openblas.so" in cibw["linux"]["repair-wheel-command"]
    assert cibw["macos"]["environment"]["MACOSX_DEPLOYMENT_TARGET"] == "13.3"
    overrides = {o["select"]: o["environment"] for o in cibw["overrides"]}
    assert overrides["*-macosx_arm64"]["CMAKE_ARGS"] == "-DRNNCORE_METAL=ON"
    assert overrides["*-macosx_x86_64"]["CMAKE_ARGS"] == "-DRNNCORE_METAL=OFF"


def test_workflow_builds_every_platform_and_the_sdist():
    path = ROOT / ".github" / "workflows" / "wheels.yml"
    if not path.exists():
        pytest.skip("not a repository checkout (the sdist has no workflows)")
    text = path.read_text()
    assert "uses: pypa/cibuildwheel@v3." in text
    for runner, arch in [("ubuntu-24.04", "x86_64"), ("ubuntu-24.04-arm", "aarch64"),
                         ("macos-26", "arm64"), ("macos-15-intel", "x86_64")]:  # fmt: skip
        assert f"os: {runner}, archs: {arch} }}" in text, (runner, arch)
    assert 'tags: ["v*"]' in text and "pull_request:" in text
    assert "python -m build --sdist" in text
    assert text.count("actions/upload-artifact@v4") == 2


def test_sdist_leaves_out_what_a_build_does_not_need(project):
    exclude = project["tool"]["scikit-build"]["sdist"]["exclude"]
    for path in (".github/", ".ci/", "bench/results/", "build/"):
        assert path in exclude

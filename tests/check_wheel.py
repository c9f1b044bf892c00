"""Checks an installed rnncore wheel (cibuildwheel's test step, pyproject.toml, and .ci/run):
run it with the environment's python from outside the source tree. It checks what a wheel
must be beyond passing the suite: the module installed (not the checkout's), CPython's
stable ABI from 3.12 on, OpenBLAS loaded from the scipy-openblas32 package on Linux (a
dependency, not a copy in the wheel), and the Metal backend compiled into macOS arm64
wheels (a runner's GPU may still be refused; a build without Metal may not)."""

import pathlib
import platform
import sys

import numpy as np

import rnncore
import rnncore._core as core


def main():
    module = pathlib.Path(core.__file__)
    info = rnncore.build_info()
    print(f"rnncore {rnncore.__version__}: {module.name} in {module.parent}")
    print(f"  devices {info['devices']}, kernels {info['kernels']}, BLAS {info['blas']}")
    failures = []
    if (module.parent.parent / "pyproject.toml").exists() or "site-packages" not in str(module):
        failures.append(f"{module} is not an installed module")
    abi3 = ".abi3." in module.name
    if abi3 != (sys.version_info >= (3, 12)):
        failures.append(f"{module.name}: stable ABI is for CPython 3.12 and later only")
    if sys.platform.startswith("linux"):
        # numpy's own OpenBLAS is libscipy_openblas64_; rnncore's is the 32-bit-index one.
        maps = pathlib.Path("/proc/self/maps").read_text().splitlines()
        libs = {ln.split()[-1] for ln in maps if "libscipy_openblas.so" in ln}
        print(f"  OpenBLAS {sorted(libs)}")
        if not libs or not all("/scipy_openblas32/" in p for p in libs):
            failures.append(f"OpenBLAS is not the scipy-openblas32 package's: {sorted(libs)}")
    if sys.platform == "darwin" and platform.machine() == "arm64":
        x = np.zeros((1, 1, 1), np.float32)
        try:
            rnncore.single_gate_rnn(x, x[0], device="metal")
        except RuntimeError as e:
            print(f"  metal: {e}")
            if "has no Metal backend" in str(e):
                failures.append("a macOS arm64 wheel without the Metal backend")
    for f in failures:
        print("FAIL:", f)
    print("wheel check:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

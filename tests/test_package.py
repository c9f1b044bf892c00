"""What the wheel ships besides the module: generated type stubs, py.typed, the names of
docs/api.md (and only those in dir(rnncore)), and runnable examples."""

import ast
import inspect
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import rnncore
from rnncore._ops import KINDS

PKG = pathlib.Path(rnncore.__file__).parent
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples" / "python"

# Per kind: the descriptor, the forward and gradient functions and their result types.
API = ["Activation", "devices"]
for _k in KINDS.values():
    API += [_k.descriptor, _k.forward, _k.gradients]
    API += [_k.result.__name__, _k.gradient_result.__name__]


def test_api_names_exist():
    missing = [name for name in API if not hasattr(rnncore, name)]
    assert not missing
    assert set(API) <= set(rnncore.__all__)


def test_dir_shows_only_the_public_api():
    assert dir(rnncore) == sorted(rnncore.__all__)
    for private in ("_core", "_ops", "np", "NamedTuple", "Optional", "ArrayLike"):
        assert private not in dir(rnncore)


def test_results_are_the_ops_types():
    for k in KINDS.values():
        assert getattr(rnncore, k.result.__name__) is k.result
        assert getattr(rnncore, k.gradient_result.__name__) is k.gradient_result


@pytest.mark.parametrize(
    "op", [f for k in KINDS.values() for f in (k.forward, k.gradients)], ids=str
)
def test_wrappers_pass_each_array_to_its_own_parameter(op):
    """The wrappers pass _core its arrays by position: each must reach the parameter of its
    name. A non-array in one of them (the others all arrays) is refused by that name."""
    kind = next(k for k in KINDS.values() if op in (k.forward, k.gradients))
    fn = getattr(rnncore, op)
    params = inspect.signature(fn).parameters
    arrays = [p for p in params if p not in ("sequence_lengths", "descriptor", "device")]
    assert len(arrays) >= 6
    for name in arrays:
        args = {p: np.zeros(1, np.float32) for p in arrays}
        args[name] = "not an array"
        with pytest.raises(TypeError, match=rf"^\[{op}\] {name} must be an array"):
            fn(**args, descriptor=getattr(rnncore, kind.descriptor)())


def test_stubs_are_shipped_and_describe_the_module():
    assert (PKG / "py.typed").exists()
    stub = (PKG / "_core.pyi").read_text()
    tree = ast.parse(stub)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    core_api = {"Activation", "RNNDescriptor", "LSTMDescriptor", "GRUDescriptor", "gru"}
    assert core_api <= defined
    assert "lstm_gradients" in defined and "devices" in defined


@pytest.mark.parametrize("script", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_example_runs(script):
    for module in ("torch", "keras", "onnx", "onnxruntime"):
        if f"import {module}" in script.read_text():
            pytest.importorskip(module)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr

"""What the wheel ships besides the module: generated type stubs, py.typed, the names of
api.md, and runnable examples."""

import ast
import pathlib
import subprocess
import sys

import pytest

import rnncore

PKG = pathlib.Path(rnncore.__file__).parent
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples" / "python"

API = [
    "Activation",
    "RNNDescriptor",
    "LSTMDescriptor",
    "GRUDescriptor",
    "single_gate_rnn",
    "lstm",
    "gru",
    "single_gate_rnn_gradients",
    "lstm_gradients",
    "gru_gradients",
    "devices",
]


def test_api_names_exist():
    missing = [name for name in API if not hasattr(rnncore, name)]
    assert not missing
    assert set(API) <= set(rnncore.__all__)


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
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr

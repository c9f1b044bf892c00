"""The README and docs/ are checked like code: every Python block runs, every C++ block is a
complete program (compiled and run by ctest, cmake/doc_examples.cmake), every shell command
of rnncore's CLI exists with its flags, every documented signature is the function's, every
public name is documented, and no file in the repository refers to a file that is not in it.
"""

import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import rnncore

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = (
    "README.md",
    "docs/api.md",
    "docs/semantics.md",
    "docs/sanitizers.md",
    "docs/performance.md",
)
# Languages a fenced block may have: run, compiled, checked, or program output / equations.
LANGUAGES = {"python", "cpp", "sh", "cmake", "text"}


def blocks(doc):
    """(language, code, line) of every fenced block of `doc`."""
    text = (ROOT / doc).read_text()
    found = []
    for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.M | re.S):
        found.append((m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1))
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_block_has_a_checked_language(doc):
    for lang, _, line in blocks(doc):
        assert lang in LANGUAGES, f"{doc}:{line}: block language {lang!r} not in {LANGUAGES}"


@pytest.mark.parametrize("doc", DOCS)
def test_python_blocks_run(doc, capsys):
    """A document's Python blocks run in order in one namespace, as a reader would."""
    namespace = {"__name__": f"doc_{pathlib.Path(doc).stem}"}
    for lang, code, line in blocks(doc):
        if lang == "python":
            exec(compile(code, f"{doc}:{line}", "exec"), namespace)


def test_cpp_blocks_are_compiled_programs():
    cmake = (ROOT / "cmake" / "doc_examples.cmake").read_text()
    for doc in DOCS:
        for lang, code, line in blocks(doc):
            if lang == "cpp":
                assert re.search(r"\bint main\(", code), f"{doc}:{line}: not a complete program"
                assert doc in cmake, f"{doc} has C++ blocks that cmake/doc_examples.cmake skips"


def norm(line):
    """A CMake line with its target's name as in any consumer."""
    return re.sub(r"\b(app|gru_example)\b", "TARGET", line.strip())


def test_cmake_blocks_are_the_examples():
    example = (ROOT / "examples" / "cpp" / "CMakeLists.txt").read_text()
    example_lines = {norm(ln) for ln in example.splitlines()}
    for doc in DOCS:
        for lang, code, line in blocks(doc):
            if lang == "cmake":
                for ln in code.splitlines():
                    if ln.strip() and not ln.strip().startswith("#"):
                        assert norm(ln) in example_lines, (
                            f"{doc}:{line}: {ln.strip()!r} is not in examples/cpp/CMakeLists.txt"
                        )


def cli_help(command):
    out = subprocess.run(
        [sys.executable, "-m", "rnncore", command, "--help"],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert out.returncode == 0, f"python -m rnncore {command} --help: {out.stderr}"
    return out.stdout


def test_cli_commands_in_docs_exist():
    seen = set()
    for doc in DOCS:
        for lang, code, _ in blocks(doc):
            if lang != "sh":
                continue
            for m in re.finditer(r"python -m rnncore (\w+)([^\n#]*)(?:#([^\n]*))?", code):
                command, args, comment = m.group(1), m.group(2), m.group(3) or ""
                help_text = cli_help(command)
                for flag in re.findall(r"(?<![\w-])(--[\w-]+)", args + " " + comment):
                    assert flag in help_text, f"{doc}: python -m rnncore {command} has no {flag}"
                seen.add(command)
    assert {"demo", "check", "info", "bench"} <= seen


def documented_signatures():
    text = (ROOT / "docs" / "api.md").read_text()
    return re.findall(r"^#+ `rnncore\.(\w+)\((.*)\)`$", text, re.M)


def test_documented_signatures_are_the_functions():
    found = documented_signatures()
    assert {name for name, _ in found} == {
        "single_gate_rnn",
        "lstm",
        "gru",
        "single_gate_rnn_gradients",
        "lstm_gradients",
        "gru_gradients",
    }
    for name, params in found:
        actual = inspect.signature(getattr(rnncore, name))
        documented = inspect.signature(eval(f"lambda {params}: None", {"None": None}))
        assert parameters(documented) == parameters(actual), (
            f"docs/api.md documents rnncore.{name}({params}) but it is {name}{actual}"
        )


def parameters(signature):
    """Positional parameters in order, keyword-only ones by name (their order is free)."""
    ps = signature.parameters.values()
    kw = inspect.Parameter.KEYWORD_ONLY
    return (
        [(p.name, p.kind, p.default) for p in ps if p.kind != kw],
        {p.name: p.default for p in ps if p.kind == kw},
    )


def test_public_names_and_fields_are_documented():
    api = (ROOT / "docs" / "api.md").read_text()
    for name in rnncore.__all__:
        assert re.search(rf"\b{re.escape(name)}\b", api), f"rnncore.{name} is not in docs/api.md"
    for cls in (rnncore.RNNDescriptor, rnncore.LSTMDescriptor, rnncore.GRUDescriptor):
        for field in cls._fields:
            assert f"`{field}`" in api, f"{cls.__name__}.{field} is not in docs/api.md"
    for member in rnncore.Activation:
        assert f"`{member.name}`" in api


# ---- references to files -----------------------------------------------------------------

# Names that are generated, external or placeholders, not files of the repository.
NOT_FILES = {
    "rnncore.metallib",
    "_core.pyi",
    "rnncoreTargets.cmake",
    "app.cpp",
    "a.metal",
    "b.metal",
    "extra.metal",
    "mx.metal",
    "wheel.py",  # scikit-build-core's wheel.py-api setting
}


def tracked_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def test_no_reference_to_a_missing_file():
    """Paths (`docs/semantics.md`, `../examples/cpp`) and file names (`kernel_params.h`) in any
    tracked file name files of the repository; a path in another project is a URL."""
    files = tracked_files()
    tops = sorted({f.split("/")[0] for f in files if "/" in f} | {"shared", "spec"})
    path = re.compile(
        r"(?<![\w/.\-])((?:\.\./)*(?:" + "|".join(map(re.escape, tops)) + r")/[\w./\-]*[\w\-])"
    )
    bare = re.compile(
        r"(?<![\w/.\-<])([A-Za-z_][\w\-]*\.(?:md|py|cpp|hpp|metal|cmake|toml|yml|metallib|pyi))\b"
    )
    names = {pathlib.PurePath(f).name for f in files}
    missing = []
    for f in files:
        p = ROOT / f
        if p.suffix in {".png", ".json"} or f.startswith("bench/results/") or not p.exists():
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for m in path.finditer(line):
                ref = m.group(1)
                after = line[m.end() : m.end() + 1]
                if any(c in ref + after for c in "*{<$") or ref.startswith("build/"):
                    continue
                if not ((ROOT / ref).exists() or (p.parent / ref).exists()):
                    missing.append(f"{f}:{i}: {ref}")
            if f.startswith("tests/"):
                continue  # tests write files of their own names
            for m in bare.finditer(line):
                if m.group(1) not in names and m.group(1) not in NOT_FILES:
                    missing.append(f"{f}:{i}: {m.group(1)}")
    assert not missing, "references to files that are not in the repository:\n" + "\n".join(missing)

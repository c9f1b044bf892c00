"""docs/ ships the contract and the API with the package's source; they must stay the
project's (shared/spec/, beside the repository when it is checked out for development)."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "spec"


@pytest.mark.parametrize("name", ["semantics.md", "api.md"])
def test_docs_match_the_contract(name):
    shared = SHARED / name
    if not shared.exists():
        pytest.skip("shared/spec is not beside this checkout")
    assert (ROOT / "docs" / name).read_text() == shared.read_text(), (
        f"docs/{name} is stale: copy {shared} over it"
    )

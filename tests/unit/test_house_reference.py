"""The generated Packages and Python client pages (docs/reference_gen): the import graph
shows worker/ as five packages with no import back up, and every public function of the
stable client is on its page."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module", autouse=True)
def _reference_gen_importable() -> None:
    sys.path.insert(0, str(DOCS))


LAYERS = ["worker.cli", "worker.engine", "worker.api", "worker.client", "worker.ops", "runtime", "schema"]


def test_the_import_graph_has_worker_as_five_packages_importing_only_downwards() -> None:
    from reference_gen import packages

    import worker

    found = packages.imports()
    below = {p: set(LAYERS[i + 1:]) for i, p in enumerate(LAYERS)}
    below["worker.engine"].discard("worker.api")  # the two sit side by side
    assert sorted(p.name for p in Path(worker.__file__).parent.iterdir() if (p / "__init__.py").exists()) == [
        "api", "cli", "client", "engine", "ops",
    ]
    for package, imported in found.items():
        assert imported <= below[package], (package, imported - below[package])
    assert "worker.client" in found["worker.engine"] and "worker.ops" in found["worker.client"]
    page = packages.page()
    for package in LAYERS:
        assert f"| `{package}` |" in page


def test_the_python_client_page_shows_every_public_function_and_says_it_is_stable() -> None:
    from reference_gen import python_client

    import worker.client as client

    page = python_client.page()
    names = [name for name, _ in python_client.functions()]
    assert {"submit", "status", "cancel", "wait", "events", "approve", "reject", "tool_result"} <= set(names)
    assert "A stable API." in page
    for name in names:
        assert f"## `{name}`" in page
        assert getattr(client, name).__doc__, f"worker.client.{name} has no docstring"

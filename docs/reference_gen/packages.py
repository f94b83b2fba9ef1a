"""Reference of the code's packages and the imports between them, read from the import
graph of the tree (grimp, the library import-linter runs on): who each package serves
(its docstring) and which packages it imports. Kept true by the contracts in pyproject.toml."""

from __future__ import annotations

import importlib
import inspect

from reference_gen import cell, code, header, table

# The top-level packages, and inside worker/ its five, top first.
PACKAGES = ("worker.cli", "worker.engine", "worker.api", "worker.client", "worker.ops", "runtime", "schema")


def _owner(module: str) -> str | None:
    return next((p for p in PACKAGES if module == p or module.startswith(p + ".")), None)


def imports() -> dict[str, set[str]]:
    """For each package, the other packages its modules import (under TYPE_CHECKING too)."""
    import grimp

    graph = grimp.build_graph("worker", "runtime", "schema", cache_dir=None)
    found: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for module in graph.modules:
        source = _owner(module)
        if source is None:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            target = _owner(imported)
            if target is not None and target != source:
                found[source].add(target)
    return found


def page() -> str:
    text = header(
        "Packages",
        "the import graph of `worker`, `runtime` and `schema` (grimp) and each package's docstring",
        "Imports run one way: `worker` over `runtime` over `schema`, and inside `worker` the command line over "
        "the Celery worker and the HTTP API (which never import each other), over the Python client, over "
        "operations. `make lint` (import-linter) fails on an import back up.",
    )
    found = imports()
    rows = []
    for package in PACKAGES:
        doc = inspect.getdoc(importlib.import_module(package)) or ""
        serves = doc.split("\n\n")[0]
        rows.append([code(package), cell(serves), ", ".join(code(p) for p in PACKAGES if p in found[package])])
    return text + table(["package", "who it serves and what it may import", "imports"], rows)

"""The project's metadata: setuptools builds it without a deprecation warning, and every
package the code imports is one it declares (an import that works only because another
dependency happens to bring it in breaks when that one stops doing so)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from tests.support.env import REPO

OWN = ("runtime", "schema", "worker")
# A module imported only by a plugin of the program that provides it: pytest loads our pytest
# plugin (``-p worker.client.replay.pytest_plugin``), so it is there whenever the plugin is.
HOSTED = {"pytest": "worker/client/replay/pytest_plugin.py"}
WARNING = re.compile(r"warning|deprecat", re.IGNORECASE)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {canonical(re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0]) for spec in project["dependencies"]}


def imported() -> dict[str, str]:
    """Each top-level module the packages import (absolutely), with one file importing it."""
    found: dict[str, str] = {}
    for package in OWN:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.partition(".")[0], str(path.relative_to(REPO)))
    return found


def _importers(module: str) -> set[str]:
    """Every file of the packages that imports ``module``."""
    found = set()
    for package in OWN:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                if any(name.partition(".")[0] == module for name in names):
                    found.add(str(path.relative_to(REPO)))
    return found


def test_every_imported_package_is_the_standard_library_our_own_or_declared() -> None:
    distributions = packages_distributions()
    undeclared = {}
    for module, where in imported().items():
        if module in sys.stdlib_module_names or module in OWN:
            continue
        if HOSTED.get(module) == where and _importers(module) == {where}:
            continue
        dists = {canonical(d) for d in distributions.get(module, [])}
        if not dists & declared():
            undeclared[module] = (sorted(dists), where)
    assert undeclared == {}, f"imported but not declared in [project].dependencies: {undeclared}"


def test_setuptools_reads_the_metadata_without_a_warning(tmp_path: Path) -> None:
    # A copy: the build writes aidawork.egg-info beside pyproject.toml. pip's own isolated
    # build environment, with the setuptools that [build-system] asks for; -v shows the
    # backend's output, where setuptools prints its warnings.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in OWN:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "-v", str(source)],
        capture_output=True, text=True, timeout=120,
    )
    out = built.stdout + built.stderr
    assert built.returncode == 0, out[-3000:]
    assert "Would install aidawork" in out, out[-3000:]
    assert [line for line in out.splitlines() if WARNING.search(line)] == []

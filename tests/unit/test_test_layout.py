"""What tests share lives in tests/support: no test module imports another test module or a
conftest (a helper found in one would make that file a dependency of others)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def _is_test_or_conftest(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return module.startswith(".") or last == "conftest" or last.startswith("test_")


def test_no_test_imports_another_test_module_or_a_conftest() -> None:
    offenders = [
        f"{path.relative_to(TESTS)}: {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for module in _imported_modules(path)
        if _is_test_or_conftest(module)
    ]
    assert offenders == []


def test_the_check_sees_such_an_import(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text("from tests.unit.test_provider_openai import request\nfrom tests.conftest import x\n")
    assert [m for m in _imported_modules(sample) if _is_test_or_conftest(m)] == [
        "tests.unit.test_provider_openai",
        "tests.conftest",
    ]

"""The docs tier's summary: its examples' results per kind, and every block skipped by a
``<!-- docs-test: skip: REASON -->`` marker, with the reasons.

Each block's test carries its block in its reports' user properties (``DOCS_BLOCK``, set by
tests/docs/conftest.py): pytest-xdist sends them to the controlling process, which prints
the summary (tests/conftest.py's hooks call ``record`` and ``write``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

DOCS_BLOCK = "docs_block"  # the user property of a block's test: {id, kind, info, skip}

_outcomes: dict[str, tuple[dict[str, Any], str]] = {}  # node id -> (block, passed / failed / skipped)


def record(report: pytest.TestReport) -> None:
    block: dict[str, Any] | None = dict(report.user_properties).get(DOCS_BLOCK)  # type: ignore[assignment]
    if block is None:
        return
    seen = _outcomes.get(report.nodeid, (block, ""))[1]
    if report.failed:
        _outcomes[report.nodeid] = (block, "failed")
    elif report.skipped and seen != "failed":
        _outcomes[report.nodeid] = (block, "skipped")
    elif report.when == "call" and report.passed:
        _outcomes[report.nodeid] = (block, "passed")


def write(terminalreporter: Any) -> None:
    if not _outcomes:
        return
    counts: Counter[tuple[str, str]] = Counter()
    for block, outcome in _outcomes.values():
        counts[(block["kind"] or "?", outcome)] += 1
    tr = terminalreporter
    tr.write_sep("=", "docs examples (README.md, docs/)")
    for kind in ("python", "sh", "console", "json"):
        row = {o: counts[(kind, o)] for o in ("passed", "failed", "skipped")}
        if any(row.values()):
            tr.write_line(f"{kind:8} {row['passed']:3} passed  {row['failed']:3} failed  {row['skipped']:3} skipped")
    skipped = [b for b, o in _outcomes.values() if o == "skipped" and b["skip"]]
    tr.write_line(f"{len(skipped)} block(s) skipped by a docs-test marker" + (":" if skipped else ""))
    for block in skipped:
        tr.write_line(f"  {block['id']} [{block['info']}]: {block['skip']}")
    failed = [b for b, o in _outcomes.values() if o == "failed"]
    if failed:
        tr.write_line(f"{len(failed)} block(s) failed: " + ", ".join(b["id"] for b in failed))

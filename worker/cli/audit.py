"""``aidawork audit`` (``schema.store.audit``): every run's boundaries, fences, messages, events
and model-call ledger checked against each other, read-only, in one snapshot; each
inconsistency printed with its check's code, the run and the boundary. Exit 0: no error
(warnings allowed); 1: an error was found; 2: bad input (an unknown ``--run``)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

import typer

from schema.wire.audit import AuditReport
from worker.ops.settings import get_settings

EXIT_CLEAN, EXIT_FOUND = 0, 1
COLUMNS = ("severity", "check", "run", "boundary", "message")


def describe(report: AuditReport) -> list[str]:
    """The human lines: a table of the problems (if any), then the verdict."""
    lines = []
    if report.problems:
        cells = [
            (p.severity.value, p.check, str(p.run_id or "-"), "-" if p.boundary_seq is None else str(p.boundary_seq),
             p.message)
            for p in report.problems
        ]
        widths = [max(len(row[i]) for row in [COLUMNS, *cells]) for i in range(len(COLUMNS) - 1)]
        for row in [tuple(c.upper() for c in COLUMNS), *cells]:
            lines.append("  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]]))
    verdict = "clean" if report.clean else f"{report.errors} error(s)"
    if report.warnings:
        verdict += f", {report.warnings} warning(s)"
    lines.append(f"{report.runs_checked} run(s) checked: {verdict}")
    return lines


def cmd_audit(
    run: Annotated[UUID | None, typer.Option("--run", metavar="RUN_ID", help="check this run only")] = None,
    owner: Annotated[str | None, typer.Option("--owner", metavar="OWNER", help="check this owner's runs only")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON (for scripts)")] = False,
) -> int:
    from schema.store.audit import audit
    from worker.client.context import engine_for

    engine = engine_for(get_settings(), threads=1)
    try:
        report = audit(engine, run_id=run, owner=owner)  # an unknown --run: RunNotFound, exit 2
    finally:
        engine.dispose()
    print(report.model_dump_json(indent=2) if as_json else "\n".join(describe(report)))
    return EXIT_CLEAN if report.clean else EXIT_FOUND

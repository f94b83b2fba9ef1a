"""Reads for the operator's metrics and traces: runs by status (``aidawork_runs``) and the
trace context a run was submitted with."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Engine, text


def count_runs_by_status(engine: Engine) -> dict[str, int]:
    """How many runs are in each status (``aidawork_runs``; the API caches it briefly)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) AS n FROM runs GROUP BY status"))
        return {r.status: int(r.n) for r in rows}


def run_trace_context(engine: Engine, run_id: UUID) -> str | None:
    """The W3C traceparent stored with the run at submit (None: not traced, or no run)."""
    with engine.connect() as conn:
        value = conn.execute(text("SELECT trace_context FROM runs WHERE id = :id"), {"id": run_id}).scalar_one_or_none()
    return None if value is None else str(value)

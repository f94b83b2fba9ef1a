"""Reading rows, and waiting for them: what the tests observe of a run is in PostgreSQL."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, text

from tests.support.env import WAIT_S
from tests.support.wait import wait_until
from worker.engine.bootstrap import WorkerContext


def rows(engine: Engine, sql: str, **params: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]


def run_row(engine: Engine, run_id: UUID) -> dict[str, Any]:
    return rows(engine, "SELECT * FROM runs WHERE id = :id", id=run_id)[0]



def wait_terminal(engine: Engine, run_id: UUID, *, timeout_s: float = WAIT_S) -> dict[str, Any]:
    """Wait until the run has ended; returns its row."""

    def ended() -> dict[str, Any] | None:
        row = run_row(engine, run_id)
        return row if row["status"] in ("completed", "failed", "cancelled") else None

    return wait_until(ended, timeout_s=timeout_s, what=f"run {run_id} to end")  # type: ignore[no-any-return]



def round_rows(engine: Engine, run_id: UUID) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM rounds WHERE run_id = :id ORDER BY boundary_seq", id=run_id)



def model_calls(engine: Engine, run_id: UUID) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM model_calls WHERE run_id = :id ORDER BY id", id=run_id)



def calls_per_boundary(engine: Engine, run_id: UUID) -> dict[int, int]:
    out: dict[int, int] = {}
    for call in model_calls(engine, run_id):
        out[call["boundary_seq"]] = out.get(call["boundary_seq"], 0) + 1
    return out



def wait_model_call_succeeded(
    engine: Engine, run_id: UUID, boundary_seq: int, *, timeout_s: float = WAIT_S
) -> dict[str, Any]:
    """Wait until the ledger says the model call of this round returned (the round is now
    in its tools)."""

    def done() -> dict[str, Any] | None:
        found = rows(
            engine,
            "SELECT * FROM model_calls WHERE run_id = :id AND boundary_seq = :b AND status = 'succeeded'",
            id=run_id,
            b=boundary_seq,
        )
        return found[0] if found else None

    return wait_until(
        done,
        timeout_s=timeout_s,
        interval_s=0.02,  # type: ignore[no-any-return]
        what=f"the model call of round {boundary_seq} to succeed",
    )


def wait_suspended(engine: Engine, run_id: UUID, boundary_seq: int = 0) -> dict[str, Any]:
    def suspended() -> dict[str, Any] | None:
        row = run_row(engine, run_id)
        assert row["status"] not in ("completed", "failed", "cancelled"), row
        return row if (row["status"], row["boundary_seq"]) == ("suspended", boundary_seq) else None

    return wait_until(suspended, timeout_s=WAIT_S, what=f"run {run_id} to suspend at round {boundary_seq}")  # type: ignore[no-any-return]


def all_rows_as_text(ctx: WorkerContext) -> dict[str, str]:
    """Every row of every table in the test database, as PostgreSQL's text form."""
    tables = [
        r["table_name"]
        for r in rows(ctx.engine, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
    ]
    out = {}
    with ctx.engine.connect() as conn:
        for table in tables:
            out[table] = "\n".join(r[0] for r in conn.execute(text(f'SELECT t::text FROM "{table}" t')))
    return out


def observed(ctx: Any, claim: Any) -> Any:
    """What ``execute_round`` hands ``run_claimed`` for a claim a test made itself."""
    return ctx.observe.claimed(claim, time.time_ns(), resume=False)

"""Runs in every state, with a row in every table a run or Root owns, for the retention tests."""

from __future__ import annotations

from dataclasses import replace
from itertools import count
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine, text

from schema.store import runs as run_store
from schema.store.retention import TABLES
from schema.store.runs import Submitted
from schema.store.store import Store
from schema.wire.claim import Claim
from schema.wire.record import MessageRecord
from tests.support.store import claim, record, submit

_anchors = count(1)

# The rows of one Root in each table (the column that leads to it).
_ROOT_ROWS = {
    "runtime_work_model_rebuild_consumptions": (
        "build_id IN (SELECT id FROM runtime_work_model_rebuilds WHERE root_id = :root)"
    ),
    "runtime_work_model_rebuilds": "root_id = :root",
    "messages": "root_id = :root",
    "runs": "root_id = :root",
    "roots": "id = :root",
}
_BY_RUN = "run_id IN (SELECT id FROM runs WHERE root_id = :root)"


def root_rows(engine: Engine, root_id: UUID) -> dict[str, int]:
    """How many rows of each table belong to the Root."""
    with engine.connect() as conn:
        return {
            t: int(conn.execute(text(f"SELECT count(*) FROM {t} WHERE {_ROOT_ROWS.get(t, _BY_RUN)}"),
                                {"root": root_id}).scalar_one())
            for t in TABLES
        }


def table_rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in TABLES}


def fill_every_table(engine: Engine, run_id: UUID, *, webhook: str = "delivered") -> None:
    """One more row of the run in each table a round would fill in the course of things
    (tool calls, local reads, answers, executions, the ledger, a webhook delivery, a
    rebuild and its consumption, a message)."""
    build_id = uuid4()
    with engine.begin() as conn:
        root_id = conn.execute(text("SELECT root_id FROM runs WHERE id = :id"), {"id": run_id}).scalar_one()
        p: dict[str, Any] = {"run": run_id, "root": root_id, "build": build_id, "anchor": next(_anchors)}
        for sql in (
            "INSERT INTO tool_invocations (run_id, boundary_seq, tool_call_id, tool_name, args, args_digest, status,"
            " claim_fence) VALUES (:run, 0, 'fill', 'echo', '{}', 'd', 'completed', 1)",
            "INSERT INTO local_reads (run_id, tool_call_id, path, content, digest, size_bytes)"
            " VALUES (:run, 'fill', 'a.txt', 'x', 'd', 1)",
            "INSERT INTO prerequisites (run_id, key, value) VALUES (:run, 'fill', '1')",
            "INSERT INTO tool_answers (run_id, invocation_id, tool_call_id, kind, value)"
            " VALUES (:run, 'fill-' || :run, 'fill', 'result', '1')",
            "INSERT INTO tool_executions (run_id, tool_call_id, boundary_seq, claim_fence) VALUES (:run, 'fill', 0, 1)",
            "INSERT INTO model_calls (run_id, boundary_seq, attempt, claim_fence, status, request_digest)"
            " VALUES (:run, 0, 1, 1, 'succeeded', 'req')",
            "INSERT INTO runtime_work_model_rebuilds (id, root_id, chain_anchor, ordinal, run_id, boundary_seq,"
            " claim_fence) VALUES (:build, :root, :anchor, 1, :run, 0, 1)",
            "INSERT INTO runtime_work_model_rebuild_consumptions (build_id, run_id, boundary_seq, claim_fence,"
            " source_digest) VALUES (:build, :run, 0, 1, 'd')",
            "INSERT INTO messages (root_id, position, run_id, boundary_seq, role, body, chain_digest)"
            " SELECT :root, coalesce(max(position), -1) + 1, :run, 0, 'user', '{\"role\": \"user\"}', 'd'"
            " FROM messages WHERE root_id = :root",
        ):
            conn.execute(text(sql), p)
        _webhook_delivery(conn, run_id, webhook)


def _webhook_delivery(conn: Connection, run_id: UUID, status: str) -> None:
    conn.execute(
        text(
            "INSERT INTO webhook_deliveries (run_id, event_seq, event_kind, status, next_attempt_at)"
            " SELECT :run, coalesce(max(event_seq), 0) + 100, 'run_completed', :status,"
            " CASE WHEN :status = 'pending' THEN now() END FROM webhook_deliveries WHERE run_id = :run"
        ),
        {"run": run_id, "status": status},
    )


def age(engine: Engine, run_id: UUID, days: float) -> None:
    """Make the (ended) run look as if it ended ``days`` ago."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE runs SET finished_at = now() - make_interval(secs => :s) WHERE id = :id"),
            {"id": run_id, "s": days * 86_400},
        )


def finish(engine: Engine, c: Claim, *, first_position: int = 0) -> None:
    """Commit the claimed round as the run's last (completed), its two messages at
    ``first_position`` and after in its Root."""
    rec = record(c)
    messages = tuple(MessageRecord(first_position + i, m.body, m.chain_digest) for i, m in enumerate(rec.messages))
    Store(engine).commit_round(replace(rec, messages=messages))


def completed(engine: Engine, *, root_id: UUID | None = None, first_position: int = 0) -> Submitted:
    run = submit(engine, root_id=None if root_id is None else str(root_id))
    c = claim(engine, run.run_id)
    assert c is not None
    finish(engine, c, first_position=first_position)
    return run


def failed(engine: Engine, *, root_id: UUID | None = None) -> Submitted:
    run = submit(engine, root_id=None if root_id is None else str(root_id))
    c = claim(engine, run.run_id)
    assert c is not None
    Store(engine).fail_claimed_run(run.run_id, c.fence, "TEST_FAILED", "failed on purpose")
    return run


def cancelled(engine: Engine, *, root_id: UUID | None = None) -> Submitted:
    run = submit(engine, root_id=None if root_id is None else str(root_id))
    assert run_store.cancel_run(engine, run.run_id)[0]
    return run


def running(engine: Engine, *, root_id: UUID | None = None) -> tuple[Submitted, Claim]:
    run = submit(engine, root_id=None if root_id is None else str(root_id))
    c = claim(engine, run.run_id)
    assert c is not None
    return run, c


def suspended(engine: Engine) -> Submitted:
    run, _ = running(engine)
    # The status is what the prune reads; how a run comes to wait is tested elsewhere.
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET status = 'suspended', lease_expires_at = NULL WHERE id = :id"),
                     {"id": run.run_id})
    return run


"""Reads for the run inspector, scoped to an owner like ``schema.store.owners``: an
owner's runs (``list_runs``) and everything stored about one run's rounds
(``read_run_rows``): the rounds, the Root's messages up to the run's last, the tool calls
with their full outputs, and the model-call ledger. Pure reads; deciding what a round's
model saw (and checking its digest) is the caller's, with ``runtime.context``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from schema.store.bodies import message_body_sql
from schema.store.claims import DURABLE_READS_SQL
from schema.store.doubletext import ROLLED_BACK
from schema.store.errors import RunNotFound
from schema.wire.claim import LoadedMessage
from schema.wire.inspect import ModelCallRow, RunListItem, ToolCallRow

_LIST_SQL = """
SELECT r.id AS run_id, r.root_id, r.status, r.boundary_seq AS rounds, left(r.input, 200) AS input,
       r.created_at, r.finished_at,
       (SELECT count(*) FROM model_calls AS mc WHERE mc.run_id = r.id) AS model_calls
FROM runs AS r
WHERE r.owner = :owner {status}
ORDER BY r.created_at DESC, r.id
LIMIT :limit
"""
_LISTS = {False: text(_LIST_SQL.format(status="")), True: text(_LIST_SQL.format(status="AND r.status = :status"))}


def list_runs(engine: Engine, owner: str, *, status: str | None = None, limit: int = 50) -> list[RunListItem]:
    """``owner``'s runs, newest first, at most ``limit``; only those in ``status`` if given."""
    with engine.connect() as conn:
        rows = conn.execute(_LISTS[status is not None], {"owner": owner, "status": status, "limit": limit}).all()
    return [RunListItem.model_validate(dict(row._mapping)) for row in rows]


@dataclass(frozen=True)
class StoredMessage:
    run_id: UUID
    boundary_seq: int
    message: LoadedMessage


@dataclass(frozen=True)
class RunRows:
    """Everything stored about a run's rounds, as read in one snapshot."""

    status: str
    config: dict[str, Any]
    context_start: int
    summary: str | None
    checkpoint_boundary: int  # the round the current context (start, summary) was admitted at
    rebuilds: int
    rounds: list[dict[str, Any]]  # rounds rows (+ started_at), by boundary_seq
    messages: list[StoredMessage]  # the Root's messages up to the run's last, by position
    tool_calls: list[ToolCallRow]
    model_calls: list[ModelCallRow]
    # A later submit's root_policy rollback deleted the run's messages: what its rounds'
    # models saw can no longer be rebuilt (schema.store.doubletext).
    messages_dropped: bool = False


_RUN_SQL = text(
    """
SELECT r.status, r.config, cp.context_start_position, cp.summary, cp.boundary_seq AS cp_boundary, cp.rebuilds,
       r.root_id, r.error_code
FROM runs AS r JOIN run_checkpoints AS cp ON cp.run_id = r.id
WHERE r.id = :run_id AND r.owner = :owner
"""
)
# A round starts with its first model call, or (a call reused or none on record) at the
# commit of the round before it.
_ROUNDS_SQL = text(
    """
SELECT rd.boundary_seq, rd.outcome, rd.finish_reason, rd.messages_digest,
       coalesce(rd.resumed_at, rd.created_at) AS finished_at,
       coalesce((SELECT min(mc.started_at) FROM model_calls AS mc
                 WHERE mc.run_id = rd.run_id AND mc.boundary_seq = rd.boundary_seq),
                (SELECT p.created_at FROM rounds AS p
                 WHERE p.run_id = rd.run_id AND p.boundary_seq = rd.boundary_seq - 1)) AS started_at
FROM rounds AS rd WHERE rd.run_id = :run_id ORDER BY rd.boundary_seq
"""
)
_MESSAGES_SQL = text(
    f"""
SELECT m.run_id, m.boundary_seq, m.position, {message_body_sql()} AS body, {DURABLE_READS_SQL} AS reads
FROM messages AS m
WHERE m.root_id = :root_id AND m.position >= :start
  AND m.position <= (SELECT max(x.position) FROM messages AS x WHERE x.run_id = :run_id)
ORDER BY m.position
"""
)
_TOOLS_SQL = text(
    """
SELECT boundary_seq, tool_call_id, tool_name, tool_domain, args, status, result, suspension, approval, created_at
FROM tool_invocations WHERE run_id = :run_id ORDER BY boundary_seq, id
"""
)
_CALLS_SQL = text(
    """
SELECT boundary_seq, attempt, claim_fence, status, request_digest, response_digest, input_tokens, output_tokens,
       error_code, stale, started_at, finished_at
FROM model_calls WHERE run_id = :run_id ORDER BY boundary_seq, id
"""
)


def read_run_rows(engine: Engine, run_id: UUID, owner: str) -> RunRows:
    """The run's rounds and all they are made of; ``RunNotFound`` unless the run exists
    for ``owner``. One REPEATABLE READ transaction, so a round committing meanwhile is
    either wholly in the answer or not at all."""
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        run = conn.execute(_RUN_SQL, {"run_id": run_id, "owner": owner}).one_or_none()
        if run is None:
            raise RunNotFound(run_id)
        return _rows(conn, run_id, run)


def _rows(conn: Connection, run_id: UUID, run: Any) -> RunRows:
    params = {"run_id": run_id}
    messages = conn.execute(_MESSAGES_SQL, {**params, "root_id": run.root_id, "start": run.context_start_position})
    return RunRows(
        status=run.status,
        config=run.config,
        context_start=run.context_start_position,
        summary=run.summary,
        checkpoint_boundary=run.cp_boundary,
        rebuilds=run.rebuilds,
        rounds=[dict(row._mapping) for row in conn.execute(_ROUNDS_SQL, params)],
        messages=[
            StoredMessage(m.run_id, m.boundary_seq, LoadedMessage(m.position, m.body, m.reads)) for m in messages
        ],
        tool_calls=[ToolCallRow.model_validate(dict(row._mapping)) for row in conn.execute(_TOOLS_SQL, params)],
        model_calls=[ModelCallRow.model_validate(dict(row._mapping)) for row in conn.execute(_CALLS_SQL, params)],
        messages_dropped=run.error_code == ROLLED_BACK,
    )

"""Reads for ``aidawork export``: everything stored about one run that its case needs (the
run, its checkpoint, its rounds with their digests and proofs, the Root's messages up to
the run's last with their durable reads, its tool calls and the responses the model-call
ledger kept), in one REPEATABLE READ snapshot. Pure reads; the case is built by the caller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, text

from schema.store.bodies import message_body_sql
from schema.store.claims import DURABLE_READS_SQL
from schema.store.errors import RunNotFound
from schema.wire.claim import LoadedMessage
from schema.wire.json import JsonObject


@dataclass(frozen=True)
class CaseMessageRow:
    run_id: UUID
    boundary_seq: int
    message: LoadedMessage


@dataclass(frozen=True)
class CaseRows:
    run: dict[str, Any]  # runs columns + the checkpoint's context_start_position, summary, rebuilds
    rounds: list[dict[str, Any]]  # rounds rows, by boundary_seq
    messages: list[CaseMessageRow]  # the Root's messages from the checkpoint's start to the run's last
    tool_calls: list[dict[str, Any]]  # tool_invocations rows (+ answered), by round and order
    responses: list[tuple[int, str, JsonObject]]  # the ledger's (boundary_seq, response_digest, response)


_RUN_SQL = text(
    """
SELECT r.id, r.root_id, r.owner, r.status, r.input, r.config, r.agent, r.output, r.error_code,
       cp.context_start_position, cp.summary, cp.rebuilds
FROM runs AS r JOIN run_checkpoints AS cp ON cp.run_id = r.id
WHERE r.id = :run_id AND (CAST(:owner AS text) IS NULL OR r.owner = :owner)
"""
)
_ROUNDS_SQL = text(
    """
SELECT boundary_seq, claim_fence, outcome, finish_reason, system_digest, messages_digest, tools_digest,
       accepted_response_digest, proof
FROM rounds WHERE run_id = :run_id ORDER BY boundary_seq
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
# ``answered``: the call's result came from outside the worker (a client tool's result, an
# operator's word on an unknown outcome).
_TOOLS_SQL = text(
    """
SELECT ti.boundary_seq, ti.tool_call_id, ti.tool_name, ti.tool_domain, ti.args, ti.args_digest, ti.status,
       ti.result, ti.result_digest, ti.approval,
       EXISTS (SELECT 1 FROM tool_answers AS ta
               WHERE ta.run_id = ti.run_id AND ta.tool_call_id = ti.tool_call_id AND ta.kind = 'result') AS answered
FROM tool_invocations AS ti WHERE ti.run_id = :run_id ORDER BY ti.boundary_seq, ti.id
"""
)
_RESPONSES_SQL = text(
    """
SELECT boundary_seq, response_digest, response FROM model_calls
WHERE run_id = :run_id AND status = 'succeeded' AND response IS NOT NULL ORDER BY boundary_seq, id
"""
)


def read_case_rows(engine: Engine, run_id: UUID, owner: str | None = None) -> CaseRows:
    """The run's rows for its case; ``RunNotFound`` unless the run exists (for ``owner``,
    when given)."""
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        run = conn.execute(_RUN_SQL, {"run_id": run_id, "owner": owner}).one_or_none()
        if run is None:
            raise RunNotFound(run_id)
        params = {"run_id": run_id}
        messages = conn.execute(
            _MESSAGES_SQL, {**params, "root_id": run.root_id, "start": run.context_start_position}
        )
        return CaseRows(
            run=dict(run._mapping),
            rounds=[dict(row._mapping) for row in conn.execute(_ROUNDS_SQL, params)],
            messages=[
                CaseMessageRow(m.run_id, m.boundary_seq, LoadedMessage(m.position, m.body, m.reads)) for m in messages
            ],
            tool_calls=[dict(row._mapping) for row in conn.execute(_TOOLS_SQL, params)],
            responses=[(r.boundary_seq, r.response_digest, r.response) for r in conn.execute(_RESPONSES_SQL, params)],
        )

"""Forks: a new run on a new Root whose first rounds are its parent's, copied in one
REPEATABLE READ transaction (so a parent still running is read at one instant: its
committed rounds and the messages they wrote agree), and the per-round record of a run
that ``aidawork diff`` compares.

What a fork copies of rounds 1..N (boundary_seq 0..N-1): the rounds rows (fence 0, as
no claim of the fork wrote them; each proof re-signed for the fork's run id), the Root's
messages up to the end of round N (with each tool result in its message: a fork has no
``tool_invocations`` rows for them, and no ``model_calls`` or ``tool_executions`` rows
either: nothing of them ran again), the durable local reads they show, and the context
checkpoint. Messages of the parent's Root written by earlier runs become the fork's, at
``boundary_seq`` -1: context before its first round. The fork is queued at boundary N.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol
from uuid import UUID, uuid4

import structlog
from sqlalchemy import Connection, Engine, text

from schema.store.bodies import message_body_sql
from schema.store.claims import DURABLE_READS_SQL
from schema.store.doubletext import ROLLED_BACK
from schema.store.errors import ForkRefused, RunNotFound
from schema.store.routes import weight_sql
from schema.store.rows import StoredRow
from schema.store.tx import run_transaction
from schema.wire.claim import LoadedMessage, StoredRound
from schema.wire.forks import Forked, ForkPlan, RoundRecordView, RunRecordView, ToolResultEdit, ToolResultView
from schema.wire.json import JsonObject, JsonValue
from schema.wire.route import Route

log = structlog.get_logger("aidawork.forks")

# The boundary the messages of the parent's Root's earlier runs take in a fork.
BEFORE_FIRST_ROUND = -1


class ForkRules(Protocol):
    """The core's rules the copy applies (``runtime.forks.ForkRules``)."""

    def sign(self, run_id: UUID, boundary_seq: int, stored: StoredRound) -> str:
        """The proof of a copied round row under the fork's run id."""

    def chain(self, previous: str, message: LoadedMessage) -> str:
        """The chain digest of ``message`` after a history whose digest is ``previous``."""

    def with_result(self, body: JsonObject, result: JsonValue, is_error: bool) -> JsonObject:
        """A tool message's body with its result replaced."""


_PARENT_SQL = text(
    """
SELECT r.id, r.root_id, r.root_seq, r.input, r.config, r.priority, r.boundary_seq, r.agent, r.error_code,
       cp.context_start_position, cp.summary, cp.boundary_seq AS cp_boundary, cp.rebuilds
FROM runs AS r JOIN run_checkpoints AS cp ON cp.run_id = r.id
WHERE r.id = :id AND r.owner = :owner
"""
)

# The Root's messages up to the end of the parent's round N: the earlier runs' and the
# parent's own rounds before boundary N, with their tool results and durable reads.
_MESSAGES_SQL = text(
    f"""
SELECT m.run_id, m.boundary_seq, m.position, {message_body_sql()} AS body, {DURABLE_READS_SQL} AS reads,
       m.chain_digest
FROM messages AS m
WHERE m.root_id = :root
  AND ((m.run_id = :parent AND m.boundary_seq < :at_round)
       OR m.run_id IN (SELECT id FROM runs WHERE root_id = :root AND root_seq < :root_seq))
ORDER BY m.position
"""
)

_ROUNDS_SQL = text(
    """
SELECT boundary_seq, outcome, system_digest, messages_digest, tools_digest, accepted_response_digest,
       finish_reason, tool_fingerprint, repeat_count
FROM rounds WHERE run_id = :parent AND boundary_seq < :at_round ORDER BY boundary_seq
"""
)

_INSERT_RUN_SQL = text(
    "INSERT INTO runs (id, root_id, root_seq, owner, status, input, config, priority, boundary_seq, event_seq, "
    "  trace_context, agent, forked_from, forked_at_round) "
    "VALUES (:id, :root_id, 0, :owner, 'queued', :input, CAST(:config AS jsonb), :priority, :at_round, 1, "
    "  :trace_context, :agent, :parent, :at_round) "
    f"RETURNING {weight_sql('runs')} AS weight"
)

_INSERT_ROUND_SQL = text(
    "INSERT INTO rounds (run_id, boundary_seq, claim_fence, outcome, system_digest, messages_digest, tools_digest, "
    "  accepted_response_digest, finish_reason, tool_fingerprint, repeat_count, proof) "
    "VALUES (:run_id, :boundary_seq, 0, :outcome, :system_digest, :messages_digest, :tools_digest, "
    "  :accepted_response_digest, :finish_reason, :tool_fingerprint, :repeat_count, :proof)"
)

_INSERT_MESSAGE_SQL = text(
    "INSERT INTO messages (root_id, position, run_id, boundary_seq, role, body, chain_digest) "
    "VALUES (:root_id, :position, :run_id, :boundary_seq, :role, CAST(:body AS jsonb), :chain_digest)"
)

# The durable bodies of the copied read_files results (an edited result shows none).
_COPY_READS_SQL = text(
    """
INSERT INTO local_reads (run_id, tool_call_id, path, content, digest, size_bytes, delivered_at)
SELECT :run, lr.tool_call_id, lr.path, lr.content, lr.digest, lr.size_bytes, lr.delivered_at
FROM local_reads AS lr
JOIN messages AS m ON m.run_id = lr.run_id AND m.body->>'tool_call_id' = lr.tool_call_id
WHERE m.root_id = :root AND m.role = 'tool' AND m.body->>'name' = 'read_files'
  AND lr.tool_call_id IS DISTINCT FROM CAST(:edited AS text)
  AND ((m.run_id = :parent AND m.boundary_seq < :at_round)
       OR m.run_id IN (SELECT id FROM runs WHERE root_id = :root AND root_seq < :root_seq))
ON CONFLICT DO NOTHING
"""
)


def read_fork_source(engine: Engine, run_id: UUID, owner: str | None = None) -> tuple[str, JsonObject]:
    """The owner and the config of run ``run_id`` (what a fork's config starts from); with
    ``owner``, ``RunNotFound`` for another owner's run, as for a missing one."""
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT owner, config FROM runs WHERE id = :id AND (CAST(:owner AS text) IS NULL OR owner = :owner)"),
            {"id": run_id, "owner": owner},
        ).one_or_none()
    if row is None:
        raise RunNotFound(run_id)
    return str(row.owner), dict(row.config)


def _check_at_round(parent: StoredRow, at_round: int) -> None:
    committed = int(parent.boundary_seq)
    if not 0 <= at_round <= committed:
        raise ForkRefused(
            "at_round", f"run {parent.id} has {committed} committed rounds: fork at a round from 0 to {committed}"
        )
    if parent.error_code == ROLLED_BACK and at_round > 0:
        raise ForkRefused(
            "at_round", f"run {parent.id} was rolled back: its messages were dropped, so only at_round 0 can fork it"
        )
    # A rebuilt context replaced the one the rounds before it ran under, which is not kept:
    # a fork can start only where the parent's context is the one it has now.
    rebuilt_at = int(parent.cp_boundary)
    if parent.rebuilds and at_round <= rebuilt_at:
        raise ForkRefused(
            "at_round",
            f"run {parent.id}'s context was rebuilt in round {rebuilt_at + 1}: a fork can start after it, at a "
            f"round from {rebuilt_at + 1} to {committed}",
        )


def _edited_index(messages: Sequence[StoredRow], plan: ForkPlan, edit: ToolResultEdit) -> int:
    if plan.at_round == 0:
        raise ForkRefused("edit_tool_result", "at_round 0 copies no round: there is no tool result to edit")
    calls = [
        (i, str(m.body.get("tool_call_id")))
        for i, m in enumerate(messages)
        if m.run_id == plan.parent_id and m.boundary_seq == plan.at_round - 1 and m.body.get("role") == "tool"
    ]
    found = [i for i, call_id in calls if call_id == edit.tool_call_id]
    if not found:
        made = ", ".join(call_id for _, call_id in calls) or "none"
        raise ForkRefused(
            "edit_tool_result.tool_call_id",
            f"round {plan.at_round} made no tool call {edit.tool_call_id!r} (its calls: {made})",
        )
    return found[0]


def _fork_messages(
    messages: Sequence[StoredRow], plan: ForkPlan, rules: ForkRules, run_id: UUID, root_id: UUID
) -> list[dict[str, object]]:
    """The fork's message rows: the copies, the edited result (and every message after
    it chained anew), and the added user message."""
    edit = plan.tool_result
    edited = _edited_index(messages, plan, edit) if edit is not None else len(messages)
    out: list[dict[str, object]] = []
    previous = ""
    for i, m in enumerate(messages):
        body: JsonObject = dict(m.body)
        chain = str(m.chain_digest)
        if edit is not None and i == edited:
            body = rules.with_result(body, edit.result, edit.is_error)
        if i >= edited:
            chain = rules.chain(previous, LoadedMessage(int(m.position), body, None if i == edited else m.reads))
        boundary = m.boundary_seq if m.run_id == plan.parent_id else BEFORE_FIRST_ROUND
        out.append(_message_row(root_id, run_id, int(m.position), boundary, body, chain))
        previous = chain
    if plan.added_message is not None:
        position = int(messages[-1].position) + 1 if messages else 0
        chain = rules.chain(previous, LoadedMessage(position, plan.added_message, None))
        # It ends round N: the next round's model sees it after the round's last message.
        out.append(_message_row(root_id, run_id, position, plan.at_round - 1, plan.added_message, chain))
    return out


def _message_row(
    root_id: UUID, run_id: UUID, position: int, boundary_seq: int, body: JsonObject, chain: str
) -> dict[str, object]:
    return {
        "root_id": root_id, "run_id": run_id, "position": position, "boundary_seq": boundary_seq,
        "role": body.get("role"), "body": json.dumps(body), "chain_digest": chain,
    }


def _round_rows(conn: Connection, plan: ForkPlan, rules: ForkRules, run_id: UUID) -> list[dict[str, object]]:
    rows = []
    for r in conn.execute(_ROUNDS_SQL, {"parent": plan.parent_id, "at_round": plan.at_round}):
        stored = StoredRound(0, r.system_digest, r.messages_digest, r.tools_digest, r.accepted_response_digest, None)
        rows.append({**r._mapping, "run_id": run_id, "proof": rules.sign(run_id, r.boundary_seq, stored)})
    return rows


def fork_run_txn(conn: Connection, plan: ForkPlan, rules: ForkRules) -> Forked:
    """``fork_run`` on ``conn``, without committing."""
    parent = conn.execute(_PARENT_SQL, {"id": plan.parent_id, "owner": plan.owner}).one_or_none()
    if parent is None:
        raise RunNotFound(plan.parent_id)
    _check_at_round(parent, plan.at_round)
    where = {"root": parent.root_id, "parent": plan.parent_id, "at_round": plan.at_round, "root_seq": parent.root_seq}
    run_id, root_id = uuid4(), uuid4()
    messages = _fork_messages(conn.execute(_MESSAGES_SQL, where).all(), plan, rules, run_id, root_id)
    rounds = _round_rows(conn, plan, rules, run_id)
    # Every refusal is above: from here on, only writes.
    conn.execute(text("INSERT INTO roots (id, owner, next_run_seq) VALUES (:id, :owner, 1)"),
                 {"id": root_id, "owner": plan.owner})
    weight = conn.execute(
        _INSERT_RUN_SQL,
        {
            "id": run_id, "root_id": root_id, "owner": plan.owner, "config": json.dumps(plan.config),
            "input": parent.input if plan.input is None else plan.input, "priority": parent.priority,
            "at_round": plan.at_round, "trace_context": plan.trace_context, "agent": parent.agent,
            "parent": plan.parent_id,
        },
    ).scalar_one()
    # The parent's context checkpoint (its start and summary, from an earlier run of its
    # Root or a rebuild before the fork point); the chain of rebuilds starts anew.
    conn.execute(
        text(
            "INSERT INTO run_checkpoints (run_id, boundary_seq, context_start_position, summary) "
            "VALUES (:run, :boundary, :start, :summary)"
        ),
        {"run": run_id, "boundary": parent.cp_boundary if parent.rebuilds else 0,
         "start": parent.context_start_position, "summary": parent.summary},
    )
    if rounds:
        conn.execute(_INSERT_ROUND_SQL, rounds)
    if messages:
        conn.execute(_INSERT_MESSAGE_SQL, messages)
        edited = None if plan.tool_result is None else plan.tool_result.tool_call_id
        conn.execute(_COPY_READS_SQL, {**where, "run": run_id, "edited": edited})
    queued = {"root_id": str(root_id), "root_seq": 0, "forked_from": str(plan.parent_id),
              "forked_at_round": plan.at_round}
    conn.execute(
        text("INSERT INTO run_events (run_id, seq, kind, data) VALUES (:id, 1, 'run_queued', CAST(:data AS jsonb))"),
        {"id": run_id, "data": json.dumps(queued)},
    )
    return Forked(run_id, root_id, plan.parent_id, plan.at_round, Route(plan.owner, int(weight), int(parent.priority)))


def fork_run(engine: Engine, plan: ForkPlan, rules: ForkRules) -> Forked:
    """Store the fork ``plan`` describes, queued at boundary ``plan.at_round``, in one
    REPEATABLE READ transaction; or refuse it having stored nothing: ``RunNotFound`` (no
    such run for ``plan.owner``), ``ForkRefused`` (a round out of range, an edit naming
    no call of the round). The caller sends its first round only after this commits."""
    forked = run_transaction(
        engine, lambda conn: fork_run_txn(conn, plan, rules), name="fork_run", isolation_level="REPEATABLE READ"
    )
    log.info("run_forked", run_id=str(forked.run_id), parent=str(plan.parent_id), at_round=plan.at_round)
    return forked


# --- a run's record, round by round -------------------------------------------------------

_RECORD_RUN_SQL = text(
    "SELECT id, status, boundary_seq, forked_from, forked_at_round FROM runs "
    "WHERE id = :id AND (CAST(:owner AS text) IS NULL OR owner = :owner)"
)
_RECORD_ROUNDS_SQL = text(
    """
SELECT boundary_seq, outcome, system_digest, messages_digest, tools_digest, accepted_response_digest
FROM rounds WHERE run_id = :id AND boundary_seq < :committed ORDER BY boundary_seq
"""
)
_RECORD_MESSAGES_SQL = text(
    f"""
SELECT m.boundary_seq, m.role, {message_body_sql()} AS body FROM messages AS m
WHERE m.run_id = :id AND m.boundary_seq >= 0 AND m.boundary_seq < :committed AND m.role IN ('assistant', 'tool')
ORDER BY m.position
"""
)


def _record_of(conn: Connection, run_id: UUID, owner: str | None) -> RunRecordView:
    run = conn.execute(_RECORD_RUN_SQL, {"id": run_id, "owner": owner}).one_or_none()
    if run is None:
        raise RunNotFound(run_id)
    params = {"id": run_id, "committed": run.boundary_seq}
    responses: dict[int, JsonObject] = {}
    results: dict[int, list[ToolResultView]] = {}
    for m in conn.execute(_RECORD_MESSAGES_SQL, params):
        body = m.body
        if m.role == "assistant":
            responses[m.boundary_seq] = body
        else:
            results.setdefault(m.boundary_seq, []).append(
                ToolResultView(str(body.get("tool_call_id")), body.get("name"), body.get("result"),
                               body.get("is_error") is True)
            )
    rounds = tuple(
        RoundRecordView(
            boundary_seq=r.boundary_seq, outcome=r.outcome, system_digest=r.system_digest,
            messages_digest=r.messages_digest, tools_digest=r.tools_digest,
            accepted_response_digest=r.accepted_response_digest, response=responses.get(r.boundary_seq),
            tool_results=tuple(results.get(r.boundary_seq, ())),
        )
        for r in conn.execute(_RECORD_ROUNDS_SQL, params)
    )
    return RunRecordView(run.id, run.status, run.forked_from, run.forked_at_round, rounds)


def read_run_records(engine: Engine, run_ids: Sequence[UUID], *, owner: str | None = None) -> list[RunRecordView]:
    """Each run's committed rounds as stored (``RoundRecordView``), read in one REPEATABLE
    READ snapshot; with ``owner``, another owner's run is ``RunNotFound``, like a missing one."""
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        return [_record_of(conn, run_id, owner) for run_id in run_ids]

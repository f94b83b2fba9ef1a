"""Rounds: the model-call ledger and the one-statement, fenced commit of a round.

A round commits as a single statement (data-modifying CTEs): the fenced UPDATE of the
run, and inserts of the round row, its new messages, tool invocations and events that
each select from that UPDATE. A stale fence matches no run row, so nothing at all is
written, and the caller gets ``FenceLost``.
"""

from __future__ import annotations

import json
from dataclasses import fields
from uuid import UUID

from sqlalchemy import Connection, TextClause, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError

from schema import tables
from schema.store import budgets
from schema.store.bodies import without_result
from schema.store.doubletext import boundary_end_sql, interrupted_event_sql
from schema.store.errors import FenceLost, ToolCallIdReused
from schema.store.limits import next_runs, next_runs_sql
from schema.wire import EventKind
from schema.wire.json import JsonMapping, JsonObject
from schema.wire.record import Committed, EventRecord, MessageRecord, RoundRecord, ToolInvocationRecord

_ENDING = boundary_end_sql(":status", ":terminal", ":error_code", ":error_message")


def _commit_sql(round_row: str, tool_rows: str) -> TextClause:
    """The one-statement commit; a round inserts its round and tool rows, a resume
    completes the suspended ones in place. A run whose interrupt is pending ends here,
    cancelled, after the round (``schema.store.doubletext``): one more event, and the
    Root's turn handed on."""
    return text(
        f"""
WITH upd AS (
  UPDATE runs SET
    boundary_seq = boundary_seq + CASE WHEN :status = 'suspended' THEN 0 ELSE 1 END,
    status = {_ENDING["status"]}, lease_expires_at = NULL, round_attempts = 0, execution_fence = NULL,
    round_claims = 0, round_holders = CAST(ARRAY[] AS uuid[]),
    event_seq = event_seq + :n_events + CASE WHEN {_ENDING["interrupted"]} THEN 1 ELSE 0 END,
    dispatched_at = now(), updated_at = now(),
    output = :output, error_code = {_ENDING["error_code"]}, error_message = {_ENDING["error_message"]},
    finished_at = {_ENDING["finished_at"]}
  WHERE id = :run_id AND claim_fence = :fence AND boundary_seq = :boundary_seq AND status = 'running'
  RETURNING id, root_id, root_seq, owner, status, event_seq, error_message, {_ENDING["interrupted"]} AS interrupted,
    event_seq - :n_events - CASE WHEN {_ENDING["interrupted"]} THEN 1 ELSE 0 END AS first_event_seq
), freed AS (
  -- A run that stops running (suspends or ends) gives its owner's slot back in the same
  -- statement; an owner without a row has no counter to write.
  UPDATE owners SET running = owners.running - 1 FROM upd
  WHERE owners.owner = upd.owner AND upd.status <> 'running'
  RETURNING owners.owner, owners.max_running, owners.running
), round_row AS ({round_row}
), tool_rows AS ({tool_rows}
), message_rows AS (
  INSERT INTO messages (root_id, position, run_id, boundary_seq, role, body, chain_digest)
  SELECT upd.root_id, m.position, upd.id, :boundary_seq, m.body->>'role', m.body, m.chain_digest
  FROM upd, jsonb_to_recordset(CAST(:messages AS jsonb)) AS m(position int, body jsonb, chain_digest text)
), event_rows AS (
  INSERT INTO run_events (run_id, seq, kind, data)
  SELECT upd.id, upd.first_event_seq + e.ordinality, e.value->>'kind', e.value->'data'
  FROM upd, jsonb_array_elements(CAST(:events AS jsonb)) WITH ORDINALITY AS e(value, ordinality)
), interrupted_event AS ({interrupted_event_sql("upd")}
), spent_responses AS (
  -- Kept for a round redone before its commit; committed, it lives in the messages.
  UPDATE model_calls SET response = NULL FROM upd
  WHERE model_calls.run_id = upd.id AND model_calls.boundary_seq = :boundary_seq AND model_calls.response IS NOT NULL
)
-- The runs to start next: with a cap, the owner's next queued run (submission order) in
-- the slot this run gave back; when it ended, the Root's next run.
SELECT upd.id, upd.interrupted, {next_runs_sql("freed", "upd", ":terminal OR upd.interrupted")}
FROM upd
"""
    )


# The record's fields are the tool rows' columns, typed as in the table (a field that is
# no column, resumes_invocation_id, is text).
_TOOL_FIELDS = fields(ToolInvocationRecord)


def _sql_type(name: str) -> str:
    column = tables.tool_invocations.c.get(name)
    return "jsonb" if column is not None and isinstance(column.type, JSONB) else "text"


_TOOL_COLUMNS = "jsonb_to_recordset(CAST(:tools AS jsonb)) AS t({})".format(
    ", ".join(f"{f.name} {_sql_type(f.name)}" for f in _TOOL_FIELDS)
)
# The record's fields a round inserts as they are (the rest of a row comes from the claim).
_STORED_TOOL_FIELDS = [f.name for f in _TOOL_FIELDS if f.name in tables.tool_invocations.c]

COMMIT_ROUND_SQL = _commit_sql(
    round_row="""
  INSERT INTO rounds (run_id, boundary_seq, claim_fence, outcome, system_digest, messages_digest,
                      tools_digest, accepted_response_digest, tool_fingerprint, repeat_count, proof,
                      finish_reason)
  SELECT id, :boundary_seq, :fence, :outcome, :system_digest, :messages_digest, :tools_digest,
         :accepted_response_digest, :tool_fingerprint, :repeat_count, :proof, :finish_reason FROM upd""",
    tool_rows=f"""
  INSERT INTO tool_invocations (run_id, boundary_seq, claim_fence, {", ".join(_STORED_TOOL_FIELDS)})
  SELECT upd.id, :boundary_seq, :fence, {", ".join(f"t.{name}" for name in _STORED_TOOL_FIELDS)}
  FROM upd, {_TOOL_COLUMNS}""",
)

# A resume completes the suspended round and its suspended calls in place (guarded by
# their 'suspend' / 'suspended' state); a call that suspends again gets a new invocation
# id, fence and proof.
COMMIT_RESUME_SQL = _commit_sql(
    round_row="""
  UPDATE rounds SET outcome = :outcome, resume_fence = :fence,
    resumed_at = CASE WHEN :outcome <> 'suspend' THEN now() END
  FROM upd WHERE rounds.run_id = upd.id AND rounds.boundary_seq = :boundary_seq AND rounds.outcome = 'suspend'""",
    tool_rows=f"""
  UPDATE tool_invocations AS ti SET status = t.status, result = t.result, result_digest = t.result_digest,
    claim_fence = :fence, invocation_id = t.invocation_id, proof = coalesce(t.proof, ti.proof),
    suspension = coalesce(t.suspension, ti.suspension), approval = coalesce(t.approval, ti.approval)
  FROM upd, {_TOOL_COLUMNS}
  WHERE ti.run_id = upd.id AND ti.invocation_id = t.resumes_invocation_id AND ti.status = 'suspended'""",
)


def _tool_row(tool: ToolInvocationRecord) -> JsonObject:
    return {f.name: getattr(tool, f.name) for f in _TOOL_FIELDS}


def _message_row(message: MessageRecord) -> JsonObject:
    # A tool message is stored without its result: the result is stored once, in the
    # call's tool_invocations row (schema.store.bodies).
    body = without_result(message.body) if message.body.get("role") == "tool" else message.body
    return {"position": message.position, "body": body, "chain_digest": message.chain_digest}


def _event_row(event: EventRecord) -> JsonObject:
    data = without_result(event.data) if event.kind == EventKind.TOOL_COMPLETED else event.data
    return {"kind": str(event.kind), "data": data}


def commit_round_txn(conn: Connection, record: RoundRecord) -> Committed:
    """Commit a round under the held fence, or raise ``FenceLost`` having written
    nothing. Returns whether a pending interrupt ended the run here, and the queued runs
    to send: when the run ended, the next one of its Root, and when it gave back a slot
    of its owner's cap, the owner's next one."""
    try:
        row = conn.execute(
            COMMIT_RESUME_SQL if record.resumed else COMMIT_ROUND_SQL,
            {
                "run_id": record.run_id,
                "fence": record.fence,
                "boundary_seq": record.boundary_seq,
                "status": str(record.status),
                "terminal": record.terminal,
                "output": record.output,
                "error_code": record.error_code,
                "error_message": record.error_message,
                "outcome": str(record.outcome),
                "system_digest": record.system_digest,
                "messages_digest": record.messages_digest,
                "tools_digest": record.tools_digest,
                "accepted_response_digest": record.accepted_response_digest,
                "tool_fingerprint": record.tool_fingerprint,
                "repeat_count": record.repeat_count,
                "proof": record.proof,
                "finish_reason": record.finish_reason,
                "messages": json.dumps([_message_row(m) for m in record.messages]),
                "tools": json.dumps([_tool_row(t) for t in record.tools]),
                "events": json.dumps([_event_row(e) for e in record.events]),
                "n_events": len(record.events),
            },
        ).one_or_none()
    except IntegrityError as exc:
        if getattr(getattr(exc.orig, "diag", None), "constraint_name", None) == "uq_tool_invocations_run_id":
            raise ToolCallIdReused(record.run_id) from None
        raise
    if row is None:
        raise FenceLost(record.run_id, record.fence)
    return Committed(next_runs=next_runs(row), interrupted=row.interrupted)


# --- the model-call ledger --------------------------------------------------------------------

# The ledger's two statements commit without waiting for the WAL flush: the statement sets
# synchronous_commit off for its own (implicit) transaction, and the session keeps its
# setting. A worker that dies loses nothing PostgreSQL has accepted, flushed or not: the
# next holder's claim sees the row. Only a crash of PostgreSQL itself can lose the rows
# of the last moments (at most three wal_writer_delay, 600 ms by default), and the next
# synchronous commit (the claim, the round's commit) flushes every row before it. What
# such a crash costs is in docs/guarantees.md: at most one extra model call per
# run in flight.
ASYNC_COMMIT_CTE = "async_commit AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) AS off)"

# The first ledger row of a claim also marks the round's execution as started under that
# fence (runs.execution_fence): from here on, a holder that dies costs the round an attempt.
# The same statement reserves the call's estimate against the owner's budget, if it has
# one (schema.store.budgets): no row is inserted when the reservation is refused, and the
# statement returns the budget's figures instead. An owner without a budget pays a primary
# key lookup on owners, no write.
_LEDGER_START_SQL = text(
    f"""
WITH held AS (
  UPDATE runs SET execution_fence = :fence WHERE id = :run_id AND claim_fence = :fence RETURNING id, owner
), {budgets.RESERVE_CTES}, call AS (
  INSERT INTO model_calls (run_id, boundary_seq, attempt, claim_fence, status, request_digest,
                           {budgets.RESERVED_COLUMNS})
  SELECT held.id, :boundary_seq, :attempt, :fence, 'started', :request_digest, {budgets.RESERVED_VALUES}
  FROM held LEFT JOIN budget ON true
  WHERE {budgets.RESERVED_GUARD}
  RETURNING id
), {ASYNC_COMMIT_CTE}
SELECT (SELECT id FROM call) AS call_id, {budgets.REFUSAL_COLUMNS}
FROM held LEFT JOIN budget ON true CROSS JOIN async_commit
"""
)

# Keyed by the call's own row, which only this holder's started call matches (its id, run
# and fence, still 'started'): it never needs the fence to be held - the call was paid for
# either way - and it can change nothing but that row, once. Whether the fence is still
# held is recorded, not required. The same statement settles the owner's spend: the call's
# reservation (if still open) is replaced by its real usage.
_LEDGER_FINISH_SQL = text(
    f"""
WITH fin AS (
  UPDATE model_calls AS mc SET status = :status, request_digest = coalesce(:request_digest, mc.request_digest),
    response_digest = :response_digest,
    response = CAST(:response AS jsonb), input_tokens = :input_tokens, output_tokens = :output_tokens,
    error_code = :error_code, finished_at = now(), reservation_open = false,
    stale = NOT EXISTS (SELECT 1 FROM runs WHERE runs.id = mc.run_id AND runs.claim_fence = mc.claim_fence)
  FROM {budgets.SETTLE_OLD}
  WHERE mc.id = old.id AND mc.run_id = :run_id AND mc.claim_fence = :fence AND mc.status = 'started'
  RETURNING mc.stale, mc.spend_window_start, {budgets.SETTLE_RELEASED}
), {budgets.SETTLE_CTE}, {ASYNC_COMMIT_CTE}
SELECT stale FROM fin CROSS JOIN async_commit
"""
)


def record_model_call_started_txn(
    conn: Connection,
    run_id: UUID,
    boundary_seq: int,
    attempt: int,
    fence: int,
    request_digest: str,
    estimate_tokens: int = 0,
) -> int:
    """Write the ledger row before calling the model, reserving ``estimate_tokens``
    against the owner's budget if it has one; a holder that lost its fence gets
    ``FenceLost`` here and never pays for the call, and a call the budget cannot take
    gets ``BudgetRefused`` (nothing written, nothing reserved)."""
    row = conn.execute(
        _LEDGER_START_SQL,
        {
            "run_id": run_id,
            "boundary_seq": boundary_seq,
            "attempt": attempt,
            "fence": fence,
            "request_digest": request_digest,
            "estimate": estimate_tokens,
        },
    ).one_or_none()
    if row is None:
        raise FenceLost(run_id, fence)
    if row.call_id is None:
        raise budgets.BudgetRefused(run_id, budgets.shortfall_fields(row, estimate_tokens))
    return int(row.call_id)


def record_model_call_finished_txn(
    conn: Connection,
    call_id: int,
    run_id: UUID,
    fence: int,
    *,
    response_digest: str | None,
    input_tokens: int | None,
    output_tokens: int | None,
    error_code: str | None,
    response: JsonMapping | None = None,
    request_digest: str | None = None,
) -> None:
    """Write the call's outcome and usage right after it returns (before tools run), so
    the spend is on record even if the round never commits, and with them the accepted
    ``response`` (``ModelResponse.to_json()``) of a call that succeeded: the round's next
    claim hands it back (``schema.store.claims``), so a round redone after its holder died
    runs the same tool calls without asking the model again. A holder that has lost its
    fence records its call all the same, marked ``stale``, and then gets ``FenceLost``
    (its round can never commit, so it stops here). ``request_digest`` is the request really
    sent, for a row its claim wrote with the request the claim's holder expected."""
    stale = conn.execute(
        _LEDGER_FINISH_SQL,
        {
            "call_id": call_id,
            "run_id": run_id,
            "fence": fence,
            "status": "failed" if error_code else "succeeded",
            "request_digest": request_digest,
            "response_digest": response_digest,
            # Kept only for a call that succeeded: it is what a redone round reuses.
            "response": None if error_code or response is None else json.dumps(response),
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "error_code": error_code,
        },
    ).scalar_one_or_none()
    # None: not this holder's started call; nothing was written. Stale: written (the one
    # statement runs in autocommit), and the holder stops here.
    if stale is None or stale:
        raise FenceLost(run_id, fence)


def drop_unused_model_call_txn(conn: Connection, call_id: int, run_id: UUID, fence: int) -> None:
    """Delete the ledger row a warm claim wrote for a call its holder then never made (the
    round ended or was given back before the call): only while it is still that holder's
    started row. A holder that dies leaves the row: whether its call was made is unknown."""
    conn.execute(
        text("DELETE FROM model_calls WHERE id = :call_id AND run_id = :run_id AND claim_fence = :fence "
             "AND status = 'started'"),
        {"call_id": call_id, "run_id": run_id, "fence": fence},
    )

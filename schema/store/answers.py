"""Answers to suspended calls: a client tool's result, a person's approval or rejection,
an operator's word on an at_most_once call whose outcome is unknown (``tool_answers``).
Like a delivery (``schema.store.suspensions``), an answer is one transaction that locks
the run row, refuses what the run is not waiting for, and makes the run ready to resume
when it was the last missing input."""

from __future__ import annotations

import json
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from schema.store.errors import RunNotFound
from schema.store.suspensions import (
    ANSWERS_FOR,
    DeliveryRefused,
    Receipt,
    lock_run,
    ready_resumes,
    refuse_if_ended,
    suspended_calls,
)
from schema.store.tx import run_transaction
from schema.wire import TERMINAL_STATUSES
from schema.wire.json import JsonObject, JsonValue
from schema.wire.vocab import ToolAnswerKind

_ANSWER_NAMES = {"result": "a result", "retry": "a retry", "approve": "an approval", "reject": "a rejection"}


@dataclass(frozen=True)
class Answer:
    """An answer to one suspended call (``tool_answers``)."""

    kind: ToolAnswerKind
    value: JsonValue = None
    is_error: bool = False
    reason: str | None = None


def _given_before(conn: Connection, run_id: UUID, tool_call_id: str, given: tuple[object, ...]) -> bool:
    """Whether this very answer was given to the call before (for any of its waits)."""
    earlier = conn.execute(
        text("SELECT kind, value, is_error, reason FROM tool_answers WHERE run_id = :id AND tool_call_id = :call"),
        {"id": run_id, "call": tool_call_id},
    ).all()
    return any(tuple(row) == given for row in earlier)


def answer_tool_call_txn(conn: Connection, run_id: UUID, tool_call_id: str, answer: Answer) -> Receipt:
    run = lock_run(conn, run_id)
    given = (str(answer.kind), answer.value, answer.is_error, answer.reason)
    ended = run.status in TERMINAL_STATUSES
    call = None if ended else next((c for c in suspended_calls(conn, run_id) if c.tool_call_id == tool_call_id), None)
    if call is None:
        # The same answer again after it was acted on (a client's retry that arrives after
        # the resume, even after the run ended) changes nothing, like a delivery repeated.
        if _given_before(conn, run_id, tool_call_id, given):
            return Receipt(stored=False, resumes=[])
        refuse_if_ended(run_id, run)
        raise DeliveryRefused(run_id, f"it is not waiting for tool call {tool_call_id!r}", "tool_call_id")
    wait = call.suspension["kind"]
    if answer.kind not in ANSWERS_FOR.get(wait, frozenset()):
        raise DeliveryRefused(
            run_id, f"tool call {tool_call_id!r} waits for {_WAITS[wait]}, not {_ANSWER_NAMES[answer.kind]}", "kind"
        )
    existing = conn.execute(
        text("SELECT kind, value, is_error, reason FROM tool_answers WHERE run_id = :id AND invocation_id = :inv"),
        {"id": run_id, "inv": call.invocation_id},
    ).one_or_none()
    if existing is not None:
        if tuple(existing) != given:
            raise DeliveryRefused(run_id, f"tool call {tool_call_id!r} was already answered otherwise", "kind")
        return Receipt(stored=False, resumes=[])  # the same answer again: nothing to do
    conn.execute(
        text(
            "INSERT INTO tool_answers (run_id, invocation_id, tool_call_id, kind, value, is_error, reason) "
            "VALUES (:id, :inv, :call, :kind, CAST(:value AS jsonb), :is_error, :reason)"
        ),
        {"id": run_id, "inv": call.invocation_id, "call": tool_call_id, "kind": str(answer.kind),
         "value": None if answer.value is None else json.dumps(answer.value), "is_error": answer.is_error,
         "reason": answer.reason},
    )
    event: JsonObject = {"tool_call_id": tool_call_id, "kind": wait, "answer": str(answer.kind)}
    if answer.kind == ToolAnswerKind.APPROVE and answer.value is not None:
        event["args"] = answer.value
    if answer.reason is not None:
        event["reason"] = answer.reason
    return Receipt(stored=True, resumes=ready_resumes(conn, run_id, run, event))


_WAITS = {"client_tool": "a client tool's result", "outcome_unknown": "an operator's word on an unknown outcome",
          "approval": "an approval or a rejection", "local_read": "files", "prerequisite": "a prerequisite"}


def answer_tool_call(engine: Engine, run_id: UUID, tool_call_id: str, answer: Answer) -> Receipt:
    """Answer a suspended call: refused with nothing stored unless the run waits for this
    kind of answer to this call; the same answer again changes nothing."""
    return run_transaction(
        engine, lambda conn: answer_tool_call_txn(conn, run_id, tool_call_id, answer), name="answer_tool_call"
    )


@dataclass(frozen=True)
class WaitingCall:
    """A suspended call of a run as the one answering it needs it: what it waits for, and
    the run's owner and stored config (to find the call's tool and check edited args)."""

    tool_name: str
    kind: str
    owner: str
    config: JsonObject


def waiting_call(engine: Engine, run_id: UUID, tool_call_id: str) -> WaitingCall | None:
    """The run's suspended call ``tool_call_id``, or None when the run waits for no such
    call; ``RunNotFound`` for no such run. A read only: the answer is checked again, under
    the run's lock, when it is stored."""
    with engine.connect() as conn:
        run = conn.execute(text("SELECT owner, config FROM runs WHERE id = :id"), {"id": run_id}).one_or_none()
        if run is None:
            raise RunNotFound(run_id)
        call = next((c for c in suspended_calls(conn, run_id) if c.tool_call_id == tool_call_id), None)
    if call is None:
        return None
    return WaitingCall(call.tool_name, call.suspension["kind"], run.owner, run.config)

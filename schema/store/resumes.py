"""What a resume reads before it claims: the suspended round (its fence, digests and
proof), its suspended calls with the resumes their stored projections make, and every
input delivered for them (files, prerequisites, answers and approvals), in one snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict
from uuid import UUID

from sqlalchemy import Connection, text

from schema.store.answers import Answer
from schema.store.suspensions import resume_of, suspended_calls
from schema.wire import OriginalToolRoundResume
from schema.wire.claim import StoredRound
from schema.wire.json import JsonObject, JsonValue
from schema.wire.vocab import ToolAnswerKind


class LocalFile(TypedDict):
    """A file delivered for a suspended read (``local_reads``)."""

    content: str
    digest: str
    size_bytes: int


@dataclass(frozen=True)
class SuspendedCall:
    """A suspended tool call as stored, with the resume its stored projection makes."""

    tool_call_id: str
    tool_name: str
    args: JsonObject
    suspension: JsonObject  # what it waits for (runtime.tools.ToolSuspension.to_json)
    resume: OriginalToolRoundResume


@dataclass(frozen=True)
class SuspensionMaterial:
    """What a resume needs, read before it claims: the suspended round's digests, its
    suspended calls (with their stored projections) and the inputs delivered."""

    run_id: UUID
    boundary_seq: int
    round: StoredRound  # the suspended round's fence, four digests and proof
    calls: list[SuspendedCall]
    files: dict[str, dict[str, LocalFile]]  # tool_call_id -> path -> {content, digest, size_bytes}
    prerequisites: dict[str, JsonValue]
    answers: dict[str, Answer]  # tool_call_id -> the answer to its current wait (result or retry)
    approvals: dict[str, Answer]  # tool_call_id -> the decision on it (approve or reject)


def load_suspension_txn(conn: Connection, invocation_id: str) -> SuspensionMaterial | None:
    """The suspended round that holds the suspended call ``invocation_id`` (an invocation
    id is unique: it names the suspension a resume is for); run at REPEATABLE READ."""
    found = conn.execute(
        text("SELECT run_id, boundary_seq FROM tool_invocations WHERE invocation_id = :inv AND status = 'suspended'"),
        {"inv": invocation_id},
    ).one_or_none()
    if found is None:
        return None
    run_id, boundary_seq = found.run_id, found.boundary_seq
    run = conn.execute(
        text(
            "SELECT rd.claim_fence, rd.proof, rd.system_digest, rd.messages_digest, rd.tools_digest, "
            "rd.accepted_response_digest "
            "FROM runs r JOIN rounds rd ON rd.run_id = r.id AND rd.boundary_seq = :b AND rd.outcome = 'suspend' "
            "WHERE r.id = :id AND r.boundary_seq = :b"
        ),
        {"id": run_id, "b": boundary_seq},
    ).one_or_none()
    if run is None:
        return None
    calls = [
        SuspendedCall(row.tool_call_id, row.tool_name, row.args, row.suspension, resume_of(run_id, boundary_seq, row))
        for row in suspended_calls(conn, run_id)
    ]
    files: dict[str, dict[str, LocalFile]] = {}
    for row in conn.execute(
        text("SELECT tool_call_id, path, content, digest, size_bytes FROM local_reads WHERE run_id = :id"),
        {"id": run_id},
    ):
        files.setdefault(row.tool_call_id, {})[row.path] = {
            "content": row.content,
            "digest": row.digest,
            "size_bytes": row.size_bytes,
        }
    prerequisites: dict[str, JsonValue] = dict(
        conn.execute(text("SELECT key, value FROM prerequisites WHERE run_id = :id"), {"id": run_id}).all()
    )
    current = {c.resume.invocation_id for c in calls}
    answers: dict[str, Answer] = {}
    approvals: dict[str, Answer] = {}
    for row in conn.execute(
        text("SELECT invocation_id, tool_call_id, kind, value, is_error, reason FROM tool_answers "
             "WHERE run_id = :id ORDER BY created_at"),
        {"id": run_id},
    ):
        answer = Answer(ToolAnswerKind(row.kind), row.value, row.is_error, row.reason)
        if answer.kind in (ToolAnswerKind.APPROVE, ToolAnswerKind.REJECT):
            approvals[row.tool_call_id] = answer  # holds for every later execution of the call
        elif row.invocation_id in current:
            answers[row.tool_call_id] = answer
    return SuspensionMaterial(
        run_id, boundary_seq, StoredRound(**run._mapping), calls, files, prerequisites, answers, approvals
    )



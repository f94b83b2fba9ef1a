"""Suspensions: what a suspended round waits for, delivering durable local reads,
resolving prerequisites and answering calls, and when the run is ready to resume (the
material a resume then reads is ``schema.store.resumes``).

A delivery is one transaction that locks the run row: it refuses anything the run is not
waiting for (and changes nothing), stores the input, and when the last missing input of
the suspended round has arrived, makes the run ready to resume (``running``, taking a slot
of its owner's cap) and returns the resumes to dispatch after the commit; with the cap
full, the run waits ``queued`` for a slot instead (``_READY_SQL``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from schema.store.errors import RunNotFound
from schema.store.limits import at_capacity_sql
from schema.store.rows import StoredRow
from schema.store.tx import run_transaction
from schema.wire import TERMINAL_STATUSES, OriginalToolRoundResume, RunStatus, WaitingFor
from schema.wire.errors import AidaworkError, ErrorCode
from schema.wire.json import JsonMapping, JsonObject, JsonValue
from schema.wire.vocab import ANSWERED_WAITS, ToolAnswerKind, ToolStatus


class DeliveryRefused(AidaworkError):
    """The run is not waiting for this input, or the input is not what was asked for.
    Nothing was stored."""

    code = ErrorCode.DELIVERY_REFUSED

    def __init__(self, run_id: UUID, message: str, field: str) -> None:
        super().__init__(f"run {run_id}: {message}")
        self.run_id = run_id
        self.field = field  # what was wrong: run_id, tool_call_id, files or key


@dataclass(frozen=True)
class Receipt:
    stored: bool  # False: this exact input was already there (idempotent repeat)
    resumes: list[OriginalToolRoundResume]  # non-empty: the run is ready; dispatch these


def file_digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


# Whether the suspended call ``ti`` has its input: all the files it asked for, its
# prerequisite, or (client tools, approvals, unknown outcomes) an answer to this very
# wait. What a suspended call waits for, and whether a run can resume, both read this.
_DELIVERED = """CASE ti.suspension->>'kind'
         WHEN 'local_read' THEN (SELECT count(*) FROM local_reads AS lr
                                 WHERE lr.run_id = ti.run_id AND lr.tool_call_id = ti.tool_call_id)
                                = jsonb_array_length(ti.suspension->'paths')
         WHEN 'prerequisite' THEN EXISTS (SELECT 1 FROM prerequisites AS p
                                          WHERE p.run_id = ti.run_id AND p.key = ti.suspension->>'key')
         ELSE EXISTS (SELECT 1 FROM tool_answers AS ta
                      WHERE ta.run_id = ti.run_id AND ta.invocation_id = ti.invocation_id)
       END"""

_SUSPENDED_CALLS_SQL = text(
    f"""
SELECT ti.tool_call_id, ti.tool_name, ti.tool_domain, ti.args, ti.approval, ti.args_digest, ti.invocation_id,
       ti.work_owner, ti.claim_fence, ti.proof, ti.suspension, rd.proof AS round_proof,
       {_DELIVERED} AS delivered
FROM runs AS r
JOIN rounds AS rd ON rd.run_id = r.id AND rd.boundary_seq = r.boundary_seq AND rd.outcome = 'suspend'
JOIN tool_invocations AS ti ON ti.run_id = r.id AND ti.boundary_seq = r.boundary_seq AND ti.status = 'suspended'
WHERE r.id = :run_id
ORDER BY ti.id
"""
)


# The waits answered about the call itself (``ANSWERED_WAITS``), and the answers each takes.
ANSWERS_FOR: dict[str, frozenset[str]] = {
    "client_tool": frozenset({ToolAnswerKind.RESULT}),
    "outcome_unknown": frozenset({ToolAnswerKind.RESULT, ToolAnswerKind.RETRY}),
    "approval": frozenset({ToolAnswerKind.APPROVE, ToolAnswerKind.REJECT}),
}


def suspended_calls(conn: Connection, run_id: UUID) -> list[StoredRow]:
    return list(conn.execute(_SUSPENDED_CALLS_SQL, {"run_id": run_id}))


def resume_of(run_id: UUID, boundary_seq: int, row: StoredRow) -> OriginalToolRoundResume:
    return OriginalToolRoundResume(
        run_id=run_id,
        invocation_id=row.invocation_id,
        boundary_seq=boundary_seq,
        tool_call_id=row.tool_call_id,
        tool_domain=row.tool_domain,
        args_digest=row.args_digest,
        work_owner=row.work_owner,
        claim_fence=row.claim_fence,
        round_proof=row.round_proof,
        proof=row.proof,
    )


def waiting_for(conn: Connection, run_id: UUID) -> list[WaitingFor]:
    return [
        WaitingFor(
            tool_call_id=row.tool_call_id,
            tool_name=row.tool_name,
            kind=row.suspension["kind"],
            paths=row.suspension.get("paths"),
            key=row.suspension.get("key"),
            args=_shown_args(row) if row.suspension["kind"] in ANSWERED_WAITS else None,
            reason=row.suspension.get("reason"),
            delivered=row.delivered,
        )
        for row in suspended_calls(conn, run_id)
    ]


def _shown_args(row: StoredRow) -> JsonValue:
    """The args a waiting call is answered about: as approved when a person edited them
    (a client tool then runs with those), else as the model proposed them."""
    approval = row.approval or {}
    shown: JsonValue = approval["args"] if approval.get("decision") == "approve" and "args" in approval else row.args
    return shown


def lock_run(conn: Connection, run_id: UUID) -> StoredRow:
    row = conn.execute(
        text("SELECT status, boundary_seq FROM runs WHERE id = :id FOR UPDATE"), {"id": run_id}
    ).one_or_none()
    if row is None:
        raise RunNotFound(run_id)
    return row


def refuse_if_ended(run_id: UUID, run: StoredRow) -> None:
    if run.status in TERMINAL_STATUSES:
        raise DeliveryRefused(run_id, f"the run has ended ({run.status}); it waits for nothing", "run_id")


def ready_resumes(
    conn: Connection, run_id: UUID, run: StoredRow, event: JsonMapping, event_kind: str = "input_delivered"
) -> list[OriginalToolRoundResume]:
    """Record the event; if the round has all its inputs now, make the run ready to
    resume and return the resumes."""
    calls = suspended_calls(conn, run_id)
    ready = run.status == RunStatus.SUSPENDED and calls and all(c.delivered for c in calls)
    resumed = conn.execute(
        _READY_SQL,
        {"id": run_id, "ready": bool(ready), "kind": event_kind, "data": json.dumps(event)},
    ).scalar_one()
    return [resume_of(run_id, run.boundary_seq, c) for c in calls] if resumed else []


# Ready to resume takes a slot of the owner's cap again (a suspended run holds none), in
# the same statement. With none free the run waits queued, all its inputs there, in its
# owner's queue by submission order like any queued run: the next slot that frees (or the
# reconciler) sends it its resume, ahead of the owner's younger runs.
_READY_SQL = text(
    """
WITH slot AS (
  UPDATE owners SET running = owners.running + 1 FROM runs AS r
  WHERE r.id = :id AND owners.owner = r.owner AND :ready
    AND (owners.max_running IS NULL OR owners.running < owners.max_running)
  RETURNING owners.owner
), go AS (
  SELECT :ready AND (EXISTS (SELECT 1 FROM slot) OR NOT EXISTS (
    SELECT 1 FROM owners AS o JOIN runs AS r ON r.owner = o.owner WHERE r.id = :id)) AS ok
), upd AS (
  UPDATE runs SET event_seq = event_seq + 1, updated_at = now(),
    status = CASE WHEN (SELECT ok FROM go) THEN 'running' WHEN :ready THEN 'queued' ELSE status END,
    dispatched_at = CASE WHEN :ready THEN now() ELSE dispatched_at END
  WHERE id = :id RETURNING event_seq, (SELECT ok FROM go) AS resumed
), ev AS (
  INSERT INTO run_events (run_id, seq, kind, data)
  SELECT :id, event_seq, :kind, CAST(:data AS jsonb) || jsonb_build_object('resumable', resumed) FROM upd
)
SELECT resumed FROM upd
"""
)


def deliver_local_read_txn(
    conn: Connection, run_id: UUID, tool_call_id: str, files: dict[str, str], *, max_file_bytes: int
) -> Receipt:
    run = lock_run(conn, run_id)
    call = conn.execute(
        text(
            "SELECT status, suspension, boundary_seq FROM tool_invocations WHERE run_id = :id AND tool_call_id = :call"
        ),
        {"id": run_id, "call": tool_call_id},
    ).one_or_none()
    if call is None or call.suspension is None or call.suspension["kind"] != "local_read":
        raise DeliveryRefused(run_id, f"it is not waiting for files for tool call {tool_call_id!r}", "tool_call_id")
    asked = list(call.suspension["paths"])
    if sorted(files) != sorted(asked):
        raise DeliveryRefused(
            run_id, f"tool call {tool_call_id!r} asked for paths {sorted(asked)}, got {sorted(files)}", "files"
        )
    for path, content in files.items():
        size = len(content.encode())
        if size > max_file_bytes:
            raise DeliveryRefused(
                run_id,
                f"{path}: {size} bytes is over the limit of {max_file_bytes} (AIDAWORK_MAX_LOCAL_READ_BYTES)",
                "files",
            )
    digests = {path: file_digest(content) for path, content in files.items()}
    stored: dict[str, str] = dict(
        conn.execute(
            text("SELECT path, digest FROM local_reads WHERE run_id = :id AND tool_call_id = :call"),
            {"id": run_id, "call": tool_call_id},
        ).all()
    )
    if stored:
        if stored != digests:
            raise DeliveryRefused(run_id, f"different content was already delivered for {tool_call_id!r}", "files")
        return Receipt(stored=False, resumes=[])  # the same delivery again: nothing to do
    refuse_if_ended(run_id, run)
    if call.status != ToolStatus.SUSPENDED or call.boundary_seq != run.boundary_seq:
        raise DeliveryRefused(run_id, f"tool call {tool_call_id!r} is no longer waiting", "tool_call_id")
    conn.execute(
        text(
            "INSERT INTO local_reads (run_id, tool_call_id, path, content, digest, size_bytes) "
            "VALUES (:id, :call, :path, :content, :digest, :size)"
        ),
        [
            {
                "id": run_id,
                "call": tool_call_id,
                "path": p,
                "content": c,
                "digest": digests[p],
                "size": len(c.encode()),
            }
            for p, c in files.items()
        ],
    )
    event: JsonObject = {
        "tool_call_id": tool_call_id,
        "kind": "local_read",
        "files": [{"path": p, "digest": d} for p, d in sorted(digests.items())],
    }
    return Receipt(stored=True, resumes=ready_resumes(conn, run_id, run, event))


def deliver_local_read(
    engine: Engine, run_id: UUID, tool_call_id: str, files: dict[str, str], *, max_file_bytes: int
) -> Receipt:
    return run_transaction(
        engine,
        lambda conn: deliver_local_read_txn(conn, run_id, tool_call_id, files, max_file_bytes=max_file_bytes),
        name="deliver_local_read",
    )


def resolve_prerequisite_txn(conn: Connection, run_id: UUID, key: str, value: JsonValue) -> Receipt:
    run = lock_run(conn, run_id)
    existing = conn.execute(
        text("SELECT value FROM prerequisites WHERE run_id = :id AND key = :key"), {"id": run_id, "key": key}
    ).one_or_none()
    if existing is not None:
        if existing.value != value:
            raise DeliveryRefused(run_id, f"prerequisite {key!r} was already resolved with another value", "value")
        return Receipt(stored=False, resumes=[])
    refuse_if_ended(run_id, run)
    waiting = [
        c
        for c in suspended_calls(conn, run_id)
        if c.suspension["kind"] == "prerequisite" and c.suspension["key"] == key
    ]
    if not waiting:
        raise DeliveryRefused(run_id, f"it is not waiting for prerequisite {key!r}", "key")
    conn.execute(
        text("INSERT INTO prerequisites (run_id, key, value) VALUES (:id, :key, CAST(:value AS jsonb))"),
        {"id": run_id, "key": key, "value": json.dumps(value)},
    )
    event: JsonObject = {"kind": "prerequisite", "key": key, "tool_call_ids": [c.tool_call_id for c in waiting]}
    return Receipt(stored=True, resumes=ready_resumes(conn, run_id, run, event))


def resolve_prerequisite(engine: Engine, run_id: UUID, key: str, value: JsonValue) -> Receipt:
    return run_transaction(
        engine, lambda conn: resolve_prerequisite_txn(conn, run_id, key, value), name="resolve_prerequisite"
    )


def resume_if_ready_txn(conn: Connection, run_id: UUID) -> list[OriginalToolRoundResume]:
    """A round that suspended on inputs that were already there (a prerequisite resolved
    for an earlier call) needs no delivery: make it ready at once. Called after a
    suspension commits, and by the reconciler."""
    run = conn.execute(
        text("SELECT status, boundary_seq FROM runs WHERE id = :id FOR UPDATE"), {"id": run_id}
    ).one_or_none()
    if run is None or run.status != RunStatus.SUSPENDED:
        return []
    calls = suspended_calls(conn, run_id)
    if not calls or not all(c.delivered for c in calls):
        return []
    event: JsonObject = {"tool_call_ids": [c.tool_call_id for c in calls], "reason": "inputs already delivered"}
    return ready_resumes(conn, run_id, run, event, "resume_ready")


def suspended_with_all_inputs(engine: Engine, *, limit: int = 100) -> list[UUID]:
    """Suspended runs whose waiting calls all have their inputs (a worker died between
    committing the suspension and making it ready). A run parked for its owner's budget
    waits for no call (schema.store.budgets wakes it): left out, so that many of them
    never crowd out the runs this repairs."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.id FROM runs r WHERE r.status = 'suspended' AND r.budget_wait IS NULL AND NOT EXISTS ("
                "  SELECT 1 FROM tool_invocations ti WHERE ti.run_id = r.id AND ti.boundary_seq = r.boundary_seq"
                f"  AND ti.status = 'suspended' AND NOT {_DELIVERED})"
                f" AND NOT {at_capacity_sql('r')}"
                " AND r.updated_at < now() - interval '1 second' LIMIT :limit"
            ),
            {"limit": limit},
        )
        return [r.id for r in rows]


def pending_resumes_txn(conn: Connection, run_id: UUID) -> list[OriginalToolRoundResume]:
    """The resumes of a run that is ready to resume (for the reconciler)."""
    run = conn.execute(text("SELECT boundary_seq FROM runs WHERE id = :id"), {"id": run_id}).one_or_none()
    if run is None:
        return []
    return [resume_of(run_id, run.boundary_seq, c) for c in suspended_calls(conn, run_id)]

"""Runs outside their rounds: submit, end (fail a held run, cancel), and the status view.
(The claim of a run for a round is ``schema.store.claims``; the claim's result types are
defined here.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine, text

from schema.store.budgets import budget_waiting_for
from schema.store.claims import next_fence_sql
from schema.store.doubletext import ROLLED_BACK, ToCancel, cancel_message, runs_to_cancel
from schema.store.errors import FenceLost, IdempotencyKeyReused, RootNotFound, RunNotFound
from schema.store.limits import next_runs, next_runs_sql
from schema.store.routes import weight_sql
from schema.store.suspensions import waiting_for
from schema.store.tx import run_transaction
from schema.store.webhooks import deliveries_of
from schema.wire import RootPolicy, RunRequest, RunStatus, RunView
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonMapping
from schema.wire.route import Route


@dataclass(frozen=True)
class Submitted:
    run_id: UUID
    root_id: UUID
    root_seq: int
    # How its rounds are routed, read in the submit's transaction (None: an existing run,
    # nothing to send).
    route: Route | None = None
    # The run was stored by an earlier submit with the same idempotency key: nothing new
    # was stored (and nothing is to be sent).
    existing: bool = False
    # The runs this submit's root_policy (interrupt, rollback) cancelled, or cancels at
    # their next round boundary: ``interrupting``, those of an interrupt with a round in
    # flight (they end when that round commits).
    interrupted: tuple[UUID, ...] = ()
    interrupting: tuple[UUID, ...] = ()


class _KeyRaced(Exception):
    """A concurrent submit with the same owner and idempotency key inserted its run
    first: this transaction is rolled back (its Root update, its cancels) and run again,
    and then finds that run."""


DEFAULT_IDEMPOTENCY_TTL_S = 86_400

# A key older than the TTL is cleared from its run, in the same statement that looks the
# key up, so the submit may reuse it (the INSERT below then meets no conflict). The
# created_at bound keeps a key another submit is clearing right now from being returned.
_EXISTING_SQL = text(
    """
WITH expired AS (
  UPDATE runs SET idempotency_key = NULL
  WHERE owner = :owner AND idempotency_key = :key AND created_at < now() - make_interval(secs => :ttl_s)
  RETURNING id
)
SELECT id, root_id, root_seq, request_digest FROM runs
WHERE owner = :owner AND idempotency_key = :key AND created_at >= now() - make_interval(secs => :ttl_s)
  AND id NOT IN (SELECT id FROM expired)
"""
)

_INSERT_RUN_SQL = text(
    "INSERT INTO runs (id, root_id, root_seq, owner, status, input, config, event_seq, trace_context, "
    "  webhook_url, idempotency_key, request_digest, root_policy, priority, agent) "
    "VALUES (:id, :root_id, :root_seq, :owner, 'queued', :input, CAST(:config AS jsonb), 1, "
    "  :trace_context, :webhook_url, :idempotency_key, :request_digest, :root_policy, :priority, :agent) "
    "ON CONFLICT (owner, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING "
    f"RETURNING id, {weight_sql('runs')} AS weight"
)

# A later run of a Root starts from the context its predecessor rebuilt, if any; a
# rolled-back run's context is not the Root's any more, so it is skipped.
_CHECKPOINT_SQL = text(
    "INSERT INTO run_checkpoints (run_id, context_start_position, summary) "
    "SELECT :id, coalesce(prev.context_start_position, 0), prev.summary "
    "FROM (SELECT 1) AS one LEFT JOIN LATERAL ("
    "  SELECT cp.context_start_position, cp.summary FROM run_checkpoints cp JOIN runs r ON r.id = cp.run_id"
    "  WHERE r.root_id = :root AND r.root_seq < :seq AND r.error_code IS DISTINCT FROM :rolled_back"
    "  ORDER BY r.root_seq DESC LIMIT 1) AS prev ON true"
)


def _existing_run(
    conn: Connection, request: RunRequest, request_digest: str | None, ttl_s: int
) -> Submitted | None:
    row = conn.execute(
        _EXISTING_SQL, {"owner": request.owner, "key": request.idempotency_key, "ttl_s": ttl_s}
    ).one_or_none()
    if row is None:
        return None
    if row.request_digest != request_digest:
        raise IdempotencyKeyReused(request.owner, row.id)
    return Submitted(run_id=row.id, root_id=row.root_id, root_seq=row.root_seq, existing=True)


def _take_root_turn(conn: Connection, request: RunRequest) -> tuple[UUID, int]:
    """The run's Root and its seq in it: a new Root, or the next seq of the request's,
    whose row stays locked until the transaction ends."""
    if request.root_id is None:
        root_id = uuid4()
        conn.execute(
            text("INSERT INTO roots (id, owner, next_run_seq) VALUES (:id, :owner, 1)"),
            {"id": root_id, "owner": request.owner},
        )
        return root_id, 0
    # Locks the Root row, so concurrent submits to one Root get distinct seqs in order
    # and decide their root_policy one after the other.
    seq = conn.execute(
        text(
            "UPDATE roots SET next_run_seq = next_run_seq + 1 WHERE id = :id AND owner = :owner "
            "RETURNING next_run_seq - 1"
        ),
        {"id": request.root_id, "owner": request.owner},
    ).scalar_one_or_none()
    if seq is None:
        raise RootNotFound(request.root_id, request.owner)
    return request.root_id, int(seq)


def _cancel_for(conn: Connection, policy: RootPolicy, to_cancel: ToCancel, new_run_id: UUID) -> None:
    """Cancel the runs ``doubletext.runs_to_cancel`` locked that are at a boundary now
    (fence bumped: nothing under an older claim can commit), and mark the rest for
    cancelling at their next boundary; for ``rollback``, drop the cancelled runs'
    messages from the Root."""
    code, message = cancel_message(policy, new_run_id)
    for run_id in to_cancel.now:
        end_run_txn(
            conn, run_id, fence=None, status=RunStatus.CANCELLED, error_code=code, message=message,
            event_kind="run_cancelled",
        )
    ids = {"new": new_run_id, "ids": list(to_cancel.all), "now": list(to_cancel.now)}
    conn.execute(text("UPDATE runs SET interrupted_by = :new WHERE id = ANY(:ids)"), ids)
    if policy is RootPolicy.ROLLBACK:
        conn.execute(text("DELETE FROM messages WHERE run_id = ANY(:now)"), ids)


def submit_run_txn(
    conn: Connection,
    request: RunRequest,
    config: JsonMapping,
    trace_context: str | None = None,
    *,
    request_digest: str | None = None,
    idempotency_ttl_s: int = DEFAULT_IDEMPOTENCY_TTL_S,
    agent: str | None = None,
) -> Submitted:
    """``submit_run`` on ``conn``, without committing (``_KeyRaced``: roll back, run again)."""
    if request.idempotency_key is not None:
        assert request_digest is not None, "a keyed submit carries the request's digest"
        existing = _existing_run(conn, request, request_digest, idempotency_ttl_s)
        if existing is not None:
            return existing
    root_id, root_seq = _take_root_turn(conn, request)
    to_cancel = runs_to_cancel(conn, request.root_policy, root_id, root_seq)
    run_id = uuid4()
    inserted = conn.execute(
        _INSERT_RUN_SQL,
        {
            "id": run_id,
            "root_id": root_id,
            "root_seq": root_seq,
            "owner": request.owner,
            "input": request.input,
            "config": json.dumps(config),
            "trace_context": trace_context,
            "webhook_url": None if request.webhook is None else request.webhook.url,
            "priority": request.priority,
            "idempotency_key": request.idempotency_key,
            "request_digest": request_digest,
            "root_policy": request.root_policy.value,
            "agent": agent,
        },
    ).one_or_none()
    if inserted is None:
        raise _KeyRaced()
    if to_cancel.all:
        _cancel_for(conn, request.root_policy, to_cancel, run_id)
    conn.execute(_CHECKPOINT_SQL, {"id": run_id, "root": root_id, "seq": root_seq, "rolled_back": ROLLED_BACK})
    conn.execute(
        text("INSERT INTO run_events (run_id, seq, kind, data) VALUES (:id, 1, 'run_queued', CAST(:data AS jsonb))"),
        {"id": run_id, "data": json.dumps({"root_id": str(root_id), "root_seq": root_seq})},
    )
    route = Route(request.owner, inserted.weight, request.priority)
    return Submitted(
        run_id=run_id, root_id=root_id, root_seq=root_seq, route=route, interrupted=to_cancel.all,
        interrupting=to_cancel.at_boundary,
    )


def submit_run(
    engine: Engine,
    request: RunRequest,
    config: JsonMapping,
    trace_context: str | None = None,
    *,
    request_digest: str | None = None,
    idempotency_ttl_s: int = DEFAULT_IDEMPOTENCY_TTL_S,
    agent: str | None = None,
) -> Submitted:
    """Store a validated run (its Root, checkpoint and first event) in one transaction,
    applying its ``root_policy``; or, for an ``idempotency_key`` the owner used within
    ``idempotency_ttl_s``, return that run (``existing``), storing nothing, when
    ``request_digest`` (the request's, without the key) is the same, else raise
    ``IdempotencyKeyReused``. ``RootBusy``: ``reject`` on a busy Root, nothing stored.
    The caller sends the first task only after this commits. ``trace_context``: the W3C
    traceparent of the run's trace, which every claim of the run hands back. ``agent``:
    the saved agent's NAME@VERSION the config was resolved from."""

    def txn(conn: Connection) -> Submitted:
        return submit_run_txn(
            conn, request, config, trace_context, request_digest=request_digest,
            idempotency_ttl_s=idempotency_ttl_s, agent=agent,
        )

    # The loser of a same-key race finds the winner's run on its second try.
    for _ in range(2):
        try:
            return run_transaction(engine, txn, name="submit_run")
        except _KeyRaced:
            continue
    return run_transaction(engine, txn, name="submit_run")


# --- ending a run outside a round ----------------------------------------------------------

_END_RUN_SQL = text(
    f"""
WITH target AS (
  -- Locked first (run rows before owner rows): its status is the one this ends, so a
  -- run that held a slot of its owner's cap gives it back exactly once.
  SELECT id, status FROM runs WHERE id = :run_id AND status IN ('queued', 'running', 'suspended') FOR UPDATE
), upd AS (
  UPDATE runs SET status = :status, lease_expires_at = NULL, error_code = :error_code,
    error_message = :error_message, event_seq = event_seq + 1, finished_at = now(), updated_at = now(),
    claim_fence = CASE WHEN :bump_fence THEN {next_fence_sql("runs.claim_fence")} ELSE runs.claim_fence END
  FROM target
  WHERE runs.id = target.id
    AND (CAST(:fence AS bigint) IS NULL OR runs.claim_fence = CAST(:fence AS bigint))
  RETURNING runs.id, runs.root_id, runs.root_seq, runs.owner, runs.event_seq, target.status AS was
), freed AS (
  UPDATE owners SET running = owners.running - 1 FROM upd
  WHERE owners.owner = upd.owner AND upd.was = 'running'
  RETURNING owners.owner, owners.max_running, owners.running
), ev AS (
  INSERT INTO run_events (run_id, seq, kind, data)
  SELECT id, event_seq, :event_kind, CAST(:event_data AS jsonb) FROM upd
)
SELECT upd.id, {next_runs_sql("freed", "upd", "true")}
FROM upd
"""
)


def end_run_txn(
    conn: Connection,
    run_id: UUID,
    *,
    fence: int | None,
    status: RunStatus,
    error_code: str,
    message: str,
    event_kind: str,
    bump_fence: bool | None = None,
) -> tuple[bool, tuple[UUID, ...]]:
    """End the run (``fence``: only under that claim; None: whatever holds it). The fence
    is bumped (by default when no fence is given), so no round under an older claim can
    commit after it."""
    row = conn.execute(
        _END_RUN_SQL,
        {
            "run_id": run_id,
            "fence": fence,
            "bump_fence": fence is None if bump_fence is None else bump_fence,
            "status": status.value,
            "error_code": error_code,
            "error_message": message,
            "event_kind": event_kind,
            "event_data": json.dumps({"error_code": error_code, "message": message}),
        },
    ).one_or_none()
    return (False, ()) if row is None else (True, next_runs(row))


def _end_run(
    engine: Engine,
    run_id: UUID,
    *,
    fence: int | None,
    status: RunStatus,
    error_code: str,
    message: str,
    event_kind: str,
) -> tuple[bool, tuple[UUID, ...]]:
    return run_transaction(
        engine,
        lambda conn: end_run_txn(
            conn, run_id, fence=fence, status=status, error_code=error_code, message=message, event_kind=event_kind
        ),
        name="end_run",
        single_statement=True,
    )


def fail_claimed_run_txn(
    conn: Connection, run_id: UUID, fence: int, error_code: str, message: str
) -> tuple[UUID, ...]:
    """Fail a run the caller holds (fenced: one statement, nothing written without the
    fence). Returns the queued runs to send (``next_runs``)."""
    ended, next_run_ids = end_run_txn(
        conn, run_id, fence=fence, status=RunStatus.FAILED, error_code=error_code, message=message,
        event_kind="run_failed",
    )
    if not ended:
        raise FenceLost(run_id, fence)
    return next_run_ids


def cancel_run(engine: Engine, run_id: UUID) -> tuple[bool, tuple[UUID, ...]]:
    """Cancel a run that has not ended. The fence is bumped, so a worker in the middle of
    a round cannot commit it. Returns (cancelled, the queued runs to send)."""
    return _end_run(
        engine,
        run_id,
        fence=None,
        status=RunStatus.CANCELLED,
        error_code=ErrorCode.CANCELLED,
        message="cancelled by request",
        event_kind="run_cancelled",
    )


def end_interrupted_run_txn(conn: Connection, run_id: UUID, fence: int) -> tuple[bool, tuple[UUID, ...]]:
    """End, cancelled, a run whose interrupt is pending and whose claim ``fence`` left it
    at a boundary without a commit (its holder died or gave it back; its next claim was
    refused). The fence is checked and bumped, so a holder of that claim cannot commit
    after it. Returns (ended, the queued runs to send)."""
    interrupter = conn.execute(
        text("SELECT interrupted_by FROM runs WHERE id = :id AND claim_fence = :fence FOR UPDATE"),
        {"id": run_id, "fence": fence},
    ).scalar_one_or_none()
    if interrupter is None:
        return False, ()
    code, message = cancel_message(RootPolicy.INTERRUPT, interrupter)
    return end_run_txn(
        conn, run_id, fence=fence, bump_fence=True, status=RunStatus.CANCELLED, error_code=code,
        message=message, event_kind="run_cancelled",
    )


# --- reading --------------------------------------------------------------------------------


_RUN_VIEW_SQL = (
    "SELECT r.id AS run_id, r.root_id, r.owner, r.status, r.boundary_seq AS rounds, "
    "calls.model_calls, calls.input_tokens, calls.output_tokens, calls.stale_model_calls, "
    "(SELECT rebuilds FROM run_checkpoints cp WHERE cp.run_id = r.id) AS rebuilds, r.agent, "
    "r.forked_from, r.forked_at_round, "
    "r.output, r.error_code, r.error_message, r.created_at, r.finished_at "
    "FROM runs r CROSS JOIN LATERAL ("
    "  SELECT count(*) AS model_calls, coalesce(sum(mc.input_tokens), 0) AS input_tokens,"
    "    coalesce(sum(mc.output_tokens), 0) AS output_tokens,"
    "    count(*) FILTER (WHERE mc.stale) AS stale_model_calls"
    "  FROM model_calls mc WHERE mc.run_id = r.id) AS calls "
    "WHERE r.id = :run_id"
)
_RUN_VIEWS = {False: text(_RUN_VIEW_SQL), True: text(_RUN_VIEW_SQL + " AND r.owner = :owner")}


def get_run_view(engine: Engine, run_id: UUID, *, owner: str | None = None) -> RunView:
    """The run's view; with ``owner``, a run of another owner is not found, by the same
    query that finds nothing for a missing id."""
    with engine.connect() as conn:
        row = conn.execute(_RUN_VIEWS[owner is not None], {"run_id": run_id, "owner": owner}).one_or_none()
        if row is None:
            raise RunNotFound(run_id)
        waiting = waiting_for(conn, run_id) if row.status in (RunStatus.SUSPENDED, RunStatus.RUNNING) else []
        if row.status == RunStatus.SUSPENDED:
            waiting = budget_waiting_for(conn, run_id) + waiting
        webhooks = deliveries_of(conn, run_id)
    return RunView.model_validate({**row._mapping, "waiting_for": waiting, "webhooks": webhooks})

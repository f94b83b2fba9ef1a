"""Leases and dispatch: the heartbeat, giving a claim back, and the reconciler's queries
(runs due for a re-send; runs whose holder died, taken over without waiting for the lease).

A lease exists (``runs.lease_expires_at`` is not NULL) exactly while a claim holds the
run and has not given it back: a claim sets it, and every write that gives the run back
(the round's commit, a release, the end of the run) sets it to NULL. A heartbeat only
*extends* a lease of its own fence that still exists; it never creates one. So a
heartbeat whose snapshot of held rounds was taken before a commit, a release or a newer
claim is a no-op whenever its statement lands: the commit and the release left no lease
to extend, and the newer claim changed the fence. (Matching the boundary would not be
enough: a suspended round's commit keeps the boundary, and a release keeps everything.)
"""

from __future__ import annotations

from typing import NamedTuple
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from schema.store.limits import waits_for_slot_sql
from schema.store.roots import earlier_active_sql
from schema.store.routes import weight_sql
from schema.store.rows import StoredRow
from schema.store.tx import run_transaction
from schema.wire.route import Route

# The same statement is the worker's own heartbeat in the registry (schema.store.workers),
# so a worker's leases and its liveness can never tell different stories.
EXTEND_LEASES_SQL = text(
    """
WITH alive AS (UPDATE workers SET heartbeat_at = now() WHERE id = CAST(:worker_id AS uuid))
UPDATE runs SET lease_expires_at = now() + make_interval(secs => :lease_s)
FROM unnest(CAST(:ids AS uuid[]), CAST(:fences AS bigint[])) AS h(id, fence)
WHERE runs.id = h.id AND runs.claim_fence = h.fence AND runs.status = 'running'
  AND runs.lease_expires_at IS NOT NULL
RETURNING runs.id
"""
)


def release_lease_txn(
    conn: Connection, run_id: UUID, fence: int, *, round_at_fault: bool, dispatch_after_s: float | None = None
) -> bool:
    """Give up a claim without committing a round (the round failed with an error).
    The run is redelivered by the reconciler. ``round_at_fault``: the round itself raised
    (a bug), so its started execution still counts as an attempt at the next claim;
    otherwise (a dependency was unavailable) the execution is forgotten.
    ``dispatch_after_s``: the caller re-sends the round with this countdown (a rate limit's
    wait), so the run counts as dispatched then and the reconciler's grace starts there."""
    result = conn.execute(
        text(
            "UPDATE runs SET lease_expires_at = NULL, updated_at = now(), "
            "  execution_fence = CASE WHEN :at_fault THEN execution_fence END, "
            "  dispatched_at = CASE WHEN CAST(:after_s AS float8) IS NULL THEN dispatched_at "
            "    ELSE now() + make_interval(secs => CAST(:after_s AS float8)) END "
            "WHERE id = :run_id AND claim_fence = :fence AND status = 'running'"
        ),
        {"run_id": run_id, "fence": fence, "at_fault": round_at_fault, "after_s": dispatch_after_s},
    )
    return result.rowcount == 1


def dispatch_failed_txn(conn: Connection, run_id: UUID) -> None:
    """The task for this run could not be sent (the broker is down): make the run due for
    the reconciler's next pass at once, instead of after the dispatch grace."""
    conn.execute(
        text(
            "UPDATE runs SET dispatched_at = '-infinity' "
            "WHERE id = :run_id AND status IN ('queued', 'running', 'suspended')"
        ),
        {"run_id": run_id},
    )


def extend_leases_txn(
    conn: Connection, holdings: list[tuple[UUID, int]], lease_s: float, *, worker_id: UUID | None = None
) -> set[UUID]:
    rows = conn.execute(
        EXTEND_LEASES_SQL,
        {
            "ids": [r for r, _ in holdings],
            "fences": [f for _, f in holdings],
            "lease_s": lease_s,
            "worker_id": worker_id,
        },
    )
    return {row.id for row in rows}


def extend_leases(
    engine: Engine, holdings: list[tuple[UUID, int]], lease_s: float, *, worker_id: UUID | None = None
) -> set[UUID]:
    """Heartbeat for every round this process holds, and for the process itself (its
    ``worker_id`` in the registry), in one statement. Returns the run ids whose lease was
    extended; the others were given back (committed, released) or taken over since
    ``holdings`` was read."""
    if not holdings and worker_id is None:
        return set()

    return run_transaction(
        engine,
        lambda conn: extend_leases_txn(conn, holdings, lease_s, worker_id=worker_id),
        name="extend_leases",
        single_statement=True,
    )


# --- reconcile ------------------------------------------------------------------------------

MAX_BACKOFF_S = 3600.0

# A round whose execution failed before (round_attempts > 0) and failed again (its
# execution_fence is still set: the holder died or raised) is sent again only after a
# backoff from when its lease ran out or was given back: 0, 1, 3, 7 ... times grace_s. A
# burst of worker deaths then spreads a healthy round's attempts out in time instead of
# spending them all at once; the first retry after a crash is as prompt as ever.
# What a sender needs to send a run's next task: its boundary, whether the round stored
# there is a suspended one to resume, and its route.
_DUE_COLUMNS = f"""runs.id, runs.boundary_seq,
  EXISTS (SELECT 1 FROM rounds AS r WHERE r.run_id = runs.id AND r.boundary_seq = runs.boundary_seq) AS resume,
  runs.owner, runs.priority, {weight_sql("runs")} AS weight"""

RECONCILE_SQL = text(
    f"""
WITH due AS (
  SELECT id FROM runs AS r
  WHERE r.status IN ('queued', 'running')
    AND r.dispatched_at < now() - make_interval(secs => :grace_s)
    AND (r.lease_expires_at IS NULL OR r.lease_expires_at < now())
    AND (r.execution_fence IS DISTINCT FROM r.claim_fence
         OR coalesce(r.lease_expires_at, r.updated_at)
            < now() - make_interval(secs => least(:grace_s * (power(2, r.round_attempts) - 1), :max_backoff_s)))
    AND NOT {earlier_active_sql("r")}
    AND NOT {waits_for_slot_sql("r")}
  ORDER BY r.dispatched_at
  LIMIT :limit
  FOR UPDATE SKIP LOCKED
)
UPDATE runs SET dispatched_at = now() FROM due WHERE runs.id = due.id
RETURNING {_DUE_COLUMNS}
"""
)


class Due(NamedTuple):
    run_id: UUID
    boundary_seq: int
    resume: bool
    route: Route  # a re-send routes as the first send did (runtime.shares)


def _due(row: StoredRow) -> Due:
    return Due(row.id, row.boundary_seq, row.resume, Route(row.owner, row.weight, row.priority))


def due_for_dispatch_txn(conn: Connection, *, grace_s: float, limit: int = 500) -> list[Due]:
    result = conn.execute(RECONCILE_SQL, {"grace_s": grace_s, "limit": limit, "max_backoff_s": MAX_BACKOFF_S})
    return [_due(r) for r in result]


_DUE_OF_SQL = text(f"SELECT {_DUE_COLUMNS} FROM runs WHERE runs.id = :run_id")


def due_of_txn(conn: Connection, run_id: UUID, owner: str | None = None) -> Due:
    """What to send a run that a statement named as the next to start (a Root's next, an
    owner's next in a freed slot): a round at its boundary, or the resume of its suspended
    round (a run that got its inputs while its owner's cap was full waits queued). A run
    that is gone routes by ``owner`` (its claim drops the message)."""
    row = conn.execute(_DUE_OF_SQL, {"run_id": run_id}).one_or_none()
    return Due(run_id, 0, False, Route(owner or "")) if row is None else _due(row)


def due_for_dispatch(engine: Engine, *, grace_s: float, limit: int = 500) -> list[Due]:
    """Runs that should be executing but have no live task: their lease expired (a
    crashed or paused worker) or their last task was sent more than ``grace_s`` ago and
    never claimed (a lost message). Marks them dispatched now; the caller sends tasks.
    Each is ``(run_id, boundary_seq, resume, route)``: ``resume`` when the round at that
    boundary is a suspended one whose inputs have all arrived."""
    return run_transaction(
        engine,
        lambda conn: due_for_dispatch_txn(conn, grace_s=grace_s, limit=limit),
        name="reconcile",
        single_statement=True,
    )


# --- dead holders ---------------------------------------------------------------------------

# A run held by a dead worker (schema.store.workers: silent past AIDAWORK_WORKER_DEAD_AFTER_S,
# never stopped) is treated as if its lease had run out, seconds after the death instead of
# a lease later: one statement marks the dead workers (``dead_at``, which the claim's
# DEATH_ELSEWHERE reads), expires the lease of every run whose current holder (the last of
# ``round_holders``) is one of them, and marks dispatched those it hands back, which the
# caller sends. Expiring the lease is all a claim needs: it takes a run whose lease ran out,
# and counts the holder's death as it would at the lease's end (the lease stays set: a
# death, not a give-back). A run whose round has failed before and failed again keeps the
# reconciler's backoff (RECONCILE_SQL, measured from this expiry): its lease expires here,
# and the reconciler sends it once the backoff has passed.
#
# Only deaths younger than a lease are looked at (``:lease_s``): an older one's leases ran
# out anyway. So the statement reads nothing but an index of ``workers`` (ix_workers_
# heartbeat_at) while nobody died, and touches the live runs only in the lease after a death.
# ``:dead_after_s`` NULL matches no worker: beat's probe while it cannot yet trust the silence
# it sees (worker.engine.reconcile). Nor does a worker whose heartbeats may be further apart
# than half the limit (``workers.heartbeat_s``: another configuration, or older code, which
# heartbeats every lease_s / 3): one late heartbeat must not read as a death.
TAKE_OVER_DEAD_SQL = text(
    f"""
WITH dead AS (
  SELECT id FROM workers
  WHERE stopped_at IS NULL AND heartbeat_s * 2 <= CAST(:dead_after_s AS float8)
    AND heartbeat_at < now() - make_interval(secs => CAST(:dead_after_s AS float8))
    AND heartbeat_at > now() - make_interval(secs => CAST(:dead_after_s AS float8) + :lease_s)
), marked AS (
  UPDATE workers SET dead_at = now() FROM dead
  WHERE workers.id = dead.id AND (workers.dead_at IS NULL OR workers.dead_at < workers.heartbeat_at)
  RETURNING workers.id
), held AS (
  SELECT r.id, (r.execution_fence IS DISTINCT FROM r.claim_fence OR r.round_attempts = 0) AS send
  FROM runs AS r JOIN dead ON dead.id = r.round_holders[cardinality(r.round_holders)]
  WHERE r.status = 'running' AND r.lease_expires_at > now()
  FOR UPDATE OF r SKIP LOCKED
), taken AS (
  UPDATE runs SET lease_expires_at = now(),
    dispatched_at = CASE WHEN held.send THEN now() ELSE runs.dispatched_at END
  FROM held WHERE runs.id = held.id
  RETURNING {_DUE_COLUMNS}, held.send, runs.round_holders[cardinality(runs.round_holders)] AS holder
)
SELECT m.newly_dead, taken.*
FROM (SELECT coalesce(array_agg(id), CAST('{{}}' AS uuid[])) AS newly_dead FROM marked) AS m
LEFT JOIN taken ON true
"""
)


class DeadHolders(NamedTuple):
    """What one pass over the dead did: the workers it found dead since the last pass, the
    runs it sends now, and the runs whose lease it expired for the reconciler to send after
    their backoff; the runs named with the dead worker that held each."""

    newly_dead: list[UUID]
    sent: list[tuple[Due, UUID]]
    backing_off: list[tuple[UUID, UUID]]


def take_over_dead_holders_txn(conn: Connection, *, dead_after_s: float | None, lease_s: float) -> DeadHolders:
    result = DeadHolders([], [], [])
    for row in conn.execute(TAKE_OVER_DEAD_SQL, {"dead_after_s": dead_after_s, "lease_s": lease_s}):
        result.newly_dead[:] = row.newly_dead
        if row.id is None:  # nobody's runs: the one row that carries the dead
            continue
        if row.send:
            result.sent.append((_due(row), row.holder))
        else:
            result.backing_off.append((row.id, row.holder))
    return result


def take_over_dead_holders(engine: Engine, *, dead_after_s: float | None, lease_s: float) -> DeadHolders:
    """Expire the leases held by workers silent for more than ``dead_after_s`` (no worker:
    None), and mark dispatched the runs to send now (``TAKE_OVER_DEAD_SQL``)."""
    return run_transaction(
        engine,
        lambda conn: take_over_dead_holders_txn(conn, dead_after_s=dead_after_s, lease_s=lease_s),
        name="take_over_dead_holders",
        single_statement=True,
    )

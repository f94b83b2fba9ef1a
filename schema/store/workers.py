"""The registry of worker processes: each registers once, heartbeats (its leases ride on
the same statement, ``schema.store.leases.extend_leases``) whether it holds rounds or not,
and says when it stops. A registered worker that never said it stopped and whose heartbeat
is older than AIDAWORK_WORKER_DEAD_AFTER_S has died (SIGKILL, OOM, a lost node): beat
marks it (``dead_at``) and hands its runs on at once
(``schema.store.leases.take_over_dead_holders``). One silent for a lease has died too,
marked or not (no beat was running to mark it).

It exists first to tell a round's fault from the cluster's: a claim excuses the death of the
round's holder when a worker that never held the round died around the same time
(``DEATH_ELSEWHERE`` below, used by the claim in ``schema.store.claims``). A poison round
kills only the workers that run it; a storm of kills, a lost node or an OOM wave kills
workers whatever they run.
"""

from __future__ import annotations

from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine, text

from schema.store.compat import CODE_LEVEL, check_code_level_txn
from schema.store.tx import run_transaction

# How near in time another worker's death must be to the holder's to be the same loss.
# A death is dated by the worker's last heartbeat; two leases either side spans several
# kills of a storm that kills every half lease, even when some of its victims died too
# early to have registered (still booting).
DEATH_WINDOW_LEASES = 2

# Evaluated in the claim's UPDATE of ``runs``, on the row as it was before the claim, whose
# last holder (the last of ``round_holders``) died executing the round: some registered
# worker that never held the round died (no stop, and beat found it dead with no heartbeat
# since, or no heartbeat for a lease) within DEATH_WINDOW_LEASES leases of that holder's
# last heartbeat. A holder missing from the registry, or a worker that stopped on purpose,
# excuses nothing.
#
# Beat's mark is what keeps this true when a dead holder's round is claimed seconds after
# the death, long before a lease has passed: a worker killed with it (the same node, the
# same storm) is marked by then, since it fell as silent as the holder at the same time.
DEATH_ELSEWHERE = f"""
    EXISTS (SELECT 1 FROM workers AS holder, workers AS w
            WHERE holder.id = runs.round_holders[cardinality(runs.round_holders)]
              AND w.stopped_at IS NULL
              AND (w.dead_at >= w.heartbeat_at OR w.heartbeat_at < now() - make_interval(secs => :lease_s))
              AND w.heartbeat_at BETWEEN holder.heartbeat_at - make_interval(secs => {DEATH_WINDOW_LEASES} * :lease_s)
                                     AND holder.heartbeat_at + make_interval(secs => {DEATH_WINDOW_LEASES} * :lease_s)
              AND w.id <> ALL(runs.round_holders))
"""

# Rows of workers dead or stopped this long ago say nothing about any claim still to come.
FORGET_AFTER_S = 86_400.0


def register_worker_txn(
    conn: Connection, worker_id: UUID, name: str, code_level: int = CODE_LEVEL, *, heartbeat_s: float | None = None
) -> None:
    """Refused (``SchemaIncompatible``, nothing written) when the schema needs a higher code
    level than ``code_level`` (``schema.store.compat``)."""
    check_code_level_txn(conn, code_level)
    conn.execute(
        text(
            "INSERT INTO workers (id, name, code_level, heartbeat_s) VALUES (:id, :name, :level, :heartbeat_s) "
            "ON CONFLICT (id) DO NOTHING"
        ),
        {"id": worker_id, "name": name, "level": code_level, "heartbeat_s": heartbeat_s},
    )


def register_worker(
    engine: Engine, name: str, code_level: int = CODE_LEVEL, *, heartbeat_s: float | None = None
) -> UUID:
    """Add this process to the registry; its heartbeat starts now, and comes every
    ``heartbeat_s`` (None: no promise, so beat never takes its silence for a death and its
    runs move when their leases run out)."""
    worker_id = uuid4()

    run_transaction(
        engine,
        lambda conn: register_worker_txn(conn, worker_id, name, code_level, heartbeat_s=heartbeat_s),
        name="register_worker",
    )
    return worker_id


def stop_worker_txn(conn: Connection, worker_id: UUID) -> None:
    conn.execute(text("UPDATE workers SET stopped_at = now() WHERE id = :id"), {"id": worker_id})


def stop_worker(engine: Engine, worker_id: UUID) -> None:
    """This process is stopping on purpose (a warm shutdown, a deploy): its silence from
    now on is no evidence of anything."""
    run_transaction(engine, lambda conn: stop_worker_txn(conn, worker_id), name="stop_worker", single_statement=True)


def forget_old_workers_txn(conn: Connection, *, older_than_s: float = FORGET_AFTER_S) -> int:
    result = conn.execute(
        text("DELETE FROM workers WHERE heartbeat_at < now() - make_interval(secs => :s)"), {"s": older_than_s}
    )
    return int(result.rowcount)


def forget_old_workers(engine: Engine, *, older_than_s: float = FORGET_AFTER_S) -> int:
    """Delete the rows of workers silent for longer than ``older_than_s`` (the reconciler
    calls this), so the registry holds roughly the workers of the last day."""
    return run_transaction(
        engine,
        lambda conn: forget_old_workers_txn(conn, older_than_s=older_than_s),
        name="forget_old_workers",
        single_statement=True,
    )

"""Owner limits: storing and showing them (``aidawork owner set/show/list``), and the SQL
fragments the concurrency cap adds to the claim, the commit, the end of a run, a resume
and the reconciler.

The cap is the locked counter ``owners.running``: every statement that moves a run of an
owner with a row into or out of ``running`` changes it in the same statement, under the
owner row's lock (the claim checks the room and takes the slot; the commit, the end of a
run and a suspension give it back). Statements lock the run row before the owner row, so
two of them never wait on each other in a cycle. An owner without a row has no cap and
its statements write no counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from uuid import UUID

from sqlalchemy import Connection, Engine, TextClause, text

from schema.store.roots import earlier_active_sql, next_in_root_sql
from schema.store.rows import StoredRow
from schema.store.tx import run_transaction
from schema.wire.owners import OwnerLimits, OwnerLimitsChange, OwnerLimitsInvalid

# --- the cap's fragments ----------------------------------------------------------------


def at_capacity_sql(alias: str) -> str:
    """True while the owner of run row ``alias`` has a cap and every slot is held: its
    queued runs wait (the reconciler does not re-send them, a refused claim says so)."""
    return (
        f"EXISTS (SELECT 1 FROM owners AS cap WHERE cap.owner = {alias}.owner "
        "AND cap.max_running IS NOT NULL AND cap.running >= cap.max_running)"
    )


def next_of_owner_sql(owner: str, free: str) -> str:
    """The queued run of ``owner`` to start when a slot frees: the ``free``-th oldest
    whose Root's turn it is (submission order). Not the first: each slot freed before it
    has already handed the older ones a task, which may not have claimed yet.

    Locked, so each candidate's status is read as it is now rather than in the
    statement's snapshot (a run claimed since then no longer counts, just as the counter
    read under the owner row's lock already counts it); SKIP LOCKED, because a run being
    claimed right now holds its row and waits for the owner row this statement holds."""
    return f"""
    (SELECT q.id FROM runs AS q
     WHERE {free} > 0 AND q.owner = {owner} AND q.status = 'queued' AND NOT {earlier_active_sql("q")}
     ORDER BY q.created_at, q.id OFFSET greatest({free} - 1, 0) LIMIT 1
     FOR UPDATE OF q SKIP LOCKED)"""


def next_runs_sql(freed: str, upd: str, ended: str) -> str:
    """The two columns of a statement that gives a run's slot back (CTE ``freed``, the
    owner row it updated) or ends it (``ended``; ``upd``: the run row) naming the queued
    runs to send: ``owner_next``, the owner's next one for the freed slot, and
    ``root_next``, the Root's next run, whose turn it now is. Both are sent
    (``next_runs``): each one's claim decides, under the locks, whether it may start."""
    return f"""(SELECT {next_of_owner_sql(f"{freed}.owner", f"{freed}.max_running - {freed}.running")} FROM {freed})
      AS owner_next,
    CASE WHEN {ended} THEN {next_in_root_sql(upd)} END AS root_next"""


def next_runs(row: StoredRow) -> tuple[UUID, ...]:
    """The distinct runs a ``next_runs_sql`` row names, the owner's first."""
    return tuple(dict.fromkeys(r for r in (row.owner_next, row.root_next) if r is not None))


def waits_for_slot_sql(alias: str) -> str:
    """True for a queued run of ``alias``'s owner that no free slot of its cap is for:
    as many of the owner's oldest startable queued runs as it has free slots are due,
    the rest wait (the reconciler does not keep re-sending them). Bounded: it counts at
    most ``free`` older runs."""
    return f"""({alias}.status = 'queued' AND EXISTS (
      SELECT 1 FROM owners AS cap WHERE cap.owner = {alias}.owner AND cap.max_running IS NOT NULL
        AND (SELECT count(*) FROM (
               SELECT 1 FROM runs AS older
               WHERE older.owner = {alias}.owner AND older.status = 'queued'
                 AND (older.created_at, older.id) < ({alias}.created_at, {alias}.id)
                 AND NOT {earlier_active_sql("older")}
               LIMIT greatest(cap.max_running - cap.running, 0)) AS ahead)
            >= cap.max_running - cap.running))"""


# --- managing limits ----------------------------------------------------------------------

_COLUMNS = "owner, max_running, weight, token_budget, budget_window, on_budget, running, created_at, updated_at"

_CREATE_SQL = text("INSERT INTO owners (owner) VALUES (:owner) ON CONFLICT (owner) DO NOTHING")

# The owner's live runs are locked first (the order every statement takes: runs, then the
# owner row), so a claim that was already under way when the row appeared has finished
# before the count, and the count is what its runs hold now.
_LOCK_SQL = text(
    """
WITH live AS (SELECT status FROM runs WHERE owner = :owner AND status IN ('queued', 'running') FOR UPDATE)
SELECT (SELECT count(*) FROM live WHERE status = 'running') AS running,
       o.token_budget, o.budget_window
FROM owners AS o WHERE o.owner = :owner FOR UPDATE OF o
"""
)

_RECOUNT_SQL = text(
    """
SELECT count(*) FROM runs WHERE owner = :owner AND status = 'running'
"""
)


def _apply_sql(given: Mapping[str, object]) -> TextClause:
    sets = ", ".join(f"{name} = :{name}" for name in given)
    return text(
        f"UPDATE owners SET {sets + ', ' if sets else ''}running = :running, updated_at = now() "
        f"WHERE owner = :owner RETURNING {_COLUMNS}"
    )


def _check_against(stored: StoredRow, change: OwnerLimitsChange) -> dict[str, object]:
    """The columns to write: a budget given without a window keeps the stored window (or
    is refused); a cleared budget clears its window."""
    given = change.given()
    if "token_budget" in given and given["token_budget"] is None:
        given["budget_window"] = None
    elif given.get("token_budget") is not None and "budget_window" not in given and stored.budget_window is None:
        raise OwnerLimitsInvalid("budget_window", "required with token_budget (1h, 1d or 30d)")
    elif "budget_window" in given and "token_budget" not in given and stored.token_budget is None:
        raise OwnerLimitsInvalid("token_budget", "required with budget_window")
    return given


def set_owner_limits_txn(conn: Connection, owner: str, change: OwnerLimitsChange) -> OwnerLimits:
    stored = conn.execute(_LOCK_SQL, {"owner": owner}).one()
    given = _check_against(stored, change)
    # Under the owner row's lock every counter change is serialised behind this one, so
    # this count (a fresh snapshot, taken after the lock) is exact: a cap set on an owner
    # with runs under way counts them, and any drift is repaired.
    running = conn.execute(_RECOUNT_SQL, {"owner": owner}).scalar_one()
    row = conn.execute(_apply_sql(given), {**given, "owner": owner, "running": running}).one()
    return OwnerLimits.model_validate({**row._mapping, "stored": True})


def set_owner_limits(engine: Engine, owner: str, change: OwnerLimitsChange) -> OwnerLimits:
    """Upsert ``owner``'s limits: only the fields ``change`` names change. Raises
    ``OwnerLimitsInvalid`` (nothing stored) for a budget without a window."""
    # The row is created (and committed) first, on its own: a claim that starts after
    # that sees it and takes the owner row's lock, so the count below cannot miss it. (A
    # claim whose statement began before the row existed writes no counter: the
    # reconciler's recount, ``repair_running_counters``, heals that within a pass.)
    run_transaction(engine, lambda conn: conn.execute(_CREATE_SQL, {"owner": owner}), name="owner_created")
    try:
        limits = run_transaction(engine, lambda conn: set_owner_limits_txn(conn, owner, change), name="owner_set")
    except OwnerLimitsInvalid:
        _forget_if_bare(engine, owner)
        raise
    return limits


def _forget_if_bare(engine: Engine, owner: str) -> None:
    # A refused first ``set`` leaves no row behind: nothing partial is stored.
    run_transaction(
        engine,
        lambda conn: conn.execute(
            text(
                "DELETE FROM owners WHERE owner = :owner AND max_running IS NULL AND weight = 1 "
                "AND token_budget IS NULL AND on_budget = 'fail' AND created_at = updated_at"
            ),
            {"owner": owner},
        ),
        name="owner_forgotten",
    )


# Every statement moves a run and its owner's counter together, so one snapshot always
# shows them equal; an owner whose counter disagrees with its running runs in a snapshot
# has really drifted (a claim that began before the owner's row existed, an operator's
# hand edit).
_DRIFTED_SQL = text(
    """
SELECT o.owner FROM owners AS o
WHERE o.running <> (SELECT count(*) FROM runs AS r WHERE r.owner = o.owner AND r.status = 'running')
ORDER BY o.owner LIMIT :limit
"""
)


def _recount_txn(conn: Connection, *, owner: str) -> tuple[int, int] | None:
    stored = conn.execute(_LOCK_SQL, {"owner": owner}).one_or_none()
    if stored is None:
        return None
    was = conn.execute(text("SELECT running FROM owners WHERE owner = :owner"), {"owner": owner}).scalar_one()
    running = conn.execute(_RECOUNT_SQL, {"owner": owner}).scalar_one()
    if running != was:
        conn.execute(text("UPDATE owners SET running = :running WHERE owner = :owner"),
                     {"owner": owner, "running": running})
    return int(was), int(running)


def repair_running_counters(engine: Engine, *, limit: int = 100) -> dict[str, tuple[int, int]]:
    """Recount, under the same locks as ``owner set``, the counter of every owner whose
    counter differs from its running runs; returns ``{owner: (was, now)}`` for each one
    repaired. Run by the reconciler, so a drifted counter heals within a pass."""
    with engine.connect() as conn:
        drifted = [row.owner for row in conn.execute(_DRIFTED_SQL, {"limit": limit})]
    repaired = {}
    for owner in drifted:
        counts = run_transaction(engine, partial(_recount_txn, owner=owner), name="owner_recount")
        if counts is not None and counts[0] != counts[1]:
            repaired[owner] = counts
    return repaired


def get_owner_limits(engine: Engine, owner: str) -> OwnerLimits:
    """``owner``'s limits; the defaults (``stored`` False) for an owner without a row."""
    with engine.connect() as conn:
        row = conn.execute(text(f"SELECT {_COLUMNS} FROM owners WHERE owner = :owner"), {"owner": owner}).one_or_none()
        if row is None:
            running = conn.execute(_RECOUNT_SQL, {"owner": owner}).scalar_one()
            return OwnerLimits(owner=owner, running=running)
    return OwnerLimits.model_validate({**row._mapping, "stored": True})


def list_owner_limits(engine: Engine) -> list[OwnerLimits]:
    """Every owner that has a row, by name."""
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {_COLUMNS} FROM owners ORDER BY owner")).all()
    return [OwnerLimits.model_validate({**row._mapping, "stored": True}) for row in rows]

"""Retention: deleting the Roots whose runs have all ended before a cutoff, with every row
they own (``aidawork prune`` and beat's retention pass, ``worker.ops.retention``).

The rule. A Root's messages are shared by its runs: a later run's context reads the
earlier runs' messages (from its ``run_checkpoints.context_start_position`` on), and its
rebuilds are chained across runs. So the unit of deletion is the whole Root, never a run
alone: a Root goes when

- every run of it has ended (completed, failed, cancelled): none is queued, running or
  suspended, so no run reads its messages any more; and
- every run of it ended before the cutoff (the newest ``finished_at`` is older); and
- none of its runs has a webhook delivery still pending (it goes once the delivery
  succeeded or was given up).

A Root with a live run keeps all of its runs, however old the earlier ones are; they go
with the Root once its last run has ended and aged.

Racing a submit. A submit to an existing Root locks the Root row (``UPDATE roots ...``
in ``schema.store.runs.submit_run_txn``). A prune batch locks its candidate Roots ``FOR
UPDATE SKIP LOCKED`` (a Root being submitted to is skipped, and taken by a later pass),
and only then decides, in a statement of its own (a fresh snapshot under READ
COMMITTED, so a submit that committed just before the lock is seen), which of them are
still prunable. A submit that comes after the lock waits for it, then finds the Root
gone and fails with ROOT_NOT_FOUND; nothing of it is stored.

Batches. A batch scans the oldest ``limit`` expired ended runs (``ix_runs_finished_at``,
after a cursor, so Roots that must stay do not hold up the ones behind them), and
deletes the prunable Roots among theirs, each whole, in one transaction: at most
``limit`` Roots, and about ``limit`` runs (the runs scanned plus any other runs of their
Roots). A pass is batches until one scans fewer than ``limit`` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from schema.store.budgets import BUDGET_WINDOWS_S
from schema.store.tx import run_transaction

ENDED = "('completed', 'failed', 'cancelled')"

# Every table holding a Root's or a run's rows, children first (the order of the
# DELETEs), each with the rows of the Roots ``:roots`` (whose runs are ``:runs``).
# tests/unit/test_retention_tables.py holds this to every foreign key in schema.tables.
ROWS: tuple[tuple[str, str], ...] = (
    (
        "runtime_work_model_rebuild_consumptions",
        "build_id IN (SELECT b.id FROM runtime_work_model_rebuilds AS b WHERE b.root_id = ANY(:roots))",
    ),
    ("runtime_work_model_rebuilds", "root_id = ANY(:roots)"),
    ("messages", "root_id = ANY(:roots)"),
    ("webhook_deliveries", "run_id = ANY(:runs)"),
    ("model_calls", "run_id = ANY(:runs)"),
    ("run_events", "run_id = ANY(:runs)"),
    ("tool_executions", "run_id = ANY(:runs)"),
    ("tool_answers", "run_id = ANY(:runs)"),
    ("prerequisites", "run_id = ANY(:runs)"),
    ("local_reads", "run_id = ANY(:runs)"),
    ("tool_invocations", "run_id = ANY(:runs)"),
    ("rounds", "run_id = ANY(:runs)"),
    ("run_checkpoints", "run_id = ANY(:runs)"),
    ("runs", "root_id = ANY(:roots)"),
    ("roots", "id = ANY(:roots)"),
)
TABLES = tuple(table for table, _ in ROWS)

# An owner's spend per budget window (schema.store.budgets) belongs to no run: a window's
# row is history, and goes with a pass, once even the longest window starting then ended
# before the cutoff, with nothing reserved in it any more.
SPEND_TABLE = "owner_spend"
_SPEND_EXPIRED = (
    f"window_start + make_interval(secs => {max(BUDGET_WINDOWS_S.values())}) < :cutoff AND reserved = 0"
)
_SPEND_COUNT = text(f"SELECT count(*) FROM {SPEND_TABLE} WHERE {_SPEND_EXPIRED}")
_SPEND_DELETE = text(f"DELETE FROM {SPEND_TABLE} WHERE {_SPEND_EXPIRED}")
# What a pass reports, per table.
REPORTED = (*TABLES, SPEND_TABLE)

# Whether the Root row ``ro`` may go (see the module's rule).
_PRUNABLE = f"""
  NOT EXISTS (SELECT 1 FROM runs AS o WHERE o.root_id = ro.id
              AND NOT (o.status IN {ENDED} AND o.finished_at < :cutoff))
  AND NOT EXISTS (SELECT 1 FROM runs AS o JOIN webhook_deliveries AS wd ON wd.run_id = o.id
                  WHERE o.root_id = ro.id AND wd.status = 'pending')
"""

_SCAN = f"""
SELECT r.id, r.root_id, r.finished_at FROM runs AS r
WHERE r.status IN {ENDED} AND r.finished_at < :cutoff {{after}}
ORDER BY r.finished_at, r.id LIMIT :limit
"""
_SCAN_FIRST = text(_SCAN.format(after=""))
_SCAN_AFTER = text(_SCAN.format(after="AND (r.finished_at, r.id) > (:after_at, :after_id)"))

# The submit that locks a Root first wins: that Root is skipped, not waited for.
_LOCK = text("SELECT id FROM roots WHERE id = ANY(:roots) ORDER BY id FOR UPDATE SKIP LOCKED")

_PRUNABLE_RUNS = text(
    f"SELECT ro.id AS root_id, r.id AS run_id FROM roots AS ro JOIN runs AS r ON r.root_id = ro.id "
    f"WHERE ro.id = ANY(:roots) AND {_PRUNABLE}"
)

# For a dry run: every prunable Root at once (no lock: nothing is deleted).
_ALL_PRUNABLE_RUNS = text(
    f"SELECT ro.id AS root_id, r.id AS run_id FROM roots AS ro JOIN runs AS r ON r.root_id = ro.id "
    f"WHERE ro.id IN (SELECT e.root_id FROM runs AS e WHERE e.status IN {ENDED} AND e.finished_at < :cutoff) "
    f"AND {_PRUNABLE}"
)

# Rebuild consumptions are immutable (a trigger, migration 0004) except to a transaction
# that says it prunes, and then only those of ended runs (migration 0017).
_DECLARE_PRUNE = text("SELECT set_config('aidawork.pruning', 'on', true)")

_COUNTS = {table: text(f"SELECT count(*) FROM {table} WHERE {where}") for table, where in ROWS}
_DELETES = {table: text(f"DELETE FROM {table} WHERE {where}") for table, where in ROWS}


@dataclass(frozen=True)
class Cursor:
    """Where a pass's scan of expired runs stands: after this run (finished_at, id)."""

    finished_at: datetime
    run_id: UUID


@dataclass(frozen=True)
class Pruned:
    """What a batch deleted, or what a dry run would delete: Roots, runs, rows per table
    (``TABLES``; ``runs`` and ``roots`` among them)."""

    roots: int = 0
    runs: int = 0
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPORTED, 0))

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(
            roots=self.roots + other.roots,
            runs=self.runs + other.runs,
            rows={t: self.rows.get(t, 0) + other.rows.get(t, 0) for t in REPORTED},
        )


@dataclass(frozen=True)
class Batch:
    pruned: Pruned
    scanned: int  # expired runs the batch's scan found; fewer than its limit: the pass is done
    cursor: Cursor | None  # where the next batch of the pass scans from


def database_cutoff(engine: Engine, older_than_s: float) -> datetime:
    """``older_than_s`` before the database's clock (not this host's): runs that ended
    before it are expired."""
    with engine.connect() as conn:
        value = conn.execute(
            text("SELECT now() - make_interval(secs => :s)"), {"s": float(older_than_s)}
        ).scalar_one()
    return value  # type: ignore[no-any-return]


def _rows_of(conn: Connection, roots: list[UUID], runs: list[UUID], *, delete: bool) -> dict[str, int]:
    params = {"roots": roots, "runs": runs}
    if delete:
        rows = {table: int(conn.execute(_DELETES[table], params).rowcount) for table in TABLES}
    else:
        rows = {table: int(conn.execute(_COUNTS[table], params).scalar_one()) for table in TABLES}
    return {**rows, SPEND_TABLE: 0}  # spend windows go by their own statement


def _group(found: list[tuple[UUID, UUID]]) -> tuple[list[UUID], list[UUID]]:
    roots = list(dict.fromkeys(root for root, _ in found))
    return roots, [run for _, run in found]


def prune_batch_txn(
    conn: Connection,
    *,
    cutoff: datetime,
    limit: int,
    after: Cursor | None = None,
    after_scan: Callable[[], None] | None = None,
) -> Batch:
    """One batch (see the module): scan, lock, decide, delete; never commits.
    ``after_scan``: for tests, called between the scan and the lock."""
    params = {"cutoff": cutoff, "limit": limit}
    if after is None:
        scanned = conn.execute(_SCAN_FIRST, params).all()
    else:
        scanned = conn.execute(_SCAN_AFTER, {**params, "after_at": after.finished_at, "after_id": after.run_id}).all()
    cursor = Cursor(scanned[-1].finished_at, scanned[-1].id) if scanned else after
    if after_scan is not None:
        after_scan()
    candidates = list(dict.fromkeys(row.root_id for row in scanned))
    locked = [row.id for row in conn.execute(_LOCK, {"roots": candidates})] if candidates else []
    if not locked:
        return Batch(Pruned(), len(scanned), cursor)
    found = conn.execute(_PRUNABLE_RUNS, {"roots": locked, "cutoff": cutoff})
    roots, runs = _group([(r.root_id, r.run_id) for r in found])
    if not roots:
        return Batch(Pruned(), len(scanned), cursor)
    conn.execute(_DECLARE_PRUNE)
    rows = _rows_of(conn, roots, runs, delete=True)
    return Batch(Pruned(roots=rows["roots"], runs=rows["runs"], rows=rows), len(scanned), cursor)


def prune_batch(
    engine: Engine,
    *,
    cutoff: datetime,
    limit: int,
    after: Cursor | None = None,
    after_scan: Callable[[], None] | None = None,
) -> Batch:
    """Delete one batch of expired Roots, whole, in one transaction."""
    return run_transaction(
        engine,
        lambda conn: prune_batch_txn(conn, cutoff=cutoff, limit=limit, after=after, after_scan=after_scan),
        name="prune_batch",
    )


def prune_spend(engine: Engine, *, cutoff: datetime) -> Pruned:
    """Delete the owners' expired spend windows (``_SPEND_EXPIRED``), in one statement."""
    deleted = run_transaction(
        engine, lambda conn: int(conn.execute(_SPEND_DELETE, {"cutoff": cutoff}).rowcount), name="prune_spend",
        single_statement=True,
    )
    return Pruned(rows={**dict.fromkeys(REPORTED, 0), SPEND_TABLE: deleted})


def plan_prune(engine: Engine, *, cutoff: datetime) -> Pruned:
    """What a prune with this cutoff would delete now (a dry run), counted with the same
    predicates the DELETEs use, in one snapshot; nothing is locked or changed."""

    def plan(conn: Connection) -> Pruned:
        roots, runs = _group([(r.root_id, r.run_id) for r in conn.execute(_ALL_PRUNABLE_RUNS, {"cutoff": cutoff})])
        rows = _rows_of(conn, roots, runs, delete=False) if roots else dict.fromkeys(REPORTED, 0)
        rows[SPEND_TABLE] = int(conn.execute(_SPEND_COUNT, {"cutoff": cutoff}).scalar_one())
        return Pruned(roots=rows["roots"], runs=rows["runs"], rows=rows)

    return run_transaction(engine, plan, isolation_level="REPEATABLE READ", name="plan_prune")

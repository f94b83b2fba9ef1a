"""Spend budgets: each owner's tokens per window, reserved before a model call and
settled after it, and the runs parked until their owner's budget can take their next call.

Windows are fixed and aligned to the epoch: an owner's ``1h`` window starts on every full
hour (UTC), ``1d`` at every midnight UTC, ``30d`` every 2,592,000 s since 1970-01-01. The
database's clock (``now()``) decides which window a call falls in. A call counts against
the window it reserved in, even when it finishes after the window rolled over.

The reservation is one conditional upsert on the owner's ``owner_spend`` row for the
window, inside the statement that writes the call's ledger row (``schema.store.rounds``):
it adds the call's estimate only if ``used + reserved + estimate <= token_budget``, and
the ledger row is inserted only if the reservation was taken (or the owner has no
budget: then the statement touches no spend row at all). The row lock the upsert takes
serializes an owner's concurrent reservations, so the reserved and used tokens of a
window never pass its budget at reservation time; the only overspend is a call whose
real usage exceeds its estimate (the settlement records the real figure).

The settlement, in the statement that records the call's outcome, replaces the call's
reservation by its real input + output tokens, once (``model_calls.reservation_open``).
A holder that dies after reserving leaves its reservation open; the reconciler releases
it once the holder's claim is gone (its lease ran out or was given back, or a newer claim
took the run: ``release_dead_reservations``). Should that holder still return, its call's
usage is recorded all the same, without releasing the reservation a second time.

A run whose owner's budget is short with ``on_budget = 'wait'`` is parked: ``suspended``
with ``runs.budget_wait`` set and nothing stored for the round, which is executed again
from its start (re-dispatched, not resumed) once it is woken: by ``budget_changed`` (the
budget was raised or cleared) or by the reconciler (``wake_budget_waits``), when the
window has rolled over or the budget now takes the estimate.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TypedDict
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from schema.store.doubletext import boundary_end_sql, interrupted_event_sql
from schema.store.errors import FenceLost
from schema.store.limits import next_runs, next_runs_sql
from schema.store.rows import StoredRow
from schema.store.tx import run_transaction
from schema.wire import EventKind, WaitingFor
from schema.wire.json import JsonMapping

BUDGET_WINDOWS_S = {"1h": 3600, "1d": 86_400, "30d": 30 * 86_400}
ON_BUDGET = ("fail", "wait")


def window_start(budget_window: str, at: datetime) -> datetime:
    """The start of the window ``at`` falls in (the Python twin of ``window_start_sql``)."""
    seconds = BUDGET_WINDOWS_S[budget_window]
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, UTC)


def window_seconds_sql(column: str) -> str:
    cases = " ".join(f"WHEN '{w}' THEN {s}" for w, s in BUDGET_WINDOWS_S.items())
    return f"(CASE {column} {cases} END)"


def window_start_sql(column: str) -> str:
    """SQL for the start of the current window of the budget window named by ``column``."""
    secs = window_seconds_sql(column)
    return f"to_timestamp(floor(extract(epoch FROM now()) / {secs}) * {secs})"


# --- the ledger's part (folded into schema.store.rounds' two statements) ------------------

# CTEs for the "before the call" statement, after its ``held`` CTE (the fenced run, with
# its owner): the owner's budget for the current window, if any, and the reservation.
RESERVE_CTES = f"""
budget AS (
  SELECT o.owner, o.token_budget, o.on_budget, o.budget_window,
    {window_start_sql("o.budget_window")} AS window_start,
    {window_start_sql("o.budget_window")} + make_interval(secs => {window_seconds_sql("o.budget_window")})
      AS window_ends_at
  FROM held JOIN owners AS o ON o.owner = held.owner
  WHERE o.token_budget IS NOT NULL
), reservation AS (
  INSERT INTO owner_spend AS sp (owner, window_start, reserved)
  SELECT owner, window_start, :estimate FROM budget WHERE :estimate <= token_budget
  ON CONFLICT (owner, window_start) DO UPDATE SET reserved = sp.reserved + EXCLUDED.reserved, updated_at = now()
    WHERE sp.used + sp.reserved + EXCLUDED.reserved <= (SELECT token_budget FROM budget)
  RETURNING sp.owner
)"""

# The ledger row's budget columns, selected ``FROM held LEFT JOIN budget``.
RESERVED_COLUMNS = "spend_window_start, reserved_tokens, reservation_open"
RESERVED_VALUES = "budget.window_start, CASE WHEN budget.owner IS NOT NULL THEN :estimate END, budget.owner IS NOT NULL"
# Whether the call may be made: no budget, or the reservation was taken.
RESERVED_GUARD = "(budget.owner IS NULL OR EXISTS (SELECT 1 FROM reservation))"
# What a refusal reports (a snapshot: the amounts as the statement found them).
REFUSAL_COLUMNS = """budget.on_budget, budget.budget_window, budget.token_budget, budget.window_start,
  budget.window_ends_at,
  (SELECT sp.used FROM owner_spend AS sp WHERE sp.owner = budget.owner AND sp.window_start = budget.window_start)
    AS spend_used,
  (SELECT sp.reserved FROM owner_spend AS sp WHERE sp.owner = budget.owner AND sp.window_start = budget.window_start)
    AS spend_reserved"""

# For the "after the call" statement: the call's row is read locked (``old``) so a
# reservation the reconciler released meanwhile is not released again; ``fin`` is the
# ledger UPDATE, which RETURNs ``spend_window_start`` and ``released``.
SETTLE_OLD = "(SELECT id, reservation_open FROM model_calls WHERE id = :call_id FOR UPDATE) AS old"
SETTLE_RELEASED = "CASE WHEN old.reservation_open THEN mc.reserved_tokens ELSE 0 END AS released"
SETTLE_CTE = """settled AS (
  UPDATE owner_spend AS sp SET reserved = sp.reserved - fin.released,
    used = sp.used + coalesce(:input_tokens, 0) + coalesce(:output_tokens, 0), updated_at = now()
  FROM fin, runs AS r
  WHERE r.id = :run_id AND sp.owner = r.owner AND sp.window_start = fin.spend_window_start
)"""


class Shortfall(TypedDict):
    """The figures of a refused reservation (``runtime.budget.BudgetShortfall``'s fields)."""

    on_budget: str
    budget_window: str
    window_start: datetime
    window_ends_at: datetime
    token_budget: int
    used: int
    reserved: int
    estimate: int


class BudgetRefused(Exception):
    """The owner's budget for the window cannot take the call's estimate: no ledger row
    was written and the model must not be called. ``shortfall`` holds the figures
    (``shortfall_fields``)."""

    def __init__(self, run_id: UUID, shortfall: Shortfall) -> None:
        super().__init__(f"run {run_id}: the owner's token budget cannot take the call")
        self.run_id = run_id
        self.shortfall = shortfall


def shortfall_fields(row: StoredRow, estimate: int) -> Shortfall:
    """The refusal's values from the ledger statement's row (``REFUSAL_COLUMNS``)."""
    return Shortfall({
        "on_budget": row.on_budget,
        "budget_window": row.budget_window,
        "window_start": row.window_start,
        "window_ends_at": row.window_ends_at,
        "token_budget": int(row.token_budget),
        "used": int(row.spend_used or 0),
        "reserved": int(row.spend_reserved or 0),
        "estimate": estimate,
    })


# --- a dead holder's reservation ------------------------------------------------------------

_RELEASE_DEAD_SQL = text(
    """
WITH dead AS (
  SELECT mc.id FROM model_calls AS mc JOIN runs AS r ON r.id = mc.run_id
  WHERE mc.reservation_open
    AND (r.claim_fence <> mc.claim_fence OR r.status <> 'running'
         OR r.lease_expires_at IS NULL OR r.lease_expires_at < now())
  LIMIT :limit
  FOR UPDATE OF mc SKIP LOCKED
), released AS (
  UPDATE model_calls AS mc SET reservation_open = false FROM dead
  WHERE mc.id = dead.id AND mc.reservation_open
  RETURNING mc.run_id, mc.spend_window_start, mc.reserved_tokens
), per_window AS (
  SELECT r.owner, rel.spend_window_start, sum(rel.reserved_tokens) AS tokens, count(*) AS calls
  FROM released AS rel JOIN runs AS r ON r.id = rel.run_id GROUP BY r.owner, rel.spend_window_start
), freed AS (
  UPDATE owner_spend AS sp SET reserved = sp.reserved - pw.tokens, updated_at = now() FROM per_window AS pw
  WHERE sp.owner = pw.owner AND sp.window_start = pw.spend_window_start
)
SELECT coalesce(sum(calls), 0) AS calls FROM per_window
"""
)


def release_dead_reservations(engine: Engine, *, limit: int = 500) -> int:
    """Release the open reservations of calls whose holder no longer holds its claim
    (died, gave the run back, was taken over); how many. Run by the reconciler."""
    return run_transaction(
        engine,
        lambda conn: int(conn.execute(_RELEASE_DEAD_SQL, {"limit": limit}).scalar_one()),
        name="release_dead_reservations",
        single_statement=True,
    )


# --- parking a run, and waking it ---------------------------------------------------------

_PARKED = boundary_end_sql("'suspended'", "false", "error_code", "error_message")

_PARK_SQL = text(
    f"""
WITH upd AS (
  UPDATE runs SET status = {_PARKED["status"]}, lease_expires_at = NULL, execution_fence = NULL, round_attempts = 0,
    round_claims = 0, round_holders = CAST(ARRAY[] AS uuid[]),
    budget_wait = CASE WHEN {_PARKED["interrupted"]} THEN NULL ELSE CAST(:wait AS jsonb) END,
    error_code = {_PARKED["error_code"]}, error_message = {_PARKED["error_message"]},
    finished_at = {_PARKED["finished_at"]}, event_seq = event_seq + 1, updated_at = now()
  WHERE id = :run_id AND claim_fence = :fence AND boundary_seq = :boundary_seq AND status = 'running'
  RETURNING id, root_id, root_seq, owner, event_seq, error_message, {_PARKED["interrupted"]} AS interrupted
), freed AS (
  -- A parked run holds no slot of its owner's cap (the owner's next queued run starts in
  -- it); its wake makes it queued again, to take a slot at its claim.
  UPDATE owners SET running = owners.running - 1 FROM upd WHERE owners.owner = upd.owner
  RETURNING owners.owner, owners.max_running, owners.running
), parked_event AS (
  INSERT INTO run_events (run_id, seq, kind, data)
  SELECT upd.id, upd.event_seq, :kind, CAST(:event AS jsonb) FROM upd WHERE NOT upd.interrupted
), interrupted_event AS ({interrupted_event_sql("upd")}
)
-- A pending interrupt ends the run here instead of parking it (``schema.store.doubletext``).
SELECT upd.id, upd.interrupted, {next_runs_sql("freed", "upd", "upd.interrupted")}
FROM upd
"""
)


def park_for_budget_txn(
    conn: Connection, run_id: UUID, fence: int, boundary_seq: int, wait: JsonMapping
) -> tuple[UUID, ...]:
    """Suspend the claimed run waiting for its owner's budget (``wait``: the shortfall's
    window and amounts), storing nothing for the round; fenced (``FenceLost``). A run
    whose interrupt is pending ends here instead, cancelled. Returns the queued runs to
    send (the owner's next in the slot given back; the Root's next, if it ended)."""
    params = {
        "run_id": run_id,
        "fence": fence,
        "boundary_seq": boundary_seq,
        "wait": json.dumps(wait),
        "kind": str(EventKind.RUN_SUSPENDED),
        "event": json.dumps({"waiting_for": [], "budget": wait}),
    }
    parked = conn.execute(_PARK_SQL, params).one_or_none()
    if parked is None:
        raise FenceLost(run_id, fence)
    return next_runs(parked)


# A parked run may go on when its owner has no budget now, the window it waited in has
# rolled over (or the owner's window changed), or the current window takes its estimate.
_WAKE_SQL = text(
    f"""
WITH ready AS (
  SELECT r.id FROM runs AS r
  LEFT JOIN owners AS o ON o.owner = r.owner
  LEFT JOIN owner_spend AS sp ON sp.owner = r.owner AND sp.window_start = {window_start_sql("o.budget_window")}
  WHERE r.budget_wait IS NOT NULL AND r.status = 'suspended' AND (CAST(:owner AS text) IS NULL OR r.owner = :owner)
    AND (o.token_budget IS NULL
         OR o.budget_window IS DISTINCT FROM r.budget_wait->>'budget_window'
         OR now() >= CAST(r.budget_wait->>'window_ends_at' AS timestamptz)
         OR coalesce(sp.used + sp.reserved, 0) + CAST(r.budget_wait->>'estimate' AS bigint) <= o.token_budget)
  ORDER BY r.priority DESC, r.updated_at
  LIMIT :limit
  FOR UPDATE OF r SKIP LOCKED
)
UPDATE runs SET status = 'queued', budget_wait = NULL, dispatched_at = now(), updated_at = now()
FROM ready WHERE runs.id = ready.id AND runs.status = 'suspended' AND runs.budget_wait IS NOT NULL
RETURNING runs.id, runs.boundary_seq
"""
)


def _wake_txn(conn: Connection, owner: str | None, limit: int) -> list[tuple[UUID, int]]:
    return [(r.id, r.boundary_seq) for r in conn.execute(_WAKE_SQL, {"owner": owner, "limit": limit})]


def wake_budget_waits(engine: Engine, *, owner: str | None = None, limit: int = 500) -> list[tuple[UUID, int]]:
    """Put back in the queue the parked runs (of ``owner``, or of every owner) whose
    budget can take their next call now; the caller dispatches each ``(run_id,
    boundary_seq)``. A run woken with others that together do not fit parks again at its
    reservation: the budget, not this check, is the limit."""
    return run_transaction(engine, lambda conn: _wake_txn(conn, owner, limit), name="wake_budget_waits")


def budget_changed(engine: Engine, owner: str) -> list[tuple[UUID, int]]:
    """Call after the owner's budget was raised, cleared or its window changed: wakes the
    owner's parked runs that may go on now (as ``wake_budget_waits``), for the caller to
    dispatch. A run it does not wake waits for the reconciler (window roll-over)."""
    return wake_budget_waits(engine, owner=owner)


def budget_waiting_for(conn: Connection, run_id: UUID) -> list[WaitingFor]:
    """The run's budget wait, as ``waiting_for`` shows it (none when it is not parked)."""
    wait = conn.execute(
        text("SELECT budget_wait FROM runs WHERE id = :id AND status = 'suspended'"), {"id": run_id}
    ).scalar_one_or_none()
    if wait is None:
        return []
    return [
        WaitingFor(
            kind="budget",
            delivered=False,
            budget_window=wait["budget_window"],
            window_ends_at=wait["window_ends_at"],
            token_budget=wait["token_budget"],
            used_tokens=wait["used"],
            reserved_tokens=wait["reserved"],
            estimate_tokens=wait["estimate"],
        )
    ]


# --- writing a budget (the ``aidawork owner set`` command has its own module) ---------------


def set_owner_budget_txn(
    conn: Connection, owner: str, token_budget: int | None, budget_window: str | None, on_budget: str = "fail"
) -> list[tuple[UUID, int]]:
    conn.execute(
        text(
            "INSERT INTO owners (owner, token_budget, budget_window, on_budget) VALUES (:o, :b, :w, :ob) "
            "ON CONFLICT (owner) DO UPDATE SET token_budget = EXCLUDED.token_budget, "
            "budget_window = EXCLUDED.budget_window, on_budget = EXCLUDED.on_budget, updated_at = now()"
        ),
        {"o": owner, "b": token_budget, "w": budget_window, "ob": on_budget},
    )
    return _wake_txn(conn, owner, 500)


def set_owner_budget(
    engine: Engine, owner: str, token_budget: int | None, budget_window: str | None, on_budget: str = "fail"
) -> list[tuple[UUID, int]]:
    """Set (or, with ``None``, clear) the owner's budget, then wake its parked runs that
    may go on (returned for the caller to dispatch). The table's CHECKs refuse bad values."""
    return run_transaction(
        engine,
        lambda conn: set_owner_budget_txn(conn, owner, token_budget, budget_window, on_budget),
        name="set_owner_budget",
    )

"""Double-texting: what a submit does about its Root's active run (``root_policy``).

The submit holds the Root's row lock (its ``next_run_seq`` update) and then locks the
Root's active runs (``FOR UPDATE``), so two submits to one Root decide one after the
other, and no claim of those runs can slip in between the decision and the cancel:

- ``enqueue``: nothing (the new run waits its turn); no extra statement at all.
- ``reject``: ``RootBusy`` when the Root has an active run; the caller's transaction
  rolls back, so nothing is stored.
- ``interrupt``: every active run of the Root gets ``interrupted_by`` (the new run) and
  ends, cancelled, at its next round boundary, keeping its committed messages. A run with
  no round in flight (queued, suspended, or between rounds: no live lease) is at a
  boundary now and is cancelled at once (its fence bumped). A run with a round in flight
  goes on: that round commits as usual (its tool calls are on record, none is lost or run
  again), and the commit ends the run instead of going on (``boundary_end_sql``); a round
  that ends the run anyway (an answer, a failure) keeps its own ending. Its holder dying
  instead, the next claim is refused (``interrupt_pending``) and the worker cancels it.
- ``rollback``: every active run of the Root is cancelled at once (fence bumped: a round
  in flight cannot commit), and its messages are deleted, its input included: they were
  the Root's last messages (only the run holding the Root's turn writes), so the Root's
  positions stay gapless and the new run's context, digests and proofs are built exactly
  as for any later run.
  One exception makes two concurrent interrupts safe: when an active run is itself an
  ``interrupt`` / ``rollback`` run that has not started yet (the double-text that won the
  race), the newcomer cancels nothing and queues behind it, as ``enqueue`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Connection, text

from schema.store.errors import RootBusy
from schema.wire import RootPolicy
from schema.wire.errors import ErrorCode

INTERRUPTED = ErrorCode.INTERRUPTED
ROLLED_BACK = ErrorCode.ROLLED_BACK

_ACTIVE_SQL = text(
    "SELECT id, started_at IS NOT NULL AS started, root_policy, "
    "  status = 'running' AND coalesce(lease_expires_at > now(), false) AS in_round FROM runs "
    "WHERE root_id = :root AND root_seq < :seq AND status IN ('queued', 'running', 'suspended') "
    "ORDER BY root_seq FOR UPDATE"
)
_INTERRUPTING = (RootPolicy.INTERRUPT.value, RootPolicy.ROLLBACK.value)


@dataclass(frozen=True)
class ToCancel:
    """What a submit's ``root_policy`` does to its Root's active runs (all locked until
    the submit's transaction ends): ``now`` are cancelled in it, ``at_boundary`` (an
    ``interrupt``'s runs with a round in flight) when that round commits."""

    now: tuple[UUID, ...] = ()
    at_boundary: tuple[UUID, ...] = ()

    @property
    def all(self) -> tuple[UUID, ...]:
        return self.now + self.at_boundary


def runs_to_cancel(conn: Connection, policy: RootPolicy, root_id: UUID, root_seq: int) -> ToCancel:
    """The active runs the submit of run ``root_seq`` with ``policy`` cancels;
    ``RootBusy`` for ``reject`` on a busy Root."""
    if policy is RootPolicy.ENQUEUE:
        return ToCancel()
    active = conn.execute(_ACTIVE_SQL, {"root": root_id, "seq": root_seq}).all()
    if policy is RootPolicy.REJECT:
        if active:
            raise RootBusy(root_id, active[0].id)
        return ToCancel()
    if any(not row.started and row.root_policy in _INTERRUPTING for row in active):
        return ToCancel()
    defer = policy is RootPolicy.INTERRUPT
    return ToCancel(
        now=tuple(row.id for row in active if not (defer and row.in_round)),
        at_boundary=tuple(row.id for row in active if defer and row.in_round),
    )


_INTERRUPTED_TAIL = ": its committed messages are kept"


def cancel_message(policy: RootPolicy, new_run_id: UUID) -> tuple[str, str]:
    """The error code and message a run cancelled by ``new_run_id``'s submit ends with."""
    if policy is RootPolicy.ROLLBACK:
        return ROLLED_BACK, f"rolled back by run {new_run_id}: its messages were dropped from the Root's context"
    return INTERRUPTED, f"interrupted by run {new_run_id}{_INTERRUPTED_TAIL}"


# --- ending an interrupted run at its boundary ----------------------------------------------

# True for a run row (in an UPDATE: the row as it is now) whose interrupt is pending.
INTERRUPT_PENDING_SQL = "(interrupted_by IS NOT NULL AND status IN ('queued', 'running', 'suspended'))"


def boundary_end_sql(status: str, terminal: str, error_code: str, error_message: str) -> dict[str, str]:
    """The SET expressions of a statement that brings a run to a round boundary (a
    commit, a park): a pending interrupt ends the run there, cancelled with
    ``INTERRUPTED``, unless the round itself ended it (``terminal``); otherwise the run
    takes ``status`` and the given ending. Written for the run row being updated (its
    columns unqualified); the statement's ``RETURNING status`` tells which happened."""
    interrupted = f"(interrupted_by IS NOT NULL AND NOT {terminal})"
    return {
        "interrupted": interrupted,
        "status": f"CASE WHEN {interrupted} THEN 'cancelled' ELSE {status} END",
        "error_code": f"CASE WHEN {interrupted} THEN '{INTERRUPTED}' ELSE {error_code} END",
        "error_message": (
            f"CASE WHEN {interrupted} THEN 'interrupted by run ' || interrupted_by || '{_INTERRUPTED_TAIL}' "
            f"ELSE {error_message} END"
        ),
        "finished_at": f"CASE WHEN {terminal} OR {interrupted} THEN now() END",
    }


def interrupted_event_sql(upd: str) -> str:
    """The ``run_cancelled`` event of a run that statement's CTE ``upd`` (returning
    ``id``, ``event_seq``, ``interrupted``, ``error_message``) ended at its boundary,
    as the last of the statement's events."""
    return f"""
  INSERT INTO run_events (run_id, seq, kind, data)
  SELECT {upd}.id, {upd}.event_seq, 'run_cancelled',
         jsonb_build_object('error_code', '{INTERRUPTED}', 'message', {upd}.error_message)
  FROM {upd} WHERE {upd}.interrupted"""

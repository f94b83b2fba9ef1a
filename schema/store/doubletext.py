"""Double-texting: what a submit does about its Root's active run (``root_policy``).

The submit holds the Root's row lock (its ``next_run_seq`` update) and then locks the
Root's active runs (``FOR UPDATE``), so two submits to one Root decide one after the
other, and no claim of those runs can slip in between the decision and the cancel:

- ``enqueue``: nothing (the new run waits its turn); no extra statement at all.
- ``reject``: ``RootBusy`` when the Root has an active run; the caller's transaction
  rolls back, so nothing is stored.
- ``interrupt`` / ``rollback``: every active run of the Root is cancelled (its fence
  bumped, so a round in flight cannot commit: the run ends at its last committed round
  boundary), with ``interrupted_by`` naming the new run; ``rollback`` also deletes the
  cancelled runs' messages, its input included: they were the Root's last messages (only
  the run holding the Root's turn writes), so the Root's positions stay gapless and the
  new run's context, digests and proofs are built exactly as for any later run.
  One exception makes two concurrent interrupts safe: when an active run is itself an
  ``interrupt`` / ``rollback`` run that has not started yet (the double-text that won the
  race), the newcomer cancels nothing and queues behind it, as ``enqueue`` does.
"""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Connection, text

from schema.store.errors import RootBusy
from schema.wire import RootPolicy

INTERRUPTED = "INTERRUPTED"
ROLLED_BACK = "ROLLED_BACK"

_ACTIVE_SQL = text(
    "SELECT id, started_at IS NOT NULL AS started, root_policy FROM runs "
    "WHERE root_id = :root AND root_seq < :seq AND status IN ('queued', 'running', 'suspended') "
    "ORDER BY root_seq FOR UPDATE"
)
_INTERRUPTING = (RootPolicy.INTERRUPT.value, RootPolicy.ROLLBACK.value)


def runs_to_cancel(conn: Connection, policy: RootPolicy, root_id: UUID, root_seq: int) -> tuple[UUID, ...]:
    """The active runs the submit of run ``root_seq`` with ``policy`` cancels (locked
    until the caller's transaction ends); ``RootBusy`` for ``reject`` on a busy Root."""
    if policy is RootPolicy.ENQUEUE:
        return ()
    active = conn.execute(_ACTIVE_SQL, {"root": root_id, "seq": root_seq}).all()
    if policy is RootPolicy.REJECT:
        if active:
            raise RootBusy(root_id, active[0].id)
        return ()
    if any(not row.started and row.root_policy in _INTERRUPTING for row in active):
        return ()
    return tuple(row.id for row in active)


def cancel_message(policy: RootPolicy, new_run_id: UUID) -> tuple[str, str]:
    """The error code and message a run cancelled by ``new_run_id``'s submit ends with."""
    if policy is RootPolicy.ROLLBACK:
        return ROLLED_BACK, f"rolled back by run {new_run_id}: its messages were dropped from the Root's context"
    return INTERRUPTED, f"interrupted by run {new_run_id}: its committed messages are kept"

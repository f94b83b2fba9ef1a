"""Reads scoped to an owner, for the HTTP API: who owns a run, the runs of a Root, and
a run's event tail together with whether the run has ended.

A run or Root of another owner is reported exactly like one that does not exist
(``RunNotFound`` / ``RootNotFound``), so a caller cannot learn that it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Engine, text

from schema.store.errors import RootNotFound, RunNotFound
from schema.wire import RootRunView, RunEvent, RunStatus


def check_run_owner(engine: Engine, run_id: UUID, owner: str) -> None:
    """Raise ``RunNotFound`` unless the run exists and belongs to ``owner``.
    A run's owner never changes, so a check before acting on the run stays true."""
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT 1 FROM runs WHERE id = :run_id AND owner = :owner"), {"run_id": run_id, "owner": owner}
        ).one_or_none()
    if found is None:
        raise RunNotFound(run_id)


_ROOT_RUNS_SQL = text(
    """
SELECT r.id AS run_id, r.root_seq, r.status, r.boundary_seq AS rounds, r.output, r.error_code,
       r.error_message, r.created_at, r.finished_at
FROM roots AS ro
LEFT JOIN LATERAL (
  SELECT * FROM runs WHERE runs.root_id = ro.id AND runs.root_seq > :after_seq ORDER BY runs.root_seq LIMIT :limit
) AS r ON true
WHERE ro.id = :root_id AND ro.owner = :owner
ORDER BY r.root_seq
"""
)


def list_root_runs(
    engine: Engine, root_id: UUID, owner: str, *, after_seq: int = -1, limit: int = 100
) -> list[RootRunView]:
    """The Root's runs in execution order (``root_seq``), those after ``after_seq``, at
    most ``limit``. ``RootNotFound`` when the Root does not exist for ``owner``."""
    with engine.connect() as conn:
        found = conn.execute(
            _ROOT_RUNS_SQL, {"root_id": root_id, "owner": owner, "after_seq": after_seq, "limit": limit}
        ).all()
    if not found:
        raise RootNotFound(root_id, owner)
    return [
        RootRunView.model_validate(dict(row._mapping))
        for row in found
        if row.run_id is not None  # the Root exists but has no (further) runs
    ]


@dataclass(frozen=True)
class EventTail:
    events: list[RunEvent]  # after the requested seq, in order
    ended: bool  # the run had ended when these were read


# One statement, so one snapshot: a run's terminal status and its terminal event are
# committed together, so when ``ended`` is true every event the run will ever have is
# either in this page or at or before ``after_seq``, or beyond ``limit``.
_TAIL_SQL = text(
    """
SELECT r.status, e.seq, e.kind, e.data, e.created_at
FROM runs AS r
LEFT JOIN LATERAL (
  SELECT seq, kind, data, created_at FROM run_events
  WHERE run_events.run_id = r.id AND run_events.seq > :after_seq ORDER BY seq LIMIT :limit
) AS e ON true
WHERE r.id = :run_id
ORDER BY e.seq
"""
)


def read_event_tail(engine: Engine, run_id: UUID, *, after_seq: int = 0, limit: int = 500) -> EventTail:
    """The run's events after ``after_seq`` (at most ``limit``) and whether it has ended."""
    with engine.connect() as conn:
        found = conn.execute(_TAIL_SQL, {"run_id": run_id, "after_seq": after_seq, "limit": limit}).all()
    if not found:
        raise RunNotFound(run_id)
    events = [
        RunEvent(run_id=run_id, seq=row.seq, kind=row.kind, data=row.data, created_at=row.created_at)
        for row in found
        if row.seq is not None
    ]
    return EventTail(events=events, ended=RunStatus(found[0].status).terminal)

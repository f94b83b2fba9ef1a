"""Reads scoped to an owner, for the HTTP API: who owns a run, the runs of a Root, and
runs' event tails together with whether each run has ended. Every query here names the
owner in its WHERE clause, so another owner's run costs the same work as a missing one.

A run or Root of another owner is reported exactly like one that does not exist
(``RunNotFound`` / ``RootNotFound``), so a caller cannot learn that it exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple
from uuid import UUID

from sqlalchemy import Engine, text

from schema.store.bodies import event_data_sql
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


class TailKey(NamedTuple):
    """Which tail to read: the events of ``owner``'s run ``run_id`` after ``after_seq``."""

    run_id: UUID
    owner: str
    after_seq: int


# One statement for every tail, so one snapshot: a run's terminal status and its terminal
# event are committed together, so when ``ended`` is true every event the run will ever
# have is either in its page, at or before ``after_seq``, or beyond ``limit``. A key whose
# run does not exist for its owner gets no row at all.
_TAILS_SQL = text(
    f"""
SELECT k.i, r.status, e.seq, e.kind, e.data, e.created_at
FROM unnest(CAST(:run_ids AS uuid[]), CAST(:owners AS text[]), CAST(:after_seqs AS integer[]))
     WITH ORDINALITY AS k(run_id, owner, after_seq, i)
JOIN runs AS r ON r.id = k.run_id AND r.owner = k.owner
LEFT JOIN LATERAL (
  SELECT ev.seq, ev.kind, {event_data_sql("ev")} AS data, ev.created_at FROM run_events AS ev
  WHERE ev.run_id = r.id AND ev.seq > k.after_seq ORDER BY ev.seq LIMIT :limit
) AS e ON true
ORDER BY k.i, e.seq
"""
)


def read_event_tails(engine: Engine, keys: Sequence[TailKey], *, limit: int = 500) -> dict[TailKey, EventTail]:
    """Each key's events (at most ``limit`` per key) and whether its run has ended, in one
    query. A run that does not exist for the key's owner is missing from the answer."""
    keys = list(dict.fromkeys(keys))  # a repeated key would get its rows twice
    if not keys:
        return {}
    params = {
        "run_ids": [k.run_id for k in keys],
        "owners": [k.owner for k in keys],
        "after_seqs": [k.after_seq for k in keys],
        "limit": limit,
    }
    with engine.connect() as conn:
        found = conn.execute(_TAILS_SQL, params).all()
    tails: dict[TailKey, EventTail] = {}
    for row in found:
        key = keys[row.i - 1]
        tail = tails.setdefault(key, EventTail(events=[], ended=RunStatus(row.status).terminal))
        if row.seq is not None:
            tail.events.append(
                RunEvent(run_id=key.run_id, seq=row.seq, kind=row.kind, data=row.data, created_at=row.created_at)
            )
    return tails

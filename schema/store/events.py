"""Reading a run's append-only event log (what ``aidawork watch`` and streams follow)."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Engine, text

from schema.store.bodies import event_data_sql
from schema.wire import RunEvent


def read_events(engine: Engine, run_id: UUID, *, after_seq: int = 0, limit: int = 500) -> list[RunEvent]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT e.run_id, e.seq, e.kind, {event_data_sql()} AS data, e.created_at FROM run_events AS e "
                "WHERE e.run_id = :run_id AND e.seq > :after_seq ORDER BY e.seq LIMIT :limit"
            ),
            {"run_id": run_id, "after_seq": after_seq, "limit": limit},
        )
        return [RunEvent.model_validate(dict(r._mapping)) for r in rows]

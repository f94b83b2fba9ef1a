"""Reading a run's append-only event log (what ``aidawork watch`` and streams follow)."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import Engine, text

from schema.wire import RunEvent


def read_events(engine: Engine, run_id: UUID, *, after_seq: int = 0, limit: int = 500) -> list[RunEvent]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id, seq, kind, data, created_at FROM run_events "
                "WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq LIMIT :limit"
            ),
            {"run_id": run_id, "after_seq": after_seq, "limit": limit},
        )
        return [RunEvent.model_validate(dict(r._mapping)) for r in rows]

"""The bench's own database and broker, the scripted run requests it submits, and the
reads it measures with. The bench reads the tables directly (its own engine), so it
depends on worker.client only for submitting."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from functools import cache
from typing import Any
from uuid import UUID

import psycopg
import redis
from sqlalchemy import Engine, create_engine, make_url, text

from bench.env import BROKER_URL, DB_NAME, DB_URL, PG


def reset() -> None:
    admin = create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{DB_NAME}"'))
    admin.dispose()
    from schema.migrate import upgrade_head

    upgrade_head(DB_URL)
    redis.Redis.from_url(BROKER_URL).flushdb()


@cache
def engine() -> Engine:
    return create_engine(DB_URL, pool_size=2)


def scripted(
    rounds: int,
    *,
    latency_ms: int = 0,
    owner: str = "bench",
    tag: Any = None,
    big: dict[int, str] | None = None,
    content: str = "done",
) -> dict[str, Any]:
    """A run of ``rounds`` rounds: ``echo`` with a different arg each round (so the
    repeated-call breaker never trips), then a final answer. ``big`` maps a round to a
    string added to its echo args (echo returns its args, so that is the tool output)."""
    turns: list[dict[str, Any]] = []
    for i in range(rounds - 1):
        args: dict[str, Any] = {"i": i} if tag is None else {"run": tag, "i": i}
        if big and i in big:
            args["blob"] = big[i]
        turns.append({"tool_calls": [{"name": "echo", "args": args}], "latency_ms": latency_ms})
    turns.append({"content": content, "latency_ms": latency_ms})
    return {
        "owner": owner,
        "input": "benchmark",
        "config": {
            "model": {"provider": "scripted", "turns": turns},
            "tools": ["echo"],
            "policy": {"max_rounds": rounds},
        },
    }


def submit(request: dict[str, Any]) -> UUID:
    from worker import client

    return client.submit(request).run_id


def wait_finished(
    run_ids: Sequence[UUID], *, stall_s: float = 20, timeout_s: float = 300, poll_s: float = 0.05
) -> list[UUID]:
    """Until every run has ended (finished_at set), or nothing moved (no round committed,
    no run ended) for ``stall_s``, or ``timeout_s``. Returns the runs that have not ended:
    the bench runs no reconciler, so a run whose next round was lost stays where it is,
    and the caller reports it instead of hanging."""
    sql = text(
        "SELECT count(*) FILTER (WHERE finished_at IS NOT NULL), coalesce(sum(boundary_seq), 0) "
        "FROM runs WHERE id = ANY(:ids)"
    )
    ids = list(run_ids)
    deadline = time.monotonic() + timeout_s
    last_progress, moved_at = (-1, -1), time.monotonic()
    while True:
        with engine().connect() as conn:
            finished, boundaries = conn.execute(sql, {"ids": ids}).one()
        if finished == len(ids):
            return []
        now = time.monotonic()
        if (finished, boundaries) != last_progress:
            last_progress, moved_at = (finished, boundaries), now
        if now - moved_at > stall_s or now > deadline:
            with engine().connect() as conn:
                rows = conn.execute(
                    text("SELECT id FROM runs WHERE id = ANY(:ids) AND finished_at IS NULL"), {"ids": ids}
                )
                return [row.id for row in rows]
        time.sleep(poll_s)


def describe_stuck(run_id: UUID) -> str:
    """Where a run that did not end stands, with what its lease says about why."""
    with engine().connect() as conn:
        row = conn.execute(
            text(
                "SELECT r.status, r.boundary_seq, r.round_attempts, r.claim_fence, "
                "  extract(epoch FROM r.lease_expires_at - last.created_at) AS lease_after_commit_s "
                "FROM runs r LEFT JOIN LATERAL (SELECT created_at FROM rounds WHERE run_id = r.id "
                "  ORDER BY boundary_seq DESC LIMIT 1) last ON true WHERE r.id = :id"
            ),
            {"id": run_id},
        ).one()
    text_ = (
        f"run {run_id}: {row.status} at boundary {row.boundary_seq}, {row.round_attempts} claims there, "
        f"fence {row.claim_fence}"
    )
    if row.lease_after_commit_s is not None and row.round_attempts == 0:
        text_ += (
            f"; its lease runs {float(row.lease_after_commit_s):.1f} s past its last commit, with no claim "
            "since: a lease was extended after the round committed, so the next round's claim was refused"
        )
    return text_


def run_row(run_id: UUID) -> Any:
    with engine().connect() as conn:
        return conn.execute(
            text("SELECT status, error_code, created_at, started_at, finished_at FROM runs WHERE id = :id"),
            {"id": run_id},
        ).one()


def round_stamps(run_id: UUID) -> list[Any]:
    """The run's submit time, then each round's commit time (rounds.created_at is the
    commit statement's now()); consecutive gaps are per-round wall times."""
    with engine().connect() as conn:
        created = conn.execute(text("SELECT created_at FROM runs WHERE id = :id"), {"id": run_id}).scalar_one()
        stamps = [
            r[0]
            for r in conn.execute(
                text("SELECT created_at FROM rounds WHERE run_id = :id ORDER BY boundary_seq"), {"id": run_id}
            )
        ]
    return [created, *stamps]


# A round's rows; its events are inserted by the same commit statement, so they share
# the round row's created_at (now() of that statement; run_events has no boundary).
ROW_BYTES_SQL = """
WITH b AS (SELECT created_at FROM rounds WHERE run_id = :id AND boundary_seq = :b)
SELECT
  (SELECT coalesce(sum(pg_column_size(m.*)), 0) FROM messages m WHERE m.run_id = :id AND m.boundary_seq = :b),
  (SELECT count(*) FROM messages m WHERE m.run_id = :id AND m.boundary_seq = :b),
  (SELECT coalesce(sum(pg_column_size(r.*)), 0) FROM rounds r WHERE r.run_id = :id AND r.boundary_seq = :b),
  (SELECT count(*) FROM rounds r WHERE r.run_id = :id AND r.boundary_seq = :b),
  (SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM tool_invocations t WHERE t.run_id = :id AND t.boundary_seq = :b),
  (SELECT count(*) FROM tool_invocations t WHERE t.run_id = :id AND t.boundary_seq = :b),
  (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM model_calls c WHERE c.run_id = :id AND c.boundary_seq = :b),
  (SELECT count(*) FROM model_calls c WHERE c.run_id = :id AND c.boundary_seq = :b),
  (SELECT coalesce(sum(pg_column_size(e.*)), 0) FROM run_events e, b
   WHERE e.run_id = :id AND e.created_at = b.created_at),
  (SELECT count(*) FROM run_events e, b WHERE e.run_id = :id AND e.created_at = b.created_at)
"""
BYTE_TABLES = ("messages", "rounds", "tool_invocations", "model_calls", "run_events")


def bytes_at(run_id: UUID, boundary: int) -> dict[str, tuple[int, int]]:
    """table -> (bytes, rows) stored by one round (pg_column_size of the rows, TOASTed
    values included as stored; indexes and page overhead not counted)."""
    with engine().connect() as conn:
        values = conn.execute(text(ROW_BYTES_SQL), {"id": run_id, "b": boundary}).one()
    return {table: (int(values[2 * i]), int(values[2 * i + 1])) for i, table in enumerate(BYTE_TABLES)}


def config_bytes(run_id: UUID) -> int:
    with engine().connect() as conn:
        return int(
            conn.execute(text("SELECT pg_column_size(config) FROM runs WHERE id = :id"), {"id": run_id}).scalar_one()
        )


def statement_floor_ms(samples: int = 400) -> dict[str, float]:
    """What the database costs one statement here, whatever the statement: medians in ms
    of a ``SELECT 1`` (the loopback round trip alone) and of a one-row ``UPDATE`` in
    autocommit, which also waits for its WAL flush as each of a round's writes does.
    psycopg on its own connection, as the store runs its statements."""
    url = make_url(DB_URL).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("INSERT INTO bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING")

        def median_ms(sql: str) -> float:
            spent = []
            for _ in range(samples):
                start = time.perf_counter()
                conn.execute(sql)
                spent.append((time.perf_counter() - start) * 1000)
            return statistics.median(spent)

        return {
            "read": median_ms("SELECT 1"),
            "write": median_ms("UPDATE bench_floor SET n = n + 1 WHERE id = 1"),
        }

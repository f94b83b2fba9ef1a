"""``make bench`` says where a round's WAL goes (bench/wal.py): the records between two WAL
positions, read back with pg_walinspect and grouped by the table or index they change."""

from __future__ import annotations

from uuid import uuid4

from sqlalchemy import Engine, text

from bench import wal


def test_the_wal_of_a_phase_is_told_by_table_index_and_commit(engine: Engine) -> None:
    table = f"walprobe_{uuid4().hex[:8]}"
    with engine.connect() as conn:
        wal.enable(conn)
        conn.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, body text NOT NULL)"))
        conn.commit()
        start = wal.current_lsn(conn)
        for i in range(20):  # 20 transactions of one row each
            conn.execute(text(f"INSERT INTO {table} VALUES (:i, repeat('x', 200))"), {"i": i})
            conn.commit()
        found = wal.breakdown(conn, start, wal.current_lsn(conn))
        conn.execute(text(f"DROP TABLE {table}"))
        conn.commit()
    assert found.records[table] == 20  # one heap INSERT record per row
    assert 20 * 200 <= found.by_target[table] < 20 * 400  # the row is in its record
    assert found.records[f"{table} (indexes)"] >= 20  # one entry per row in its primary key
    assert found.records["Transaction COMMIT records"] >= 20
    assert found.total >= sum(found.by_target[t] for t in (table, f"{table} (indexes)"))
    shown = "\n".join(found.lines(rounds=20))
    assert f"    {table} " in shown and "B in all" in shown

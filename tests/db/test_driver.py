"""The round's four statements run on the driver's connection (schema.store.driver): the
same SQL, in autocommit, with SQLAlchemy's errors, and the pooled connection given back
as it was taken; a connection the server dropped is replaced and the statement retried."""

from __future__ import annotations

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError, MultipleResultsFound, ProgrammingError

from schema.store.driver import DRIVER_TRANSACTIONS
from schema.store.tx import make_engine, run_transaction

ON_DRIVER = sorted(DRIVER_TRANSACTIONS)[0]


def _backend_pid(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_statement_on_the_driver_commits_by_itself_and_reads_like_a_result(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE driver_probe (id int PRIMARY KEY, note text)"))
    row = run_transaction(
        engine,
        lambda conn: conn.execute(
            text(
                "INSERT INTO driver_probe VALUES (:id, :note) RETURNING id, note, "
                "note LIKE '%x' AS ends_x, '50%' AS pct, :id + 1 AS again, CAST(:note AS text) AS n2"
            ),
            {"id": 1, "note": "a x", "unused": "ignored"},
        ).one_or_none(),
        single_statement=True,
        name=ON_DRIVER,
    )
    assert (row.id, row.note, row.ends_x, row.pct, row.again, row.n2) == (1, "a x", True, "50%", 2, "a x")
    with engine.connect() as conn:  # committed: another connection sees it
        assert conn.execute(text("SELECT count(*) FROM driver_probe")).scalar_one() == 1
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with engine.connect() as conn:  # given back out of autocommit
        assert conn.connection.driver_connection.autocommit is False  # type: ignore[union-attr]


def test_errors_on_the_driver_are_sqlalchemys_and_leave_the_connection_usable(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE driver_probe (id int CONSTRAINT driver_probe_pk PRIMARY KEY)"))

    def insert(conn: Connection) -> None:
        conn.execute(text("INSERT INTO driver_probe VALUES (:id)"), {"id": 1})

    run_transaction(engine, insert, single_statement=True, name=ON_DRIVER)
    with pytest.raises(IntegrityError) as raised:
        run_transaction(engine, insert, single_statement=True, name=ON_DRIVER)
    assert raised.value.orig.diag.constraint_name == "driver_probe_pk"  # type: ignore[union-attr]
    with pytest.raises(ProgrammingError):
        run_transaction(engine, lambda conn: conn.execute(text("SELECT nope")), single_statement=True, name=ON_DRIVER)
    with pytest.raises(MultipleResultsFound):
        run_transaction(
            engine, lambda conn: conn.execute(text("SELECT 1 UNION ALL SELECT 2")).one_or_none(),
            single_statement=True, name=ON_DRIVER,
        )
    count = run_transaction(
        engine, lambda conn: conn.execute(text("SELECT count(*) FROM driver_probe")).scalar_one(),
        single_statement=True, name=ON_DRIVER,
    )
    assert count == 1


def test_a_connection_the_server_dropped_is_replaced_and_the_statement_retried(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            dropped = _backend_pid(conn)
        admin = make_engine(db_url, pool_size=1)
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": dropped})
            conn.commit()
        admin.dispose()
        pid = run_transaction(
            engine, lambda conn: conn.execute(text("SELECT pg_backend_pid()")).scalar_one(),
            single_statement=True, name=ON_DRIVER,
        )
        assert pid != dropped
    finally:
        engine.dispose()

"""The round's four statements (claim, ledger before and after the model call, commit) on
the driver's connection itself, the same SQL as through SQLAlchemy.

Each is one statement in autocommit (``run_transaction(single_statement=True)``). Through
a SQLAlchemy ``Connection`` such a statement cost about as much CPU again as the driver's
own work: checking the connection out and in, setting and resetting its isolation level,
the transaction marker, the execution context and the result's metadata (py-spy: about
a sixth of a worker's CPU per round). Here the pool's connection is taken as it is
(``engine.raw_connection()``, the same pool, so the connection count is unchanged),
switched to autocommit, and the statement's SQL, compiled once by the engine's dialect
(``compiled_sql``), runs on a psycopg ``RawCursor``.

What the ``_txn`` functions of those statements use of a ``Connection`` is small and is
all ``DriverConnection`` offers: ``execute(text_clause, params)`` and, of the result,
``one_or_none`` / ``scalar_one_or_none`` and friends, rows read by column name. Errors
are SQLAlchemy's, translated as SQLAlchemy does (``DBAPIError.instance``: an
``IntegrityError`` keeps its ``orig``), and a connection found dead is invalidated with
every connection of its generation, as SQLAlchemy does on a disconnect, so the retry of
``run_transaction`` gets a fresh one. A statement whose bind parameters need
SQLAlchemy's processing (typed or expanding parameters) is refused here: it is a bug to
list its transaction in ``DRIVER_TRANSACTIONS``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from psycopg import RawCursor, pq
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Engine, TextClause
from sqlalchemy.exc import DBAPIError, MultipleResultsFound, NoResultFound
from sqlalchemy.types import NullType

T = TypeVar("T")

# run_transaction's names of the transactions that run here: the four statements of every
# round. Everything else goes through SQLAlchemy as before.
DRIVER_TRANSACTIONS = frozenset({"claim_round", "model_call_started", "model_call_finished", "commit_round"})

_compiled: dict[tuple[type[Any], str], tuple[bytes, tuple[str, ...]]] = {}
_compiled_lock = threading.Lock()


def compiled_sql(engine: Engine, statement: TextClause) -> tuple[bytes, tuple[str, ...]]:
    """The statement as the engine's dialect compiles it with PostgreSQL's own ``$n``
    placeholders (``numeric_dollar``; the same SQL SQLAlchemy sends, where the driver turns
    ``%(name)s`` into ``$n`` itself), encoded, and the parameter names in ``$n`` order:
    compiled once per dialect and statement text. Sent through a ``RawCursor``, the driver
    neither splits the query for its placeholders (it caches that only for statements
    under 4 kB, and the claim is twice that) nor encodes it again."""
    key = (type(engine.dialect), statement.text)
    found = _compiled.get(key)
    if found is None:
        dialect = cast(Any, type(engine.dialect))(paramstyle="numeric_dollar")
        compiled = statement.compile(dialect=dialect)
        binds = compiled.binds.values()
        if getattr(compiled, "escaped_bind_names", None) or any(
            b.expanding or not isinstance(b.type, NullType) for b in binds
        ):
            raise ValueError("a statement whose parameters SQLAlchemy processes cannot run on the driver")
        found = (compiled.string.encode(), tuple(compiled.positiontup or ()))
        with _compiled_lock:
            _compiled[key] = found
    return found


class DriverResult:
    """The rows of one statement, read the way the ``_txn`` functions read a result."""

    def __init__(self, rows: Sequence[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def all(self) -> list[Any]:
        return list(self._rows)

    fetchall = all

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def one_or_none(self) -> Any:
        if len(self._rows) > 1:
            raise MultipleResultsFound("Multiple rows were found when one or none was required")
        return self.first()

    def one(self) -> Any:
        row = self.one_or_none()
        if row is None:
            raise NoResultFound("No row was found when one was required")
        return row

    def scalar(self) -> Any:
        row = self.first()
        return None if row is None else row[0]

    def scalar_one_or_none(self) -> Any:
        row = self.one_or_none()
        return None if row is None else row[0]

    def scalar_one(self) -> Any:
        return self.one()[0]


class DriverConnection:
    """Stands in for a ``Connection`` in a one-statement ``_txn`` function: ``execute``."""

    def __init__(self, engine: Engine, dbapi_connection: Any) -> None:
        self._engine = engine
        self._dbapi_connection = dbapi_connection

    def execute(self, statement: TextClause, parameters: Mapping[str, Any] | None = None) -> DriverResult:
        sql, names = compiled_sql(self._engine, statement)
        given = parameters or {}
        params = [given[name] for name in names]
        try:
            with RawCursor(self._dbapi_connection, row_factory=namedtuple_row) as cursor:
                cursor.execute(sql, params)
                result = cursor.pgresult
                returned = result is not None and result.status == pq.ExecStatus.TUPLES_OK
                return DriverResult(cursor.fetchall() if returned else [], cursor.rowcount)
        except self._engine.dialect.loaded_dbapi.Error as exc:
            raise _translated(self._engine, exc, statement.text, dict(given), self._dbapi_connection) from exc


def _translated(engine: Engine, exc: Exception, sql: str | None, params: Any, dbapi_connection: Any) -> BaseException:
    dialect = engine.dialect
    disconnect = dialect.is_disconnect(cast(Any, exc), dbapi_connection, None)
    return DBAPIError.instance(
        sql, params, exc, dialect.loaded_dbapi.Error, hide_parameters=engine.hide_parameters,
        connection_invalidated=disconnect, dialect=dialect,
    )


def run_on_driver(engine: Engine, fn: Callable[[Connection], T]) -> T:
    """``fn`` (one statement) on one of the engine's pooled connections in autocommit."""
    dbapi_error = engine.dialect.loaded_dbapi.Error
    try:
        pooled = engine.raw_connection()
    except dbapi_error as exc:  # could not connect: SQLAlchemy's error, as Engine.connect raises it
        raise _translated(engine, exc, None, None, None) from exc
    dbapi_connection: Any = pooled.driver_connection
    try:
        try:
            dbapi_connection.autocommit = True
            try:
                return fn(cast(Connection, DriverConnection(engine, dbapi_connection)))
            finally:
                if not (dbapi_connection.closed or dbapi_connection.broken):
                    dbapi_connection.autocommit = False
        except dbapi_error as exc:  # from the autocommit switches
            raise _translated(engine, exc, None, None, dbapi_connection) from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            # As SQLAlchemy does on a disconnect: this connection and every one opened
            # before it are replaced on their next checkout (the server restarted, say).
            engine.pool._invalidate(pooled, exc)
        raise
    finally:
        pooled.close()

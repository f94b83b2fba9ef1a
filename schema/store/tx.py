"""The engine, and the one helper that retries a whole transaction: on a serialization
failure (SQLSTATE 40001) or deadlock (40P01), and while the database is unavailable
(bounded). Nothing else in the project retries SQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import structlog
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SATimeoutError

from schema.store.driver import DRIVER_TRANSACTIONS, run_on_driver
from schema.wire.retry import RetryPolicy, backoff_s

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
# admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections
UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})
# How long one transaction waits for an unavailable database before giving up: shorter
# than a lease (30 s by default), so a round that gives up still has its claim.
UNAVAILABLE_RETRY_S = 10.0
T = TypeVar("T")
log = structlog.get_logger("aidawork.store")


def make_engine(
    url: str, *, pool_size: int = 10, pool_timeout_s: float = 30.0, prepared_statements: bool = True
) -> Engine:
    """The process's engine: at most ``pool_size`` connections (no overflow), so a fleet's
    connection count is known in advance; a thread that finds them all in use waits up to
    ``pool_timeout_s`` for one instead of failing with "too many clients".

    ``prepared_statements=False`` for PgBouncer in transaction pooling mode: psycopg
    prepares a statement on the server after a few executions, and behind such a pooler
    the next execution may reach another server connection that never prepared it."""
    connect_args: dict[str, object] = {} if prepared_statements else {"prepare_threshold": None}
    # No pre-ping: it would add a round trip to every round. A dead connection fails
    # the statement, the task fails, and the run is redelivered.
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=pool_timeout_s,
        pool_recycle=1800,
        hide_parameters=True,
        connect_args=connect_args,
    )


def sqlstate_of(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None)


# Waits between tries of a transaction: after a conflict (another transaction won), and
# while the database is unavailable (short, so the round goes on soon after it is back).
CONFLICT_BACKOFF = RetryPolicy(base_s=0.01, cap_s=0.5)
UNAVAILABLE_BACKOFF = RetryPolicy(base_s=0.05, cap_s=1.0)


def is_unavailable(exc: BaseException) -> bool:
    """The database could not be reached or is refusing work for now: a lost or refused
    connection, a server shutting down or starting up, "too many clients", or no pooled
    connection free in time. Retrying later can help; nothing about the work is wrong."""
    if isinstance(exc, SATimeoutError):
        return True
    if not isinstance(exc, (OperationalError, InterfaceError)):
        return False
    sqlstate = sqlstate_of(exc)
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in UNAVAILABLE_SQLSTATES


def run_transaction(
    engine: Engine,
    fn: Callable[[Connection], T],
    *,
    isolation_level: str | None = None,
    single_statement: bool = False,
    max_attempts: int = 5,
    unavailable_s: float = UNAVAILABLE_RETRY_S,
    name: str = "transaction",
) -> T:
    """Run ``fn(conn)`` in one transaction, committed on return. On 40001/40P01 the
    whole transaction is rolled back and run again (bounded, jittered); ``fn`` must
    therefore do nothing but database work.

    While the database is unavailable (``is_unavailable``: a restart, a network blip,
    connection exhaustion) the transaction is tried again with short, jittered backoff for
    up to ``unavailable_s``, so a round rides out a short outage in place and goes on the
    moment the database is back, instead of failing and waiting for its lease to expire.
    (A connection lost during COMMIT leaves the outcome unknown; the retry of a fenced
    statement then matches nothing, and the lease or the reconciler takes over.)

    ``single_statement``: ``fn`` issues exactly one statement, which is atomic on its
    own, so it runs in autocommit and saves the BEGIN and COMMIT round trips (two of the
    three a one-statement transaction would cost). The round's hot path uses this; its
    four statements (``DRIVER_TRANSACTIONS``) run on the driver's connection itself
    (``schema.store.driver``), the same SQL, in autocommit as well."""
    on_driver = single_statement and name in DRIVER_TRANSACTIONS
    if single_statement:
        isolation_level = "AUTOCOMMIT"
    attempt = 1
    unavailable_since: float | None = None
    while True:
        try:
            if on_driver:
                result = run_on_driver(engine, fn)
            else:
                with engine.connect() as conn:
                    if isolation_level is not None:
                        conn = conn.execution_options(isolation_level=isolation_level)
                    with conn.begin():
                        result = fn(conn)
            if unavailable_since is not None:
                log.warning("database_available", name=name, after_s=round(time.monotonic() - unavailable_since, 3))
            return result
        except (DBAPIError, SATimeoutError) as exc:
            if is_unavailable(exc):
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since >= unavailable_s:
                    raise
                delay = backoff_s(attempt, UNAVAILABLE_BACKOFF)
                log.warning("database_unavailable", name=name, attempt=attempt, error=type(exc).__name__,
                            sqlstate=sqlstate_of(exc), delay_s=round(delay, 3))
                time.sleep(delay)
                attempt += 1
                continue
            sqlstate = sqlstate_of(exc)
            if sqlstate not in RETRYABLE_SQLSTATES or attempt >= max_attempts:
                raise
            delay = backoff_s(attempt, CONFLICT_BACKOFF)
            log.warning("transaction_retried", name=name, attempt=attempt, sqlstate=sqlstate, delay_s=delay)
            time.sleep(delay)
            attempt += 1

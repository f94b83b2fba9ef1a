"""The engine, and the one helper that retries a whole transaction on a serialization
failure (SQLSTATE 40001) or deadlock (40P01). Nothing else in the project retries SQL."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import structlog
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
T = TypeVar("T")
log = structlog.get_logger("aidawork.store")


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    # No pre-ping: it would add a round trip to every round. A dead connection fails
    # the statement, the task fails, and the run is redelivered.
    # hide_parameters: a database error's text (logged, or shown by a traceback) never
    # carries the bound values: file bodies, messages, prerequisite values, keys.
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800, hide_parameters=True)


def sqlstate_of(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None)


def backoff_s(attempt: int, base_s: float = 0.01, cap_s: float = 0.5) -> float:
    """Full-jitter exponential backoff for retry ``attempt`` (1-based)."""
    return random.uniform(0, min(cap_s, base_s * 2 ** (attempt - 1)))


def run_transaction(
    engine: Engine,
    fn: Callable[[Connection], T],
    *,
    isolation_level: str | None = None,
    single_statement: bool = False,
    max_attempts: int = 5,
    name: str = "transaction",
) -> T:
    """Run ``fn(conn)`` in one transaction, committed on return. On 40001/40P01 the
    whole transaction is rolled back and run again (bounded, jittered); ``fn`` must
    therefore do nothing but database work.

    ``single_statement``: ``fn`` issues exactly one statement, which is atomic on its
    own, so it runs in autocommit and saves the BEGIN and COMMIT round trips (two of the
    three a one-statement transaction would cost). The round's hot path uses this."""
    if single_statement:
        isolation_level = "AUTOCOMMIT"
    attempt = 1
    while True:
        try:
            with engine.connect() as conn:
                if isolation_level is not None:
                    conn = conn.execution_options(isolation_level=isolation_level)
                with conn.begin():
                    return fn(conn)
        except DBAPIError as exc:
            sqlstate = sqlstate_of(exc)
            if sqlstate not in RETRYABLE_SQLSTATES or attempt >= max_attempts:
                raise
            delay = backoff_s(attempt)
            log.warning("transaction_retried", name=name, attempt=attempt, sqlstate=sqlstate, delay_s=delay)
            time.sleep(delay)
            attempt += 1

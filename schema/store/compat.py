"""Compatibility levels: which code may run on this database's schema.

``CODE_LEVEL`` is this code's level. The database records the lowest level its schema needs
(``schema_compat.min_code_level``, one row, created by migration 0021). Most migrations only
add (tables, nullable columns, indexes): old and new code run side by side on them, and they
leave the level alone (docs/operations/rolling-upgrade.md). A migration that makes the schema
unusable by older code (drops or renames a column old code writes, makes a column NOT NULL
that old code leaves empty, gives a status a new meaning) says so, and the release that ships
it raises ``CODE_LEVEL`` to match::

    requires_code_level = 2  # read by `aidawork migrate` before it applies the revision

    def upgrade() -> None:
        ...
        op.execute(raise_level_sql(requires_code_level))

Three checks read the level:

- a worker registers (``register_worker_txn``) only when its level is at least the schema's,
  so an old worker refuses to start;
- its heartbeat re-reads it (``schema_level``), so a worker whose level is raised under it
  stops claiming and shuts down warm (``worker.engine.leases``);
- ``aidawork migrate`` refuses a revision whose ``requires_code_level`` is above the level
  of a live worker (``live_workers_below``), unless ``--force`` (``schema.migrate``).

Code older than level 1 (before migration 0021) checks nothing: its workers register with
no level, which reads as 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import ProgrammingError

from schema.store.tx import run_transaction, sqlstate_of
from schema.wire.errors import AidaworkError, ErrorCode

# This code's compatibility level: raised by a release whose migration breaks older code.
CODE_LEVEL = 1
# A worker registered before migration 0021 recorded no level: it predates the checks.
UNKNOWN_LEVEL = 0
_UNDEFINED_TABLE = "42P01"


class SchemaIncompatible(AidaworkError):
    """This code and the database schema cannot work together: a worker whose level is below
    the schema's (it refuses to start, or stops claiming), a schema older than this code (run
    ``aidawork migrate``), or a migration that would break live workers (``aidawork migrate``
    refuses it unless ``--force``). Retryable for a round: another worker, of a new enough
    release, can take it."""

    code = ErrorCode.SCHEMA_INCOMPATIBLE
    retryable = True

    def __init__(self, message: str, *, code_level: int, schema_level: int | None) -> None:
        super().__init__(message)
        self.code_level = code_level
        self.schema_level = schema_level  # None: the schema predates compatibility levels


def too_old(schema_level: int, code_level: int = CODE_LEVEL) -> SchemaIncompatible:
    return SchemaIncompatible(
        f"this code's compatibility level is {code_level}, but the database schema needs level "
        f"{schema_level} or higher (a migration for newer code was applied): run the newer release",
        code_level=code_level,
        schema_level=schema_level,
    )


def schema_level_txn(conn: Connection) -> int:
    """The lowest code level the schema needs; ``SchemaIncompatible`` when the schema is
    older than this code (no ``schema_compat`` table: migrate first)."""
    try:
        return int(conn.execute(text("SELECT min_code_level FROM schema_compat")).scalar_one())
    except ProgrammingError as exc:
        if sqlstate_of(exc) != _UNDEFINED_TABLE:
            raise
        raise SchemaIncompatible(
            "the database schema is older than this code (it has no schema_compat table): run `aidawork migrate`",
            code_level=CODE_LEVEL,
            schema_level=None,
        ) from None


def schema_level(engine: Engine) -> int:
    return run_transaction(engine, schema_level_txn, name="schema_level", single_statement=True)


def check_code_level_txn(conn: Connection, code_level: int = CODE_LEVEL) -> None:
    """Raise ``SchemaIncompatible`` unless code of ``code_level`` may run on this schema."""
    needed = schema_level_txn(conn)
    if needed > code_level:
        raise too_old(needed, code_level)


def raise_level_sql(level: int) -> str:
    """The statement a breaking migration runs: the schema needs code of ``level`` from now on."""
    return f"UPDATE schema_compat SET min_code_level = GREATEST(min_code_level, {int(level)}), updated_at = now()"


@dataclass(frozen=True)
class LiveWorker:
    name: str
    code_level: int


def live_workers_below_txn(conn: Connection, level: int, *, live_s: float) -> list[LiveWorker]:
    """The workers that heartbeat within ``live_s`` and never said they stopped, whose code
    level is below ``level``. Before migration 0007 there is no registry (no workers to
    break); before 0021 no worker recorded a level (each reads as 0)."""
    if conn.execute(text("SELECT to_regclass('workers')")).scalar() is None:
        return []
    has_level = conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = 'workers' AND column_name = 'code_level')"
        )
    ).scalar()
    level_sql = f"COALESCE(code_level, {UNKNOWN_LEVEL})" if has_level else str(UNKNOWN_LEVEL)
    found = conn.execute(
        text(
            f"SELECT name, {level_sql} AS code_level FROM workers "
            "WHERE stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => :live_s) "
            f"AND {level_sql} < :level ORDER BY name"
        ),
        {"live_s": live_s, "level": level},
    )
    return [LiveWorker(row.name, row.code_level) for row in found]

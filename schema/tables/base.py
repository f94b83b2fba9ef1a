"""The one MetaData (with its naming convention) and the helpers the tables share."""

from __future__ import annotations

from sqlalchemy import (
    Column,
    DateTime,
    MetaData,
    text,
)

from schema.wire import RunStatus

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def one_of(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def created_at_column() -> Column:  # type: ignore[type-arg]
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()"))


ACTIVE_STATUSES = [RunStatus.QUEUED.value, RunStatus.RUNNING.value, RunStatus.SUSPENDED.value]

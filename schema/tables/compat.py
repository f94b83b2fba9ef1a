"""The schema's compatibility level (``schema.store.compat``): one row, written by migrations."""

from __future__ import annotations

from sqlalchemy import Boolean, CheckConstraint, Column, DateTime, Integer, Table, Text, text

from schema.tables.base import metadata

# The lowest code compatibility level this schema needs: migration 0021 creates the row at
# level 1, and a migration that breaks older code raises it. ``id`` is always true, so the
# table holds one row.
schema_compat = Table(
    "schema_compat",
    metadata,
    Column("id", Boolean, primary_key=True, server_default=text("true")),
    Column("min_code_level", Integer, nullable=False),
    # The revision that set the level, for people.
    Column("revision", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("id", name="one_row"),
    CheckConstraint("min_code_level >= 1", name="min_code_level"),
)

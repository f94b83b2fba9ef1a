"""Saved agents: each owner's named, versioned run configurations."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, DateTime, Integer, Table, Text
from sqlalchemy.dialects.postgresql import JSONB

from schema.tables.base import created_at_column, metadata

# One row per version, never updated but for ``deleted_at``: a run names NAME@VERSION and
# records it, so a version means one config forever. ``agent delete`` sets ``deleted_at``
# on every version (a run may no longer name them); a later ``create`` of the name goes on
# from the highest version number, so no number is used twice.
agents = Table(
    "agents",
    metadata,
    Column("owner", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("description", Text, nullable=False),
    Column("config", JSONB, nullable=False),
    Column("overridable", JSONB, nullable=False),
    created_at_column(),
    Column("deleted_at", DateTime(timezone=True)),
    CheckConstraint("version >= 1", name="version"),
)

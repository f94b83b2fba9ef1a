"""an owner's live runs, indexed: the cap's queue and its recount

Every statement of the concurrency cap (schema.store.limits) looks up one owner's live
runs: a freed slot's next queued run in submission order (``next_of_owner_sql``), a
claim's place in that queue (``waits_for_slot_sql``), the counter's recount. Without an
index each of them read the whole runs table. ``ix_runs_owner_live`` is partial (queued
and running runs only), so it stays as small as the work in flight.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

LIVE = "status IN ('queued', 'running')"


def upgrade() -> None:
    op.create_index(
        "ix_runs_owner_live", "runs", ["owner", "status", "created_at", "id"], postgresql_where=sa.text(LIVE)
    )


def downgrade() -> None:
    op.drop_index("ix_runs_owner_live", table_name="runs")

"""workers.dead_at (when beat found the worker silent past AIDAWORK_WORKER_DEAD_AFTER_S) and
workers.heartbeat_s (how often the worker said it would heartbeat)

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06

Beat hands a dead worker's runs on within seconds instead of after their leases; a claim
that follows reads this mark to tell a storm of deaths from a round that kills its
workers (schema.store.workers.DEATH_ELSEWHERE). A worker of older code records no
heartbeat_s: it heartbeats every lease_s / 3, so beat never takes its silence for a death
(its runs move when their leases run out, as before). Breaks nothing: nullable columns that
older code neither reads nor writes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("dead_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("workers", sa.Column("heartbeat_s", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("workers", "heartbeat_s")
    op.drop_column("workers", "dead_at")

"""workers (the registry of worker processes and their liveness) and runs.round_holders
(the workers that claimed the current round): a death is charged to a round only when no
worker that never held it died around the same time

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    op.create_index(
        "ix_workers_heartbeat_at",
        "workers",
        ["heartbeat_at"],
        unique=False,
        postgresql_where=sa.text("stopped_at IS NULL"),
    )
    op.add_column(
        "runs",
        sa.Column(
            "round_holders",
            postgresql.ARRAY(sa.UUID()),
            server_default=sa.text("'{}'::uuid[]"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("runs", "round_holders")
    op.drop_index("ix_workers_heartbeat_at", table_name="workers", postgresql_where=sa.text("stopped_at IS NULL"))
    op.drop_table("workers")

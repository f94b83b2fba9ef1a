"""forks: the run a fork was made from, and how many of its rounds the fork copied

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("forked_from", postgresql.UUID(as_uuid=True)))
    op.add_column("runs", sa.Column("forked_at_round", sa.Integer()))
    op.create_check_constraint(
        op.f("ck_runs_fork"),
        "runs",
        "(forked_from IS NULL) = (forked_at_round IS NULL) AND coalesce(forked_at_round, 0) >= 0",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_runs_fork"), "runs", type_="check")
    op.drop_column("runs", "forked_at_round")
    op.drop_column("runs", "forked_from")

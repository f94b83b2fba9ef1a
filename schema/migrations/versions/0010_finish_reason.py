"""rounds.finish_reason: how the model's answer ended (the provider's word)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("rounds", sa.Column("finish_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("rounds", "finish_reason")

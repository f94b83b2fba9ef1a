"""rounds: repeated-call breaker state

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("rounds", sa.Column("tool_fingerprint", sa.Text(), nullable=True))
    op.add_column("rounds", sa.Column("repeat_count", sa.Integer(), server_default=sa.text("0"), nullable=False))


def downgrade() -> None:
    op.drop_column("rounds", "repeat_count")
    op.drop_column("rounds", "tool_fingerprint")

"""runs: execution_fence (the claim whose execution of the round started and has not
finished) and round_claims (claims at the boundary, a backstop for the attempt budget)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("execution_fence", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("round_claims", sa.Integer(), server_default=sa.text("0"), nullable=False))


def downgrade() -> None:
    op.drop_column("runs", "round_claims")
    op.drop_column("runs", "execution_fence")

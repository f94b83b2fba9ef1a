"""runs.trace_context: the W3C traceparent of the run's trace (set at submit)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("trace_context", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "trace_context")

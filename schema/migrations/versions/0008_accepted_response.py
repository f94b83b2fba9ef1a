"""model_calls.response: the accepted response of a call that succeeded, so a round redone
after its worker died continues from that response instead of calling the model again

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("model_calls", sa.Column("response", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("model_calls", "response")

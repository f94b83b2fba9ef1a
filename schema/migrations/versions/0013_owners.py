"""owners: each owner's (tenant's) limits, and runs.priority

One row per owner that has limits (an owner without a row has none: no cap, weight 1,
no budget). ``running`` is the owner's locked counter of runs holding a slot, kept by
the claim and by every write that ends or suspends a run, never by a check-then-act.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "owners",
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("weight", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("token_budget", sa.BigInteger(), nullable=True),
        sa.Column("budget_window", sa.Text(), nullable=True),
        sa.Column("on_budget", sa.Text(), server_default=sa.text("'fail'"), nullable=False),
        sa.Column("running", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("max_running IS NULL OR max_running >= 1", name=op.f("ck_owners_max_running")),
        sa.CheckConstraint("weight BETWEEN 1 AND 1000", name=op.f("ck_owners_weight")),
        sa.CheckConstraint("token_budget IS NULL OR token_budget >= 1", name=op.f("ck_owners_token_budget")),
        sa.CheckConstraint(
            "budget_window IS NULL OR budget_window IN ('1h', '1d', '30d')", name=op.f("ck_owners_budget_window")
        ),
        sa.CheckConstraint(
            "(token_budget IS NULL) = (budget_window IS NULL)", name=op.f("ck_owners_budget_has_window")
        ),
        sa.CheckConstraint("on_budget IN ('fail', 'wait')", name=op.f("ck_owners_on_budget")),
        sa.CheckConstraint("running >= 0", name=op.f("ck_owners_running")),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_owners")),
    )
    op.add_column("runs", sa.Column("priority", sa.SmallInteger(), server_default=sa.text("5"), nullable=False))
    op.create_check_constraint(op.f("ck_runs_priority"), "runs", "priority BETWEEN 0 AND 9")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_runs_priority"), "runs", type_="check")
    op.drop_column("runs", "priority")
    op.drop_table("owners")

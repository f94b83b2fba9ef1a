"""owner_spend: each owner's token spend per budget window; the ledger's reservations

``owner_spend`` holds one row per (owner, window_start) with the tokens settled
(``used``) and the tokens reserved by calls in flight (``reserved``). A model call's
ledger row records the window it reserved in and how much (``spend_window_start``,
``reserved_tokens``), and whether that reservation is still held
(``reservation_open``), so its settlement, or the release of a dead holder's
reservation, changes the window's counters exactly once. ``runs.budget_wait`` is the
budget wait of a run parked in ``suspended`` (schema.store.budgets).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "owner_spend",
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("reserved", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("used >= 0", name=op.f("ck_owner_spend_used")),
        sa.CheckConstraint("reserved >= 0", name=op.f("ck_owner_spend_reserved")),
        sa.PrimaryKeyConstraint("owner", "window_start", name=op.f("pk_owner_spend")),
    )
    op.add_column("model_calls", sa.Column("spend_window_start", sa.DateTime(timezone=True), nullable=True))
    op.add_column("model_calls", sa.Column("reserved_tokens", sa.BigInteger(), nullable=True))
    op.add_column(
        "model_calls", sa.Column("reservation_open", sa.Boolean(), server_default=sa.text("false"), nullable=False)
    )
    op.create_index(
        op.f("ix_model_calls_open_reservations"),
        "model_calls",
        ["run_id"],
        postgresql_where=sa.text("reservation_open"),
    )
    op.add_column("runs", sa.Column("budget_wait", postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.create_index(
        op.f("ix_runs_budget_waits"), "runs", ["owner"], postgresql_where=sa.text("budget_wait IS NOT NULL")
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_runs_budget_waits"), table_name="runs")
    op.drop_column("runs", "budget_wait")
    op.drop_index(op.f("ix_model_calls_open_reservations"), table_name="model_calls")
    op.drop_column("model_calls", "reservation_open")
    op.drop_column("model_calls", "reserved_tokens")
    op.drop_column("model_calls", "spend_window_start")
    op.drop_table("owner_spend")

"""suspension, durable local reads, prerequisites, round proofs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("rounds", sa.Column("proof", sa.Text(), nullable=True))
    op.add_column("rounds", sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("rounds", sa.Column("resume_fence", sa.BigInteger(), nullable=True))
    op.drop_constraint(op.f("ck_rounds_outcome"), "rounds", type_="check")
    op.create_check_constraint(
        op.f("ck_rounds_outcome"), "rounds", "outcome IN ('continue', 'finish', 'fail', 'suspend')"
    )

    op.add_column("tool_invocations", sa.Column("suspension", postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column("tool_invocations", sa.Column("invocation_id", sa.Text(), nullable=True))
    op.add_column("tool_invocations", sa.Column("work_owner", sa.Text(), nullable=True))
    op.add_column("tool_invocations", sa.Column("proof", sa.Text(), nullable=True))
    op.create_unique_constraint(op.f("uq_tool_invocations_invocation_id"), "tool_invocations", ["invocation_id"])
    op.drop_constraint(op.f("ck_tool_invocations_status"), "tool_invocations", type_="check")
    op.create_check_constraint(
        op.f("ck_tool_invocations_status"), "tool_invocations", "status IN ('completed', 'failed', 'suspended')"
    )

    op.create_table(
        "local_reads",
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("digest", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_local_reads_run_id"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "tool_call_id", "path", name=op.f("pk_local_reads")),
    )
    op.create_table(
        "prerequisites",
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_prerequisites_run_id"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_prerequisites")),
    )


def downgrade() -> None:
    op.drop_table("prerequisites")
    op.drop_table("local_reads")
    op.drop_constraint(op.f("ck_tool_invocations_status"), "tool_invocations", type_="check")
    op.create_check_constraint(
        op.f("ck_tool_invocations_status"), "tool_invocations", "status IN ('completed', 'failed')"
    )
    op.drop_constraint(op.f("uq_tool_invocations_invocation_id"), "tool_invocations", type_="unique")
    for column in ("proof", "work_owner", "invocation_id", "suspension"):
        op.drop_column("tool_invocations", column)
    op.drop_constraint(op.f("ck_rounds_outcome"), "rounds", type_="check")
    op.create_check_constraint(op.f("ck_rounds_outcome"), "rounds", "outcome IN ('continue', 'finish', 'fail')")
    for column in ("resume_fence", "resumed_at", "proof"):
        op.drop_column("rounds", column)

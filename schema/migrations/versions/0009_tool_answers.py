"""tool_answers (answers to suspended calls), tool_executions (at-most-once records),
tool_invocations.approval

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tool_invocations", sa.Column("approval", postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.create_table(
        "tool_answers",
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column("invocation_id", sa.Text(), nullable=False),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("value", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("is_error", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("kind IN ('result', 'approve', 'reject', 'retry')", name=op.f("ck_tool_answers_kind")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_tool_answers_run_id"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "invocation_id", name=op.f("pk_tool_answers")),
    )
    op.create_table(
        "tool_executions",
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("boundary_seq", sa.Integer(), nullable=False),
        sa.Column("claim_fence", sa.BigInteger(), nullable=False),
        sa.Column("executions", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("retry_of", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IS NULL OR status IN ('completed', 'failed')", name=op.f("ck_tool_executions_status")
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_tool_executions_run_id"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "tool_call_id", name=op.f("pk_tool_executions")),
    )


def downgrade() -> None:
    op.drop_column("tool_invocations", "approval")
    op.drop_table("tool_executions")
    op.drop_table("tool_answers")

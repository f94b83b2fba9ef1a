"""context rebuild: rebuild chains, immutable consumptions, checkpoint binding

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("run_checkpoints", sa.Column("last_build_id", sa.UUID(), nullable=True))
    op.add_column("run_checkpoints", sa.Column("chain_anchor", sa.Integer(), nullable=True))
    op.create_table(
        "runtime_work_model_rebuilds",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("root_id", sa.UUID(), nullable=False),
        sa.Column("chain_anchor", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("predecessor_build_id", sa.UUID(), nullable=True),
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column("boundary_seq", sa.Integer(), nullable=False),
        sa.Column("claim_fence", sa.BigInteger(), nullable=False),
        sa.Column("source_message_ids", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("source_digest", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("ordinal IN (1, 2)", name=op.f("ck_runtime_work_model_rebuilds_ordinal")),
        sa.CheckConstraint(
            "(ordinal = 1) = (predecessor_build_id IS NULL)", name=op.f("ck_runtime_work_model_rebuilds_predecessor")
        ),
        sa.ForeignKeyConstraint(
            ["predecessor_build_id"],
            ["runtime_work_model_rebuilds.id"],
            name=op.f("fk_runtime_work_model_rebuilds_predecessor_build_id"),
        ),
        sa.ForeignKeyConstraint(["root_id"], ["roots.id"], name=op.f("fk_runtime_work_model_rebuilds_root_id")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_runtime_work_model_rebuilds_run_id")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_work_model_rebuilds")),
        sa.UniqueConstraint("root_id", "chain_anchor", "ordinal", name=op.f("uq_runtime_work_model_rebuilds_root_id")),
    )
    op.create_table(
        "runtime_work_model_rebuild_consumptions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("build_id", sa.UUID(), nullable=False),
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column("boundary_seq", sa.Integer(), nullable=False),
        sa.Column("claim_fence", sa.BigInteger(), nullable=False),
        sa.Column("source_digest", sa.Text(), nullable=False),
        sa.Column("consumed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["build_id"],
            ["runtime_work_model_rebuilds.id"],
            name=op.f("fk_runtime_work_model_rebuild_consumptions_build_id"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_runtime_work_model_rebuild_consumptions_run_id")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_work_model_rebuild_consumptions")),
        sa.UniqueConstraint("build_id", name=op.f("uq_runtime_work_model_rebuild_consumptions_build_id")),
    )
    op.execute(
        """
        CREATE FUNCTION aidawork_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER runtime_work_model_rebuild_consumptions_immutable "
        "BEFORE UPDATE OR DELETE ON runtime_work_model_rebuild_consumptions "
        "FOR EACH ROW EXECUTE FUNCTION aidawork_refuse_change()"
    )


def downgrade() -> None:
    op.drop_table("runtime_work_model_rebuild_consumptions")
    op.execute("DROP FUNCTION aidawork_refuse_change()")
    op.drop_table("runtime_work_model_rebuilds")
    op.drop_column("run_checkpoints", "chain_anchor")
    op.drop_column("run_checkpoints", "last_build_id")

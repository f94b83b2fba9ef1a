"""compatibility levels: schema_compat (the lowest code level the schema needs) and
workers.code_level (each worker's), so a worker older than the schema refuses to start and
`aidawork migrate` refuses a migration that breaks live workers

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05

A migration that breaks older code declares ``requires_code_level = N`` and runs
``op.execute(raise_level_sql(N))`` in its upgrade (``schema.store.compat``). This one breaks
nothing: it adds a table and a nullable column, so older workers keep running beside it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schema_compat",
        sa.Column("id", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("min_code_level", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("id", name=op.f("ck_schema_compat_one_row")),
        sa.CheckConstraint("min_code_level >= 1", name=op.f("ck_schema_compat_min_code_level")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schema_compat")),
    )
    op.execute("INSERT INTO schema_compat (id, min_code_level, revision) VALUES (true, 1, '0021')")
    op.add_column("workers", sa.Column("code_level", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("workers", "code_level")
    op.drop_table("schema_compat")

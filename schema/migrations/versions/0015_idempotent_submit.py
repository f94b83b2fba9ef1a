"""runs: idempotency key, request digest and root policy (idempotent submit, double-texting)

``idempotency_key`` is unique per owner while set (a partial unique index), so concurrent
submits with one key insert exactly one run (INSERT ... ON CONFLICT in the submit);
a key older than AIDAWORK_IDEMPOTENCY_TTL_S is cleared from its old run by the next
submit with that key, which may then reuse it. ``request_digest`` is the canonical digest
of the request without its key: a replay with another body is refused.
``interrupted_by``: the run whose ``interrupt`` / ``rollback`` submit cancelled this one.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("idempotency_key", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("request_digest", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("root_policy", sa.Text(), server_default=sa.text("'enqueue'"), nullable=False))
    op.add_column("runs", sa.Column("interrupted_by", postgresql.UUID(as_uuid=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_runs_root_policy"), "runs", "root_policy IN ('enqueue', 'reject', 'interrupt', 'rollback')"
    )
    op.create_index(
        "ix_runs_owner_idempotency_key",
        "runs",
        ["owner", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_owner_idempotency_key", table_name="runs")
    op.drop_constraint(op.f("ck_runs_root_policy"), "runs", type_="check")
    for column in ("interrupted_by", "root_policy", "request_digest", "idempotency_key"):
        op.drop_column("runs", column)

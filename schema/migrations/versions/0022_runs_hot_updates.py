"""runs: drop ix_runs_dispatch and leave room on each page (fillfactor 80), so a round's
updates of its run row are HOT: no new entry in any of the table's indexes

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05

Every claim and every commit set ``runs.dispatched_at``; indexed, it made each of those
updates write a new entry into every index of the table (and their WAL). The reconciler,
the index's only reader, reads the live runs through ``ix_runs_owner_live`` instead (see
docs/performance.md, "Indexes"). Breaks nothing: older code runs the same statements.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_runs_dispatch", table_name="runs")
    # New and pruned pages keep a fifth free: room for a row's next version on its page.
    op.execute("ALTER TABLE runs SET (fillfactor = 80)")


def downgrade() -> None:
    op.execute("ALTER TABLE runs RESET (fillfactor)")
    op.create_index(
        "ix_runs_dispatch",
        "runs",
        ["dispatched_at"],
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )

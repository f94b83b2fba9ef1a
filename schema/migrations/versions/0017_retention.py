"""retention: an index on ended runs' finished_at, and consumptions a prune may delete

``aidawork prune`` and beat's retention pass (schema.store.retention) delete whole Roots
whose runs all ended before a cutoff. They find the oldest ended runs through
``ix_runs_finished_at`` (partial: ended runs only, so it stays as small as the history
kept). A rebuild consumption row stays immutable (migration 0004) except for one case:
a DELETE in a transaction that declared itself a prune (``SET LOCAL aidawork.pruning``)
of a consumption whose run has ended. UPDATE is still refused always.

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0015"
branch_labels = None
depends_on = None

ENDED = "status IN ('completed', 'failed', 'cancelled')"
TRIGGER = "runtime_work_model_rebuild_consumptions_immutable"
TABLE = "runtime_work_model_rebuild_consumptions"


def upgrade() -> None:
    op.create_index("ix_runs_finished_at", "runs", ["finished_at"], postgresql_where=sa.text(ENDED))
    op.execute(
        f"""
        CREATE FUNCTION aidawork_refuse_change_unless_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          -- A prune deletes the consumptions of Roots whose runs have all ended; nothing
          -- else may delete one, and nobody may change one.
          IF TG_OP = 'DELETE' AND current_setting('aidawork.pruning', true) = 'on'
             AND EXISTS (SELECT 1 FROM runs WHERE id = OLD.run_id AND {ENDED}) THEN
            RETURN OLD;
          END IF;
          RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME;
        END $$
        """
    )
    op.execute(f"DROP TRIGGER {TRIGGER} ON {TABLE}")
    op.execute(
        f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE OR DELETE ON {TABLE} "
        "FOR EACH ROW EXECUTE FUNCTION aidawork_refuse_change_unless_pruned()"
    )


def downgrade() -> None:
    op.execute(f"DROP TRIGGER {TRIGGER} ON {TABLE}")
    op.execute(
        f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE OR DELETE ON {TABLE} "
        "FOR EACH ROW EXECUTE FUNCTION aidawork_refuse_change()"
    )
    op.execute("DROP FUNCTION aidawork_refuse_change_unless_pruned()")
    op.drop_index("ix_runs_finished_at", table_name="runs")

"""test only: a revision that breaks workers of this code's level (it needs the next level),
applied after the project's head by ``tests.support.breaking_migrate``

Revision ID: t9001
"""

from __future__ import annotations

from alembic import op
from alembic.script import ScriptDirectory

from schema.migrate import MIGRATIONS_DIR
from schema.store.compat import CODE_LEVEL, raise_level_sql

revision = "t9001"
# After whatever the project's head is (the project's own revisions only).
down_revision = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
branch_labels = None
depends_on = None
requires_code_level = CODE_LEVEL + 1


def upgrade() -> None:
    op.execute(raise_level_sql(requires_code_level))


def downgrade() -> None:
    op.execute(f"UPDATE schema_compat SET min_code_level = {CODE_LEVEL}")

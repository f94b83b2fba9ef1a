"""``python -m tests.support.breaking_migrate migrate [--force]``: the real ``aidawork`` command
line, with one revision more after the project's head (``tests/support/migrations``), which
breaks workers of this code's level, as a future release's migration would."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from alembic.config import Config

import schema.migrate
from worker.cli.main import main

EXTRA_VERSIONS = Path(__file__).parent / "migrations"
_project_config = schema.migrate.alembic_config


def with_breaking_revision() -> Config:
    cfg = _project_config()
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_locations", os.pathsep.join([str(schema.migrate.MIGRATIONS_DIR / "versions"),
                                                               str(EXTRA_VERSIONS)]))
    return cfg


if __name__ == "__main__":
    schema.migrate.alembic_config = with_breaking_revision
    sys.exit(main(sys.argv[1:]))

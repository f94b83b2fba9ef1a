"""Where the bench runs, set in the environment before any project module reads it
(worker.ops.settings caches what it reads). Imported first by bench/rounds.py; the worker
processes the bench spawns inherit the same environment."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PG = os.environ.get("AIDAWORK_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
DB_NAME = os.environ.get("AIDAWORK_BENCH_DB", "aidawork_bench_rounds")
DB_URL = f"{PG}/{DB_NAME}"
BROKER_URL = os.environ.get("AIDAWORK_BENCH_BROKER", "redis://127.0.0.1:6379/14")

os.environ.update({"AIDAWORK_DATABASE_URL": DB_URL, "AIDAWORK_BROKER_URL": BROKER_URL, "AIDAWORK_LOG_LEVEL": "WARNING"})
# Newer workers refuse to start without a secret (or AIDAWORK_DEV=1); every process of
# the bench shares this one, so proofs written by one verify in another.
os.environ.setdefault("AIDAWORK_SECRET_KEY", secrets.token_urlsafe(32))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

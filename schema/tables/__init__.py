"""The database schema as SQLAlchemy Core tables (one MetaData, ``base``), by concern:
``runs`` (roots, runs, workers, checkpoints, rebuilds), ``rounds`` (what rounds store, the
event log, the model-call ledger, the webhook outbox), ``owners`` (limits and spend), ``agents`` (saved agents).

Alembic migrations create it (``aidawork migrate``); a test proves that
``upgrade head`` equals these tables. Status columns carry CHECK constraints that mirror
the ``StrEnum``s in ``schema.wire`` and ``schema.wire.vocab``, and are built from them.
"""

from __future__ import annotations

from schema.tables.agents import agents
from schema.tables.base import ACTIVE_STATUSES, metadata
from schema.tables.compat import schema_compat
from schema.tables.owners import owner_spend, owners
from schema.tables.rounds import (
    MESSAGE_ROLES,
    MODEL_CALL_STATUSES,
    ROUND_OUTCOMES,
    TOOL_DOMAINS,
    TOOL_EXECUTION_STATUSES,
    TOOL_STATUSES,
    local_reads,
    messages,
    model_calls,
    prerequisites,
    rounds,
    run_events,
    tool_answers,
    tool_executions,
    tool_invocations,
    webhook_deliveries,
)
from schema.tables.runs import (
    roots,
    run_checkpoints,
    runs,
    runtime_work_model_rebuild_consumptions,
    runtime_work_model_rebuilds,
    workers,
)

__all__ = [
    "ACTIVE_STATUSES",
    "MESSAGE_ROLES",
    "MODEL_CALL_STATUSES",
    "ROUND_OUTCOMES",
    "TOOL_DOMAINS",
    "TOOL_EXECUTION_STATUSES",
    "TOOL_STATUSES",
    "agents",
    "local_reads",
    "messages",
    "metadata",
    "model_calls",
    "owner_spend",
    "owners",
    "prerequisites",
    "roots",
    "rounds",
    "run_checkpoints",
    "run_events",
    "runs",
    "runtime_work_model_rebuild_consumptions",
    "runtime_work_model_rebuilds",
    "schema_compat",
    "tool_answers",
    "tool_executions",
    "tool_invocations",
    "webhook_deliveries",
    "workers",
]

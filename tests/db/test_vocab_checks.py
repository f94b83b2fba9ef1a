"""Each vocabulary's CHECK in the migrated database allows exactly its enum's values:
the tables build their constraints from the enums the core uses (schema.wire.vocab), and
this ties what the migrations created to them (and the owners' budget windows and
budget behaviours to the literals of ``schema.wire.owners``)."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine, text

from schema.wire import RootPolicy, RunStatus
from schema.wire.owners import BUDGET_WINDOWS, ON_BUDGET
from schema.wire.vocab import MessageRole, RoundOutcomeKind, ToolAnswerKind, ToolDomain, ToolStatus, WebhookStatus

CHECKS: dict[str, set[str]] = {
    "ck_runs_status": {s.value for s in RunStatus},
    "ck_runs_root_policy": {p.value for p in RootPolicy},
    "ck_rounds_outcome": {k.value for k in RoundOutcomeKind},
    "ck_messages_role": {r.value for r in MessageRole},
    "ck_tool_invocations_status": {s.value for s in ToolStatus},
    "ck_tool_invocations_tool_domain": {d.value for d in ToolDomain},
    "ck_tool_answers_kind": {k.value for k in ToolAnswerKind},
    # An execution's end: a suspension is never one (it clears the start instead).
    "ck_tool_executions_status": {ToolStatus.COMPLETED.value, ToolStatus.FAILED.value},
    "ck_webhook_deliveries_status": {s.value for s in WebhookStatus},
    "ck_owners_budget_window": set(BUDGET_WINDOWS),
    "ck_owners_on_budget": set(ON_BUDGET),
}


@pytest.mark.parametrize("constraint", sorted(CHECKS))
def test_each_vocabulary_check_allows_exactly_its_enum_values(engine: Engine, constraint: str) -> None:
    with engine.connect() as conn:
        definition = conn.execute(
            text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = :name AND contype = 'c'"),
            {"name": constraint},
        ).scalar_one()
    allowed = set(re.findall(r"'([^']*)'::text", definition))
    assert allowed == CHECKS[constraint], definition

"""Each vocabulary's CHECK in the migrated database allows exactly its enum's values:
the tables build their constraints from the enums the core uses (schema.wire.vocab), and
this ties what the migrations created to them."""

from __future__ import annotations

import re
from enum import StrEnum

import pytest
from sqlalchemy import Engine, text

from schema.wire import RunStatus
from schema.wire.vocab import MessageRole, RoundOutcomeKind, ToolAnswerKind, ToolDomain, ToolStatus

CHECKS: dict[str, type[StrEnum]] = {
    "ck_runs_status": RunStatus,
    "ck_rounds_outcome": RoundOutcomeKind,
    "ck_messages_role": MessageRole,
    "ck_tool_invocations_status": ToolStatus,
    "ck_tool_invocations_tool_domain": ToolDomain,
    "ck_tool_answers_kind": ToolAnswerKind,
}


@pytest.mark.parametrize("constraint", sorted(CHECKS))
def test_each_vocabulary_check_allows_exactly_its_enum_values(engine: Engine, constraint: str) -> None:
    with engine.connect() as conn:
        definition = conn.execute(
            text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = :name AND contype = 'c'"),
            {"name": constraint},
        ).scalar_one()
    allowed = set(re.findall(r"'([^']*)'::text", definition))
    assert allowed == {member.value for member in CHECKS[constraint]}, definition

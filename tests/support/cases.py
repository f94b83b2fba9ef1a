"""Exported cases without a database: a run driven in this process (the runtime's own
rounds), its results laid out as the rows ``schema.store.cases`` reads, and the case
``worker.client.replay.export.build_case`` makes of them; plus the edits a tamperer makes."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import uuid4

from pydantic import BaseModel, ConfigDict

from runtime.deps import Runtime, build_runtime
from runtime.loop import drive_react_loop
from runtime.outcomes import Continue, Fail, Finish, RoundResult
from runtime.prepare import prepare_execution
from runtime.state import RunState
from runtime.tools import Tool, ToolContext
from schema.store.cases import CaseMessageRow, CaseRows
from schema.wire.case import Case
from schema.wire.claim import LoadedMessage
from schema.wire.vocab import ToolDomain
from worker.client.replay.export import build_case


class LookupV1(BaseModel):
    model_config = ConfigDict(extra="forbid")
    q: str


class LookupV2(BaseModel):
    """The same tool, a later version: the argument was renamed."""

    model_config = ConfigDict(extra="forbid")
    query: str


def _lookup(args: Any, ctx: ToolContext) -> dict[str, Any]:
    return {"found": getattr(args, "q", None) or getattr(args, "query", None)}


def lookup_tool(version: int) -> Tool:
    model = LookupV1 if version == 1 else LookupV2
    return Tool.of_model("lookup", "Look a word up.", model, ToolDomain.SDK, _lookup)


def runtime_with_lookup(version: int) -> Runtime:
    return build_runtime(toolsets=[lookup_tool(version)])


def run_in_process(runtime: Runtime, request: Mapping[str, Any]) -> tuple[list[RoundResult], RunState]:
    """Every round of the run, driven here as a worker drives them (one claim each)."""
    parsed, prepared = prepare_execution(runtime, dict(request))
    state = replace(RunState.start(parsed.input), run_id=uuid4())
    results = []
    while True:
        state = replace(state, claim_fence=state.boundary_seq + 1)
        result = drive_react_loop(prepared.deps, state)
        results.append(result)
        state = state.after(result)
        if not isinstance(result.outcome, Continue):
            return results, state


def rows_of(runtime: Runtime, request: Mapping[str, Any]) -> CaseRows:
    """The rows the store would hold for the run (as ``read_case_rows`` returns them)."""
    parsed, prepared = prepare_execution(runtime, dict(request))
    results, state = run_in_process(runtime, request)
    last = results[-1].outcome
    run = {
        "id": state.run_id, "root_id": uuid4(), "owner": parsed.owner, "input": parsed.input,
        "status": "completed" if isinstance(last, Finish) else "failed",
        "config": prepared.turn_config.model_dump(mode="json"), "agent": None,
        "output": last.output if isinstance(last, Finish) else None,
        "error_code": last.error_code if isinstance(last, Fail) else None,
        "context_start_position": 0, "summary": None, "rebuilds": 0,
    }
    assert state.run_id is not None
    rounds, messages, tools = [], [], []
    for result in results:
        seq = result.boundary_seq
        assert result.projection is not None
        rounds.append({
            "boundary_seq": seq, "claim_fence": seq + 1, "outcome": result.outcome.kind,
            "finish_reason": result.finish_reason, "system_digest": result.digests.system,
            "messages_digest": result.digests.messages, "tools_digest": result.digests.tools,
            "accepted_response_digest": result.digests.accepted_response, "proof": result.projection.proof,
        })
        messages += [CaseMessageRow(state.run_id, seq, LoadedMessage(m.position, m.message.to_json(), None))
                     for m in result.new_messages]
        tools += [{
            "boundary_seq": seq, "tool_call_id": t.call.id, "tool_name": t.call.name, "tool_domain": t.domain,
            "args": t.call.args, "args_digest": t.args_digest, "status": t.status, "result": t.result,
            "result_digest": t.result_digest, "approval": None, "answered": False,
        } for t in result.tool_invocations]
    return CaseRows(run=run, rounds=rounds, messages=messages, tool_calls=tools, responses=[])


def case_of(runtime: Runtime, request: Mapping[str, Any]) -> Case:
    return build_case(rows_of(runtime, request), runtime)


def edited(case: Case, edit: Any) -> Case:
    """The case with ``edit(raw)`` applied to its JSON (as a tamperer edits the file)."""
    raw = json.loads(case.model_dump_json())
    edit(raw)
    return Case.model_validate(raw)


def write_case(case: Case | Mapping[str, Any], path: Path) -> Path:
    raw = case.model_dump(mode="json") if isinstance(case, Case) else copy.deepcopy(dict(case))
    path.write_text(json.dumps(raw, indent=1), encoding="utf-8")
    return path


def tool_turns(calls: Sequence[tuple[str, dict[str, Any]]], answer: str = "done") -> list[dict[str, Any]]:
    """A script: one round per call, then the answer."""
    return [*({"tool_calls": [{"name": n, "args": a}]} for n, a in calls), {"content": answer}]

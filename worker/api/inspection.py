"""The run inspector's reads (``GET /v1/runs``, ``GET /v1/runs/{id}/rounds``) and the
stream token a browser's ``EventSource`` needs (``POST /v1/runs/{id}/stream-token``).

A round's "what the model saw" is rebuilt from the store by ``runtime.inspect`` with the
worker's own context functions, and its stored ``messages_digest`` checked against it.
"""

from __future__ import annotations

import time
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Query

from runtime.inspect import round_context
from runtime.prepare import parse_turn_config
from schema.store import inspect as inspect_store
from schema.store import owners as owner_store
from schema.store.inspect import RunRows
from schema.wire import RunStatus
from schema.wire.inspect import ModelCallRow, RoundView, RunList, RunRounds
from worker.api.deps import Owner, State
from worker.api.models import IssuedStreamToken

router = APIRouter(prefix="/v1")  # its error answers: worker.api.openapi


@router.get("/runs", response_model=RunList, summary="This token's owner's runs, newest first")
def list_runs(
    owner: Owner,
    state: State,
    status: Annotated[RunStatus | None, Query(description="only runs in this status")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> RunList:
    engine = state.context().engine
    found = inspect_store.list_runs(engine, owner, status=None if status is None else status.value, limit=limit)
    return RunList(runs=found)


@router.get(
    "/runs/{run_id}/rounds",
    response_model=RunRounds,
    summary="A run's rounds: what the model saw (digest checked), tool calls, the model-call ledger",
)
def run_rounds(run_id: UUID, owner: Owner, state: State) -> RunRounds:
    ctx = state.context()
    rows = inspect_store.read_run_rows(ctx.engine, run_id, owner)
    policy = parse_turn_config(rows.config, ctx.runtime.base.turn_config).policy
    return rounds_view(run_id, rows, policy.max_tool_output_bytes)


@router.post(
    "/runs/{run_id}/stream-token",
    response_model=IssuedStreamToken,
    summary="A short-lived token for this run's event stream (?stream_token=), for EventSource",
)
def stream_token(run_id: UUID, owner: Owner, state: State) -> IssuedStreamToken:
    owner_store.check_run_owner(state.context().engine, run_id, owner)
    issued = state.stream_tokens.issue(run_id, owner, now=time.time())
    return IssuedStreamToken(token=issued.token, expires_at=issued.expires_at)


def rounds_view(run_id: UUID, rows: RunRows, max_output_bytes: int) -> RunRounds:
    calls_at: dict[int, list[ModelCallRow]] = {}
    for call in rows.model_calls:
        calls_at.setdefault(call.boundary_seq, []).append(call)
    rounds = [_round(run_id, rows, row, calls_at.get(row["boundary_seq"], []), max_output_bytes) for row in rows.rounds]
    committed = {r.boundary_seq for r in rounds}
    pending = [c for c in rows.model_calls if c.boundary_seq not in committed]
    return RunRounds(run_id=run_id, status=RunStatus(rows.status), rounds=rounds, pending_model_calls=pending)


def _checked_from(rows: RunRows) -> int:
    """The first round whose context can be checked: none of a rolled-back run's (its
    messages were deleted), and none before the round the current checkpoint was
    admitted at (a rebuild replaced their context)."""
    if rows.messages_dropped:
        return 1 + max((r["boundary_seq"] for r in rows.rounds), default=-1)
    return rows.checkpoint_boundary if rows.rebuilds else 0


def _round(
    run_id: UUID, rows: RunRows, row: dict[str, Any], calls: list[ModelCallRow], max_output_bytes: int
) -> RoundView:
    seq = row["boundary_seq"]
    seen = round_context(
        rows.messages,
        run_id,
        seq,
        row["messages_digest"],
        summary=rows.summary,
        max_output_bytes=max_output_bytes,
        current_from=_checked_from(rows),
    )
    started, finished = row["started_at"], row["finished_at"]
    return RoundView(
        boundary_seq=seq,
        outcome=row["outcome"],
        finish_reason=row["finish_reason"],
        started_at=started,
        finished_at=finished,
        duration_ms=None if started is None else round((finished - started).total_seconds() * 1000, 1),
        messages_digest=row["messages_digest"],
        recomputed_digest=seen.digest,
        digest_check=seen.check,
        context=[m.to_json() for m in seen.messages],
        tool_calls=[t for t in rows.tool_calls if t.boundary_seq == seq],
        model_calls=calls,
        duplicate_model_calls=len(calls) > 1,
    )

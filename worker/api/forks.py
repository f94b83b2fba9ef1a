"""``POST /v1/runs/{run_id}/fork``: the token owner's run forked (``worker.client.fork``):
a new run on a new Root whose first ``at_round`` rounds are the run's, copied, never run
again. Another owner's run is not found (404), exactly like a missing one; a refused fork
(422, naming the field) stores nothing."""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict

from schema.wire.forks import ForkRequest
from worker import client
from worker.api.deps import Owner, State
from worker.api.errors import ErrorBody

router = APIRouter(prefix="/v1")


class ForkedRun(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: UUID
    root_id: UUID
    forked_from: UUID
    forked_at_round: int


@router.post(
    "/runs/{run_id}/fork",
    status_code=201,
    response_model=ForkedRun,
    summary="Fork a run: a new run whose first at_round rounds are this run's, copied, not re-run",
    description="The fork goes on from round at_round + 1 with at most one edit (edit_input, edit_tool_result) "
    "and its config with config_overrides set. REQUEST_INVALID (422) names the field: at_round outside the "
    "rounds the run committed, an edit naming no call of round at_round, a config that does not validate.",
    responses={404: {"model": ErrorBody, "description": "RUN_NOT_FOUND: no such run for this owner"}},
)
def fork_run(run_id: UUID, body: ForkRequest, owner: Owner, state: State, response: Response) -> ForkedRun:
    forked = client.fork(run_id, body, owner=owner, ctx=state.context())
    response.headers["Location"] = f"/v1/runs/{forked.run_id}"
    return ForkedRun(
        run_id=forked.run_id, root_id=forked.root_id, forked_from=forked.parent_id, forked_at_round=forked.at_round
    )

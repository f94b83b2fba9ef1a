"""The saved-agent endpoints: create, list, show, update (a new version), delete. The
token's owner is the agent's owner; another owner's agent is not found (404), exactly
like a missing one. Each body is checked (``worker.client``: the config like a run's)
before the store is touched, so a refused request stores nothing."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from schema.wire.agents import AGENT_NAME_PATTERN, AGENT_REF_PATTERN, AgentView
from schema.wire.errors import ErrorCode
from worker import client
from worker.api.deps import Owner, State
from worker.api.errors import ApiError, ErrorBody
from worker.api.models import AgentCreation, AgentDeleted, AgentList, AgentUpdate

_ERROR: dict[str, object] = {"model": ErrorBody}
router = APIRouter(prefix="/v1", tags=["agents"])
Name = Annotated[str, Path(pattern=AGENT_NAME_PATTERN, description="the agent's name")]
Ref = Annotated[
    str, Path(pattern=AGENT_REF_PATTERN, description="NAME (its latest version) or NAME@VERSION (GET only)")
]
_NOT_FOUND: dict[int | str, dict[str, object]] = {
    404: {**_ERROR, "description": "AGENT_NOT_FOUND: no such agent (or version) for this owner"}
}


@router.post(
    "/agents", status_code=201, response_model=AgentView, summary="Save a new agent (version 1)",
    responses={409: {**_ERROR, "description": "AGENT_EXISTS: this owner has an agent of that name; update it"}},
)
def create_agent(body: AgentCreation, owner: Owner, state: State) -> AgentView:
    spec = {"description": body.description, "config": body.config, "overridable": body.overridable}
    return client.create_agent(owner, body.name, spec, ctx=state.context())


@router.get("/agents", response_model=AgentList, summary="This owner's agents (the latest version of each)")
def list_agents(owner: Owner, state: State) -> AgentList:
    return AgentList(agents=client.list_agents(owner, ctx=state.context()))


# One path template for the three methods (``name`` takes NAME@VERSION on GET only), so
# that the path's Allow header lists them all.
@router.get("/agents/{name}", response_model=AgentView, summary="One agent: its latest or a given version",
            responses=_NOT_FOUND)
def get_agent(name: Ref, owner: Owner, state: State) -> AgentView:
    return client.get_agent(owner, name, ctx=state.context())


@router.patch("/agents/{name}", response_model=AgentView, summary="Save the agent's next version",
              description="The latest version with the fields sent; earlier versions stay as they were.",
              responses=_NOT_FOUND)
def update_agent(name: Name, body: AgentUpdate, owner: Owner, state: State) -> AgentView:
    if not body.model_fields_set or any(getattr(body, f) is None for f in body.model_fields_set):
        raise ApiError(422, ErrorCode.REQUEST_INVALID,
                       "change: send at least one of description, config, overridable, none of them null", "change")
    return client.update_agent(owner, name, body.model_dump(exclude_none=True), ctx=state.context())


@router.delete("/agents/{name}", response_model=AgentDeleted, summary="Delete every version of an agent",
               description="Runs may no longer name it; runs made from it keep their record.", responses=_NOT_FOUND)
def delete_agent(name: Name, owner: Owner, state: State) -> AgentDeleted:
    return AgentDeleted(name=name, deleted_versions=client.delete_agent(owner, name, ctx=state.context()))

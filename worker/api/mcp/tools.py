"""The tools an MCP client sees: each of the caller's saved agents, and three task tools
for clients without the tasks extension (or a model that drives the task itself).

Agent names match ``^[A-Za-z][A-Za-z0-9_-]*$``; the task tools' names hold a dot, which no
agent name can, so an agent never hides one of them nor one of them an agent.

- ``NAME`` ``{"input", "root_id"?}``: a run of the agent (``root_id``: go on in that
  conversation, the ``root_id`` of an earlier result);
- ``task.status`` ``{"run_id", "wait_s"?}``: the run now, or once it settles within
  ``wait_s`` (up to 60);
- ``task.cancel`` ``{"run_id"}``;
- ``task.answer`` ``{"run_id", "answers": [...], "wait_s"?}``: answers to its waits, in the
  shapes of ``worker.api.a2a.answers``; then waits like a call (60 s unless ``wait_s``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from mcp_types import Tool, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from runtime.prepare import format_loc
from schema.wire.agents import AgentView

MAX_WAIT_S = 60.0  # the longest a call holds its request open (then: poll task.status)
TASK_STATUS, TASK_CANCEL, TASK_ANSWER = "task.status", "task.cancel", "task.answer"
TASK_TOOLS = frozenset({TASK_STATUS, TASK_CANCEL, TASK_ANSWER})


class ArgumentsInvalid(Exception):
    """A call's arguments refused: ``field`` is the argument's path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class AgentArgs(_Args):
    input: str = Field(min_length=1, description="what to ask the agent")
    # Listed as a plain uuid string: omitting it is how a call starts a new conversation.
    root_id: UUID | SkipJsonSchema[None] = Field(
        default=None,
        description="go on in this conversation: the root_id of an earlier result of this server",
        json_schema_extra=_no_default,
    )


class StatusArgs(_Args):
    run_id: UUID = Field(description="the task: the run_id of a result")
    wait_s: float = Field(default=0, ge=0, le=MAX_WAIT_S,
                          description="wait up to this long for the task to end or to need an answer")


class CancelArgs(_Args):
    run_id: UUID = Field(description="the task: the run_id of a result")


class AnswerArgs(_Args):
    run_id: UUID = Field(description="the task: the run_id of a result")
    answers: list[dict[str, Any]] = Field(
        min_length=1,
        description='one per wait: {"tool_call_id", "result", "is_error"?} (a client tool), '
        '{"tool_call_id", "decision": "approve", "args"?} or {"tool_call_id", "decision": "reject", "reason"} '
        '(an approval), {"tool_call_id", "retry": true} (an unknown outcome), '
        '{"tool_call_id", "files": {"<path>": "<text>"}} (a local read), {"key", "value"} (a prerequisite)',
    )
    wait_s: float = Field(default=MAX_WAIT_S, ge=0, le=MAX_WAIT_S,
                          description="then wait up to this long for the task to end or to need an answer")


def parse(model: type[_Args], arguments: dict[str, Any] | None) -> Any:
    """``arguments`` checked against ``model``, or ``ArgumentsInvalid`` naming the first bad one."""
    try:
        return model.model_validate(arguments or {})
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ArgumentsInvalid(format_loc(_path(error["loc"], arguments), "arguments"), error["msg"]) from None


def _path(loc: tuple[int | str, ...], data: object) -> list[int | str]:
    """An error's place in the arguments, without the union member pydantic adds after a
    value (``root_id.uuid``)."""
    path: list[int | str] = []
    for part in loc:
        if not isinstance(data, dict | list):
            break
        path.append(part)
        if isinstance(data, dict):
            data = data.get(part)
        else:
            data = data[part] if isinstance(part, int) and 0 <= part < len(data) else None
    return path


def _schema(model: type[_Args]) -> dict[str, Any]:
    return model.model_json_schema()


def agent_tool(agent: AgentView) -> Tool:
    return Tool(
        name=agent.name,
        title=agent.name,
        description=agent.description or f"Run the saved agent {agent.name}.",
        input_schema=_schema(AgentArgs),
        annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True),
    )


_READS = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
TASK_TOOL_LIST = [
    Tool(name=TASK_STATUS, title="Task status", input_schema=_schema(StatusArgs), annotations=_READS,
         description="A task's state (a run of one of these agents), and its result once it has ended."),
    Tool(name=TASK_CANCEL, title="Cancel a task", input_schema=_schema(CancelArgs),
         annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True, open_world_hint=False),
         description="Cancel a task that has not ended."),
    Tool(name=TASK_ANSWER, title="Answer a task", input_schema=_schema(AnswerArgs),
         annotations=ToolAnnotations(idempotent_hint=True, open_world_hint=False),
         description="Answer what a task waits for (its status lists each wait), then wait for it to go on."),
]
_SCHEMAS = {tool.name: tool.input_schema for tool in TASK_TOOL_LIST}
AGENT_SCHEMA = _schema(AgentArgs)


def input_schema(name: str) -> dict[str, Any]:
    """A tool's input schema by name, without a listing: every agent takes the same."""
    return _SCHEMAS.get(name, AGENT_SCHEMA)

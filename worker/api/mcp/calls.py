"""``tools/list`` and ``tools/call`` (``worker.api.mcp.tools`` lists the tools).

A call of an agent's tool starts a run and waits for it (``MAX_WAIT_S``), sending its
events as progress. It answers with the run's output once it has completed; with an
``input_required`` result (one elicitation per wait, ``requestState`` naming the run)
when it waits for an answer and the client can elicit, whose retry stores the answers
and waits on; otherwise with what the run is doing, its ``run_id`` and what to call next
(``task.status``, ``task.answer``). A client with the tasks extension gets a task instead
(``worker.api.mcp.tasks``).

A refused call is a tool error (``isError``, naming the argument) the model can correct;
an unknown tool, a bad ``requestState`` or a task that is not the caller's is a JSON-RPC
error (invalid params). Neither stores anything.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    ListToolsResult,
    PaginatedRequestParams,
)

from schema.wire import RunView
from worker import client
from worker.api.a2a.answers import ReplyInvalid
from worker.api.mcp import elicit, runs
from worker.api.mcp.caller import Caller, Context, caller_of
from worker.api.mcp.results import call_result, needs_input, refusal
from worker.api.mcp.runs import TaskNotFound, UnknownTool, blocking
from worker.api.mcp.tools import (
    MAX_WAIT_S,
    TASK_ANSWER,
    TASK_CANCEL,
    TASK_STATUS,
    TASK_TOOL_LIST,
    TASK_TOOLS,
    AgentArgs,
    AnswerArgs,
    ArgumentsInvalid,
    CancelArgs,
    StatusArgs,
    agent_tool,
    parse,
)


async def list_tools(ctx: Context, params: PaginatedRequestParams | None) -> ListToolsResult:
    caller = caller_of(ctx)
    agents = await blocking(client.list_agents, caller.owner, ctx=caller.state.context())
    return ListToolsResult(tools=[agent_tool(agent) for agent in agents] + TASK_TOOL_LIST)


def not_found(run_id: object) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: Task not found ({run_id})")


def unknown_tool(name: str) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}")


async def start(caller: Caller, params: CallToolRequestParams) -> RunView:
    """A new run of the agent the call names (``ArgumentsInvalid``, ``UnknownTool``)."""
    args = parse(AgentArgs, params.arguments)
    return await runs.submit(caller.state, caller.owner, params.name, args)


def outcome(caller: Caller, view: RunView) -> CallToolResult | InputRequiredResult:
    if needs_input(view) and caller.can_elicit() and (requests := elicit.input_requests(view)):
        return InputRequiredResult(input_requests=dict(requests), request_state=str(view.run_id))
    return call_result(view)


async def _resumed(caller: Caller, params: CallToolRequestParams, state: str) -> RunView | CallToolResult:
    """The retry of a call that asked for input: its answers stored, the run's view after;
    or, when the client dismissed a form, what the run waits for (the call stops asking)."""
    try:
        run_id = UUID(state)
    except ValueError:
        raise MCPError(code=INVALID_PARAMS, message="requestState: not one of this server's") from None
    dismissed = False

    def chosen(view: RunView) -> list[Any]:
        nonlocal dismissed
        found = elicit.replies_of(view, params.input_responses or {}, "inputResponses")
        dismissed = found.dismissed
        return found.replies

    view = await runs.answer(caller.state, caller.owner, run_id, chosen)
    return call_result(view) if dismissed else view


async def _agent_call(caller: Caller, params: CallToolRequestParams) -> CallToolResult | InputRequiredResult:
    after_seq: int | None = None  # a resumed run: its progress from now on
    if params.request_state is not None:
        resumed = await _resumed(caller, params, params.request_state)
        if isinstance(resumed, CallToolResult):
            return resumed
        view = resumed
    else:
        view, after_seq = await start(caller, params), 0  # a new run: every event of it
    view = await runs.settle(caller.state, caller.owner, view, MAX_WAIT_S, caller.report, after_seq=after_seq)
    return outcome(caller, view)


async def _task_tool(caller: Caller, params: CallToolRequestParams) -> CallToolResult:
    state, owner = caller.state, caller.owner
    if params.name == TASK_STATUS:
        status_args: StatusArgs = parse(StatusArgs, params.arguments)
        view = await runs.status(state, owner, status_args.run_id)
        wait_s = status_args.wait_s
    elif params.name == TASK_CANCEL:
        cancel_args: CancelArgs = parse(CancelArgs, params.arguments)
        view, wait_s = await runs.cancel(state, owner, cancel_args.run_id), 0.0
    else:
        assert params.name == TASK_ANSWER
        answer_args: AnswerArgs = parse(AnswerArgs, params.arguments)
        replies = runs.replies_of(answer_args.answers, "arguments.answers")  # shapes, before the store
        view = await runs.answer(state, owner, answer_args.run_id, lambda _: replies)
        wait_s = answer_args.wait_s
    return call_result(await runs.settle(state, owner, view, wait_s, caller.report))


async def call_tool(ctx: Context, params: CallToolRequestParams) -> CallToolResult | InputRequiredResult:
    caller = caller_of(ctx)
    try:
        if params.name in TASK_TOOLS:
            return await _task_tool(caller, params)
        return await _agent_call(caller, params)
    except ArgumentsInvalid as exc:
        return refusal(f"{exc.field}: {exc.message}")
    except ReplyInvalid as exc:
        if params.name in TASK_TOOLS:
            return refusal(f"{exc.field}: {exc.message}")
        raise MCPError(code=INVALID_PARAMS, message=f"{exc.field}: {exc.message}") from None
    except TaskNotFound as exc:
        if params.name in TASK_TOOLS:
            return refusal(f"task {exc} not found")
        raise not_found(exc) from None
    except UnknownTool:
        raise unknown_tool(params.name) from None

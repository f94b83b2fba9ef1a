"""The tasks extension (``io.modelcontextprotocol/tasks``, protocol 2026-07-28), built on
the SDK's extension mechanism (SEP-2133): a ``tools/call`` interceptor and four methods.

A task is a run: its id is the run id, its state is read from the run store on every
request, so it survives an API restart and any API process answers for it.

- ``tools/call`` of an agent, from a client that declared the extension on the request:
  the run is stored, then its ``CreateTaskResult`` is the answer (a ``tasks/get`` of it
  resolves from then on);
- ``tasks/get``: the task, with its result once completed, or its ``inputRequests`` (one
  form elicitation per wait, ``worker.api.mcp.elicit``) when it waits for input;
- ``tasks/update``: answers to those requests (``inputResponses``); the ones that answer
  no open wait are ignored;
- ``tasks/cancel``: cancel the run (an empty acknowledgement, even if it had ended);
- ``tasks/result`` (the 2025-11-25 name): the final ``CallToolResult``, waiting for it as
  a call does (60 s at most; then the task as it is then, like a call that timed out).

A task of another owner, or an id that is no run, is "Task not found" (invalid params);
a client that did not declare the extension gets -32021 (missing required capability).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from uuid import UUID

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, compose_tool_call_handler
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    CallToolRequestParams,
    CallToolResult,
    CancelTaskRequestParams,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    InputResponses,
    RequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from schema.wire import RunView
from worker.api.a2a.answers import ReplyInvalid
from worker.api.deps import ApiState
from worker.api.mcp import elicit, runs
from worker.api.mcp.caller import TASKS_EXTENSION, Caller, Context, caller_of
from worker.api.mcp.calls import not_found, start, unknown_tool
from worker.api.mcp.results import call_result, created_task, detailed_task, refusal
from worker.api.mcp.runs import TaskNotFound, UnknownTool
from worker.api.mcp.tools import MAX_WAIT_S, TASK_TOOLS, ArgumentsInvalid

_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
CallHandler = Callable[[Context, CallToolRequestParams], Awaitable[Any]]


class UpdateTaskRequestParams(RequestParams):
    """``tasks/update``: answers to a task's ``inputRequests``, keyed alike."""

    task_id: str
    input_responses: InputResponses


def _caller(ctx: Context) -> Caller:
    require_client_extension(ctx, TASKS_EXTENSION)
    return caller_of(ctx)


def _run_id(task_id: str) -> UUID:
    try:
        return UUID(task_id)
    except ValueError:
        raise not_found(task_id[:64]) from None


async def _view(caller: Caller, task_id: str) -> RunView:
    try:
        return await runs.status(caller.state, caller.owner, _run_id(task_id))
    except TaskNotFound:
        raise not_found(task_id) from None


class RunTasks(Extension):
    identifier = TASKS_EXTENSION

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", GetTaskRequestParams, self.get, _MODERN),
            MethodBinding("tasks/update", UpdateTaskRequestParams, self.update, _MODERN),
            MethodBinding("tasks/cancel", CancelTaskRequestParams, self.cancel, _MODERN),
            MethodBinding("tasks/result", GetTaskPayloadRequestParams, self.result, _MODERN),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        caller = caller_of(ctx)
        if params.name in TASK_TOOLS or params.request_state is not None or not caller.takes_tasks():
            return await call_next(ctx)
        try:
            view = await start(caller, params)
        except ArgumentsInvalid as exc:  # no task: the refusal is the call's result
            return refusal(f"{exc.field}: {exc.message}")
        except UnknownTool:
            raise unknown_tool(params.name) from None
        return created_task(view)

    async def get(self, ctx: Context, params: GetTaskRequestParams) -> dict[str, Any]:
        view = await _view(_caller(ctx), params.task_id)
        return detailed_task(view, elicit.wire_requests(view))

    async def update(self, ctx: Context, params: UpdateTaskRequestParams) -> dict[str, Any]:
        caller = _caller(ctx)
        run_id = _run_id(params.task_id)
        responses = params.input_responses

        def chosen(view: RunView) -> list[Any]:
            return elicit.replies_of(view, responses, "inputResponses").replies

        try:
            await runs.answer(caller.state, caller.owner, run_id, chosen)
        except TaskNotFound:
            raise not_found(params.task_id) from None
        except ReplyInvalid as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"{exc.field}: {exc.message}") from None
        return {}

    async def cancel(self, ctx: Context, params: CancelTaskRequestParams) -> dict[str, Any]:
        caller = _caller(ctx)
        try:
            await runs.cancel(caller.state, caller.owner, _run_id(params.task_id))
        except TaskNotFound:
            raise not_found(params.task_id) from None
        return {}

    async def result(self, ctx: Context, params: GetTaskPayloadRequestParams) -> CallToolResult:
        caller = _caller(ctx)
        view = await _view(caller, params.task_id)
        return call_result(await runs.settle(caller.state, caller.owner, view, MAX_WAIT_S, caller.report))


def _version_gated(binding: MethodBinding) -> Callable[[Context, Any], Awaitable[HandlerResult]]:
    versions = binding.protocol_versions

    async def gated(ctx: Context, params: Any) -> HandlerResult:
        if versions is not None and ctx.protocol_version not in versions:
            raise MCPError(code=METHOD_NOT_FOUND, message="Method not found", data=binding.method)
        return await binding.handler(ctx, params)

    return gated


def install(server: Server[ApiState], extension: Extension, call_tool: CallHandler) -> None:
    """Apply ``extension`` to a low-level server as ``MCPServer`` applies one (which this
    server is not: its tools are each caller's agents, listed per request): its methods,
    gated by protocol version, its entry in the capabilities, and its ``tools/call``
    interceptor around ``call_tool``."""
    for binding in extension.methods():
        server.add_request_handler(binding.method, binding.params_type, _version_gated(binding))
    server.extensions[extension.identifier] = extension.settings()
    server.add_request_handler("tools/call", CallToolRequestParams, compose_tool_call_handler([extension], call_tool))

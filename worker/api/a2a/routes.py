"""The A2A routes of one saved agent, at ``/a2a/{agent}`` (``NAME`` or ``NAME@VERSION``):

- ``GET /a2a/{agent}/.well-known/agent-card.json``: its card;
- ``POST /a2a/{agent}``: JSON-RPC, by the SDK's dispatcher over ``RunTasks`` (protocol 1.0,
  and 0.3's method names through the SDK's compatibility layer).

Both take the API's bearer tokens and see only the token owner's agents: an unknown agent,
or another owner's, is a 404 in the API's error shape (as is a missing token: a 401).
Past those, every refusal is JSON-RPC's own (HTTP 200, as the SDK answers): a body that is
not JSON (``-32700``, whatever the parser failed on), a body over the API's limit
(``-32600``), an unknown method, bad params, an unknown task.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from a2a.server.context import ServerCallContext
from a2a.server.jsonrpc_models import InvalidRequestError, JSONParseError, JSONRPCError
from a2a.server.request_handlers.response_helpers import agent_card_to_dict, build_error_response
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from schema.wire.agents import AGENT_REF_PATTERN, AgentView
from schema.wire.errors import ErrorCode
from worker import client
from worker.api.a2a.card import card_of
from worker.api.a2a.handler import CALLER, Caller, RunTasks
from worker.api.auth import Credentials, token_digest
from worker.api.deps import ApiState, Owner, State
from worker.api.errors import ApiError
from worker.api.limits import Refuse

_REF = re.compile(AGENT_REF_PATTERN)
_RPC_PATH = re.compile(r"/a2a/[^/]+|/mcp")  # the JSON-RPC endpoints: A2A's and MCP's
_TOO_LARGE = "Payload too large: the body is over AIDAWORK_API_MAX_BODY_BYTES"
router = APIRouter(prefix="/a2a", include_in_schema=False)


class CallerContext(DefaultServerCallContextBuilder):
    """The SDK's call context (headers: the A2A-Version the dispatcher checks), plus the
    caller the route authenticated."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[CALLER] = request.state.a2a_caller
        return context


_dispatcher = JsonRpcDispatcher(RunTasks(), context_builder=CallerContext(), enable_v0_3_compat=True)


def jsonrpc_error(error: JSONRPCError) -> JSONResponse:
    """A refusal before the request's id is known (``id: null``), as the dispatcher sends one."""
    return JSONResponse(build_error_response(None, error))


async def _agent(state: ApiState, owner: str, ref: str) -> AgentView:
    if not _REF.fullmatch(ref):  # not a name an agent can have: none of the owner's
        raise ApiError(404, ErrorCode.AGENT_NOT_FOUND, "no such agent", "agent")
    return await run_in_threadpool(lambda: client.get_agent(owner, ref, ctx=state.context()))


def _describer(state: ApiState) -> Callable[[str], str]:
    registry = state.context().runtime.base.tools
    known = set(registry.names())  # never the resolvers: they may open a connection per name

    def describe(name: str) -> str:
        tool = registry.get(name) if name in known else None
        return "" if tool is None else tool.description

    return describe


@router.get("/{agent}/.well-known/agent-card.json")
async def agent_card(agent: str, request: Request, owner: Owner, state: State) -> JSONResponse:
    view = await _agent(state, owner, agent)
    rpc_url = f"{str(request.base_url).rstrip('/')}/a2a/{agent}"
    describe = await run_in_threadpool(_describer, state)
    return JSONResponse(agent_card_to_dict(card_of(view, rpc_url, describe)))


@router.post("/{agent}")
async def rpc(agent: str, request: Request, owner: Owner, state: State, credentials: Credentials) -> Response:
    view = await _agent(state, owner, agent)
    assert credentials is not None  # Owner refused a request without a token
    request.state.a2a_caller = Caller(state, owner, view, token_digest(credentials.credentials))
    try:
        # Parsed here, not by the dispatcher, which answers only a syntax error as one
        # (invalid UTF-8, nesting past the recursion limit or a 5000-digit number would be
        # an "internal error"); the dispatcher then reads the parsed body Starlette kept.
        await request.json()
    except HTTPException as exc:  # the body limit (worker.api.limits), while reading a chunked body
        if exc.status_code != 413:
            raise
        return jsonrpc_error(InvalidRequestError(message=_TOO_LARGE))
    except (ValueError, RecursionError) as exc:
        return jsonrpc_error(JSONParseError(message=f"the body is not JSON ({type(exc).__name__})"))
    return await _dispatcher.handle_requests(request)


def body_refusals(refuse: Refuse) -> Refuse:
    """The API's body-limit refusal (``worker.api.limits``, before any route): a JSON-RPC
    error for a JSON-RPC request (A2A's or MCP's), so a client reads it as one (a 413 reaches it only
    as "HTTP Error 413"); the API's error shape for any other."""

    def refusal(status: int, code: ErrorCode, message: str, field: str | None = None, **headers: str) -> ASGIApp:
        fallback = refuse(status, code, message, field, **headers)

        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            rpc_call = scope["method"] == "POST" and _RPC_PATH.fullmatch(scope["path"]) is not None
            if status == 413 and rpc_call:
                await jsonrpc_error(InvalidRequestError(message=_TOO_LARGE))(scope, receive, send)
            else:
                await fallback(scope, receive, send)

        return answer

    return refusal

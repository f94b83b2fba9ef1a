"""The MCP server assembled from the SDK's low-level ``Server``: the handlers of
``worker.api.mcp.calls``, the tasks extension (``worker.api.mcp.tasks``), the SDK's
``requestState`` boundary, and a stateless streamable HTTP session manager."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import version
from typing import Any

from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route

from runtime.deps import DEV_SECRET
from worker.api.deps import ApiState
from worker.api.mcp.caller import owner_in
from worker.api.mcp.calls import call_tool, list_tools
from worker.api.mcp.endpoint import McpEndpoint
from worker.api.mcp.tasks import RunTasks, install
from worker.api.mcp.tools import input_schema
from worker.ops.settings import Settings

PATH = "/mcp"
AUDIENCE = "aidawork-mcp"  # the request-state claim that keeps another service's states out
# An answer to an elicitation may wait for a person: its state outlives the default 10 minutes.
REQUEST_STATE_TTL_S = 3600.0
INSTRUCTIONS = (
    "Each tool but the task.* ones is a saved agent: call it with {input, root_id?}. A call waits up to 60 s for the "
    "agent's run; a result that has not ended gives its run_id: follow it with task.status, answer what it waits for "
    "with task.answer, stop it with task.cancel. Pass a result's root_id to go on in the same conversation."
)


def request_state_security(settings: Settings) -> RequestStateSecurity:
    """Keys derived from the deployment's secret, so a state sealed by one API process opens
    in any other, after a restart too; bound to the owner who was asked."""
    secret = DEV_SECRET if settings.secret_key is None else settings.secret_key.get_secret_value().encode()
    key = hmac.new(secret, b"aidawork mcp request state", hashlib.sha256).digest()

    def principal(ctx: ServerRequestContext[Any, Any]) -> str | None:
        return owner_in(ctx)

    return RequestStateSecurity(keys=[key], ttl=REQUEST_STATE_TTL_S, bind_principal=principal, audience=AUDIENCE)


def build_server(state: ApiState) -> Server[ApiState]:
    @asynccontextmanager
    async def lifespan(_: Server[ApiState]) -> AsyncIterator[ApiState]:
        yield state  # each handler's ctx.lifespan_context

    server: Server[ApiState] = Server(
        "aidawork",
        version=version("aidawork"),
        title="AIDAWORK agents",
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        # Every agent takes the same arguments: no listing (a database read) per call.
        get_tool_input_schema=input_schema,
        # The listing is the caller's agents, which change at any time.
        cache_hints={"tools/list": CacheHint(ttl_ms=0, scope="private")},
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    server.middleware.append(RequestStateBoundary(request_state_security(state.settings), default_audience=AUDIENCE))
    install(server, RunTasks(), call_tool)
    return server


class McpService:
    """The server and its session manager, whose ``running()`` the API's lifespan enters
    (requests fail with "Task group is not initialized" otherwise)."""

    def __init__(self, state: ApiState) -> None:
        self.server = build_server(state)
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            # No session is kept: a request may reach any API process, before or after a restart.
            stateless=True,
            # SSE: a call's progress notifications go out while it waits.
            json_response=False,
            # The SDK's Host/Origin check guards servers without authentication against DNS
            # rebinding; every request here carries a bearer token, which a rebound page does
            # not have, and browsers' origins are AIDAWORK_API_CORS_ORIGINS' business.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.endpoint = McpEndpoint(state.tokens, self.manager)

    def running(self) -> AbstractAsyncContextManager[None]:
        return self.manager.run()

    def route(self) -> Route:
        # A Route, not a Mount: a Mount would answer /mcp with a redirect to /mcp/.
        return Route(PATH, endpoint=self.endpoint, include_in_schema=False)

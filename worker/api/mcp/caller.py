"""Who is calling and what their client can do, read off an MCP request's context: the
owner (``worker.api.mcp.endpoint`` put it in the ASGI scope after checking the bearer
token), the API's state (the server's lifespan value), and the capabilities the client
declared on this very request (2026-07-28 declares them per request)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request

from schema.wire import RunEvent
from worker.api.deps import ApiState
from worker.api.mcp.runs import describe

OWNER_SCOPE_KEY = "aidawork.mcp.owner"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
Context = ServerRequestContext[ApiState, Any]


def owner_in(ctx: ServerRequestContext[Any, Any]) -> str | None:
    request = ctx.request
    owner = request.scope.get(OWNER_SCOPE_KEY) if isinstance(request, Request) else None
    return owner if isinstance(owner, str) else None


@dataclass(frozen=True)
class Caller:
    ctx: Context
    owner: str

    @property
    def state(self) -> ApiState:
        return self.ctx.lifespan_context

    @property
    def modern(self) -> bool:
        """The 2026-07-28 wire: results may be ``input_required`` (or a task)."""
        return self.ctx.protocol_version in MODERN_PROTOCOL_VERSIONS

    def can_elicit(self) -> bool:
        """The client answers form elicitations embedded in a result."""
        capabilities = self.ctx.session.client_capabilities
        declared = None if capabilities is None else capabilities.elicitation
        # An empty capability (before form and url modes existed) means form.
        return self.modern and declared is not None and (declared.form is not None or declared.url is None)

    def takes_tasks(self) -> bool:
        """The client declared the tasks extension on this request."""
        capabilities = self.ctx.session.client_capabilities
        extensions = None if capabilities is None else capabilities.extensions
        return self.modern and bool(extensions) and TASKS_EXTENSION in (extensions or {})

    async def report(self, event: RunEvent) -> None:
        """An event of the run the call waits for, as a progress notification (sent only if
        the request asked for progress)."""
        await self.ctx.session.report_progress(event.seq, None, describe(event))


def caller_of(ctx: Context) -> Caller:
    owner = owner_in(ctx)
    if owner is None:  # the endpoint refuses an unauthenticated request before the SDK sees it
        raise MCPError(code=INVALID_REQUEST, message="not authenticated")
    return Caller(ctx, owner)

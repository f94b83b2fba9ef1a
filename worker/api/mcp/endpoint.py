"""``/mcp``: the bearer token checked before the SDK sees the request, then the SDK's
streamable HTTP session manager. A missing or unknown token is a 401 (with
``WWW-Authenticate: Bearer``) whose body is a JSON-RPC error, so an MCP client reads it as
one; nothing is parsed, stored or dispatched for it."""

from __future__ import annotations

import json

import structlog
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import INVALID_REQUEST
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from worker.api.auth import TokenTable
from worker.api.mcp.caller import OWNER_SCOPE_KEY

log = structlog.get_logger("aidawork.api")


def _unauthenticated(message: str) -> Response:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}
    return Response(json.dumps(body), status_code=401, media_type="application/json",
                    headers={"WWW-Authenticate": "Bearer"})


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


class McpEndpoint:
    """The ASGI app at ``/mcp``: the caller's owner goes to the handlers in the scope."""

    def __init__(self, tokens: TokenTable, manager: StreamableHTTPSessionManager) -> None:
        self.tokens, self.manager = tokens, manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = bearer_token(Headers(scope=scope))
        owner = None if token is None else self.tokens.owner_of(token)
        if owner is None:
            log.info("mcp_request_refused", reason="no token" if token is None else "unknown token")
            message = "send Authorization: Bearer <token>" if token is None else "the bearer token is not valid"
            await _unauthenticated(message)(scope, receive, send)
            return
        await self.manager.handle_request({**scope, OWNER_SCOPE_KEY: owner}, receive, send)

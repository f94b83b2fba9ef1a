"""A tiny streamable-HTTP MCP server for the tests, on the SDK's ``MCPServer``:

    python -m tests.support.mcp_http_server --port 8123 [--token T]

With ``--token``, every request must carry ``X-Test-Token: T`` (401 otherwise), so a test
can see that the configured headers are sent. Tools:

- ``stamp(text)``: ``{"stamped": text}`` as structured content; annotated idempotent;
- ``shout(text)``: the text upper-cased, as text only; no annotations (at most once);
- ``fail(reason)``: an ``isError`` result with the reason;
- ``wait(seconds, started="")``: creates the file ``started`` (if given), sleeps, then says
  so; no annotations (at most once);
- ``meta_key()``: the ``aidawork/idempotency_key`` its request's ``_meta`` carried.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel


class Stamped(BaseModel):
    stamped: str


def build(token: str | None) -> Any:
    server = MCPServer("aidawork-test-http")

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    def stamp(text: str) -> Stamped:
        """Stamp a text."""
        return Stamped(stamped=text)

    @server.tool(structured_output=False)
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails, with the reason."""
        raise ToolError(f"failed on purpose: {reason}")

    @server.tool()
    async def wait(seconds: float, started: str = "") -> str:
        """Sleep, then say so (first creating the file ``started``, if named)."""
        if started:
            Path(started).touch()
        await asyncio.sleep(seconds)
        return f"waited {seconds} s"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def meta_key(ctx: Context) -> str:
        """The idempotency key the request carried in its _meta."""
        meta = ctx.request_context.meta or {}
        return str(meta.get("aidawork/idempotency_key"))

    app = server.streamable_http_app(host="127.0.0.1")

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if token is not None and scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"x-test-token") != token.encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"missing X-Test-Token"})
                return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", default=None)
    args = parser.parse_args()
    # lifespan "on": the app's lifespan runs the MCP session manager the guard wraps.
    uvicorn.run(build(args.token), host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()

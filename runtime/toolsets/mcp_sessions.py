"""One MCP session per configured server per process, owned by a background event loop.

``McpToolset.start(servers)`` starts a daemon thread running an asyncio loop, opens a
session to every server on it (concurrently), lists their tools and makes each a ``Tool``
(``runtime.toolsets.mcp.tool_of``). A tool's handler is sync, like every handler: it submits
``call_tool`` to the loop and waits at most until the call's deadline
(``ctx.remaining_s()``).

Each session lives inside one task of its own (``_Session._own``): the SDK's transports
are anyio task groups, which must be entered and left by the same task, and a transport
failure then ends that task rather than a caller's. A call that fails on the transport
marks the session broken (its task closes it, so a stdio subprocess is stopped); the next
call opens a new one. A server that cannot be reached gives the calling model a failed
result (``MCP_SERVER_UNAVAILABLE``) and logs ``mcp_server_unavailable``; never a crashed
round. ``close()`` ends every session (stdio subprocesses are stopped, HTTP sessions
deleted) and the loop; the composition root calls it at process exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from contextlib import asynccontextmanager, suppress
from functools import partial
from typing import TypeVar, cast

import httpx2
import structlog
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client import Transport
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, RequestParamsMeta
from mcp.types import Tool as McpTool
from pydantic import ValidationError
from structlog.typing import FilteringBoundLogger

from runtime.tools.base import Tool, ToolEffect, ToolsetUnavailable, ToolTimedOut
from runtime.tools.calls import ToolContext
from runtime.toolsets.mcp import McpServerUnavailable, McpToolError, result_json, tool_of
from runtime.toolsets.mcp_config import HttpServer, McpServerConfig, StdioServer, secret_values
from runtime.toolsets.mcp_stderr import stderr_logged
from schema.wire.json import JsonObject, JsonValue

T = TypeVar("T")

CONNECT_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0
# How often a server that could not be reached is tried again when a run names its tools.
RELIST_INTERVAL_S = 5.0
MAX_LIST_PAGES = 100
# Codes the SDK itself raises when the connection, not the server, failed.
_TRANSPORT_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT})
# An HTTP server may hold a response stream open for a long call: the call's deadline,
# not the HTTP read timeout, bounds it.
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=3600.0)


def _log() -> FilteringBoundLogger:
    # Looked up per line, not cached at import: structlog may be configured after import.
    logger: FilteringBoundLogger = structlog.get_logger("aidawork.mcp")
    return logger


class _Unavailable(Exception):
    """The server could not be reached, or the session broke during the call (``sent``:
    the request may have reached the server, so the call may have run)."""

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


# Where a call's idempotency key goes in the request's ``_meta`` (a server that changes
# something may use it to do so once).
IDEMPOTENCY_META_KEY = "aidawork/idempotency_key"


def describe(exc: BaseException) -> str:
    """One line about an error, unwrapping the exception groups anyio raises."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    if isinstance(exc, _Unavailable):
        return text
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


@asynccontextmanager
async def _http_transport(config: HttpServer) -> AsyncIterator[TransportStreams]:
    async with (
        httpx2.AsyncClient(headers=secret_values(config.headers), timeout=_HTTP_TIMEOUT) as http,
        streamable_http_client(config.url, http_client=http) as streams,
    ):
        yield streams


@asynccontextmanager
async def _stdio_transport(name: str, config: StdioServer) -> AsyncIterator[TransportStreams]:
    params = StdioServerParameters(command=config.command, args=config.args, env=secret_values(config.env))
    with stderr_logged(name) as errlog:
        async with stdio_client(params, errlog=errlog) as streams:
            errlog.close()  # the server has its own copy
            yield streams


def _transport(name: str, config: McpServerConfig) -> Transport:
    if isinstance(config, StdioServer):
        return _stdio_transport(name, config)
    return _http_transport(config)


class _Session:
    """The one session to one server; every method runs on the toolset's loop."""

    def __init__(self, name: str, config: McpServerConfig, connect_timeout_s: float) -> None:
        self.name = name
        self.config = config
        self.connect_timeout_s = connect_timeout_s
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None

    async def client(self) -> Client:
        """The open session, opened now if there is none (or it broke)."""
        if self._client is not None:
            return self._client
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._client is None:
                await self._open()
            assert self._client is not None
            return self._client

    async def _open(self) -> None:
        await self.close()
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        owner = asyncio.create_task(self._own(ready, stop), name=f"mcp-session-{self.name}")
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout_s)
        except BaseException as exc:
            owner.cancel()
            await asyncio.wait({owner}, timeout=CLOSE_TIMEOUT_S)
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: it is reported below
            if isinstance(exc, TimeoutError):
                raise _Unavailable(f"no session within {self.connect_timeout_s} s") from None
            if isinstance(exc, asyncio.CancelledError | _Unavailable):
                raise
            raise _Unavailable(describe(exc)) from None
        self._client, self._stop, self._owner = client, stop, owner

    async def _own(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Holds the session open until ``stop``; a transport failure ends it here."""
        client: Client | None = None
        try:
            async with Client(_transport(self.name, self.config), cache=None) as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(_Unavailable(describe(exc)))
            elif not stop.is_set():
                _log().warning("mcp_session_lost", server=self.name, error=describe(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if client is not None and self._client is client:
                self._client = None

    def broken(self, client: Client) -> None:
        """The session failed a call: close it; the next call opens a new one."""
        if self._client is client:
            self._client = None
            if self._stop is not None:
                self._stop.set()

    async def close(self) -> None:
        owner, stop = self._owner, self._stop
        self._client = self._owner = self._stop = None
        if owner is None or stop is None:
            return
        stop.set()
        _, pending = await asyncio.wait({owner}, timeout=CLOSE_TIMEOUT_S)
        for task in pending:  # a transport that would not close in time
            task.cancel()

    async def list_tools(self) -> list[McpTool]:
        client = await self.client()
        tools: list[McpTool] = []
        cursor: str | None = None
        try:
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
        except Exception as exc:
            self.broken(client)
            raise _Unavailable(describe(exc), sent=True) from None
        return tools

    async def call(self, tool: str, args: JsonObject, idempotency_key: str) -> CallToolResult:
        client = await self.client()
        try:
            meta = cast(RequestParamsMeta, {IDEMPOTENCY_META_KEY: idempotency_key})
            return await client.call_tool(tool, args, meta=meta)
        except MCPError as exc:
            if exc.code in _TRANSPORT_CODES:
                self.broken(client)
                raise _Unavailable(describe(exc), sent=True) from None
            # The server answered, with an error (unknown tool, invalid params).
            raise McpToolError(f"MCP server {self.name!r}: {exc.message} (code {exc.code})") from None
        except ValidationError as exc:  # an answer that is not a valid result
            raise McpToolError(f"MCP server {self.name!r} gave an invalid result: {describe(exc)}") from None
        except Exception as exc:
            self.broken(client)
            raise _Unavailable(describe(exc), sent=True) from None


class McpToolset:
    """The tools of some MCP servers, and the loop thread that owns their sessions."""

    def __init__(self, servers: Mapping[str, McpServerConfig], *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 relist_interval_s: float = RELIST_INTERVAL_S) -> None:
        self._relist_interval_s = relist_interval_s
        self._sessions = {name: _Session(name, config, connect_timeout_s) for name, config in servers.items()}
        self._connect_timeout_s = connect_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aidawork-mcp", daemon=True)
        self._closed = False
        self.tools: tuple[Tool, ...] = ()
        # Servers listed at start, and those that could not be reached then (no tools).
        self.listed: tuple[str, ...] = ()
        self.unavailable: tuple[str, ...] = ()
        self._relist_lock = threading.Lock()
        self._effects: dict[tuple[str, str], ToolEffect] = {}
        self._last_listing: dict[str, float] = {}

    @classmethod
    def start(cls, servers: Mapping[str, McpServerConfig], *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
              relist_interval_s: float = RELIST_INTERVAL_S) -> McpToolset:
        """Open a session to every server and list its tools. A server that cannot be
        reached is logged (``mcp_server_unavailable``) and listed later (``resolve``)."""
        toolset = cls(servers, connect_timeout_s=connect_timeout_s, relist_interval_s=relist_interval_s)
        toolset._thread.start()
        toolset._list_all()
        return toolset

    def _list_all(self) -> None:
        pending = {name: self._submit(s.list_tools()) for name, s in self._sessions.items()}
        listed: list[str] = []
        for name, future in pending.items():
            tools = self._listed(name, future, phase="start")
            if tools is not None:
                listed.append(name)
                self.tools += tools
        self.listed = tuple(listed)
        self.unavailable = tuple(n for n in self._sessions if n not in listed)

    def _listed(self, name: str, future: concurrent.futures.Future[list[McpTool]], *, phase: str
                ) -> tuple[Tool, ...] | None:
        """The server's tools from its pending listing, or None if it could not be reached."""
        try:
            specs = future.result(timeout=self._connect_timeout_s + CLOSE_TIMEOUT_S)
        except Exception as exc:
            future.cancel()
            _log().warning("mcp_server_unavailable", server=name, phase=phase, error=describe(exc),
                           detail="its tools are listed once it can be reached")
            self._submit(self._sessions[name].close())
            return None
        config = self._sessions[name].config
        tools: list[Tool] = []
        for spec in specs:
            made = tool_of(name, config, spec, partial(self._handle, name, spec.name))
            if isinstance(made, str):
                _log().warning("mcp_tool_skipped", server=name, tool=spec.name[:80], reason=made)
                continue
            tools.append(made)
            self._effects[(name, spec.name)] = made.effect
        unknown = sorted(set(config.effects) - {spec.name for spec in specs})
        if unknown:
            _log().warning("mcp_effects_unknown_tools", server=name, tools=unknown)
        _log().info("mcp_server_listed", server=name, transport=config.kind, tools=len(specs), phase=phase)
        return tuple(tools)

    def resolve(self, name: str) -> tuple[Tool, ...]:
        """For a tool registry that does not know ``name``: if it is a tool of a server that
        could not be reached so far, list that server now (at most every RELIST_INTERVAL_S)
        and return its tools; ``ToolsetUnavailable`` while it still cannot be reached, so a
        run naming its tools is tried again later rather than failed."""
        server = next((s for s in self.unavailable if name.startswith(f"mcp__{s}__")), None)
        if server is None:
            return ()
        with self._relist_lock:
            now = time.monotonic()
            last = self._last_listing.get(server)
            if server in self.unavailable and (last is None or now - last >= self._relist_interval_s):
                self._last_listing[server] = now
                tools = self._listed(server, self._submit(self._sessions[server].list_tools()), phase="late")
                if tools is not None:
                    self.tools += tools
                    self.listed += (server,)
                    self.unavailable = tuple(s for s in self.unavailable if s != server)
                    return tools
        if server in self.unavailable:
            raise ToolsetUnavailable(f"tool {name!r}: MCP server {server!r} cannot be reached yet, so its tools "
                                     "are not known; try again later")
        return ()

    def _submit(self, coro: Coroutine[object, None, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _handle(self, server: str, tool: str, args: JsonObject, ctx: ToolContext) -> JsonValue:
        """A tool's handler: the call on the loop, waited for until the call's deadline."""
        timeout_s = ctx.remaining_s()
        try:
            if self._closed:
                raise _Unavailable("this process is shutting down")
            future = self._submit(self._sessions[server].call(tool, args, ctx.idempotency_key))
            try:
                result = future.result(timeout=timeout_s)
            except concurrent.futures.TimeoutError:
                future.cancel()  # the call's task stops waiting; the session stays open
                raise ToolTimedOut() from None
            except concurrent.futures.CancelledError:
                raise _Unavailable("the call was cancelled (the process is shutting down)") from None
        except _Unavailable as exc:
            _log().warning("mcp_server_unavailable", server=server, tool=tool, run_id=str(ctx.run_id),
                           boundary_seq=ctx.boundary_seq, tool_call_id=ctx.tool_call_id, error=str(exc))
            if exc.sent and self._effects.get((server, tool)) == ToolEffect.AT_MOST_ONCE:
                # It may have run: an at_most_once call's outcome is unknown, not failed.
                raise ToolTimedOut(f"its MCP server {server!r} went away after the call was sent: {exc}") from None
            raise McpServerUnavailable(f"MCP server {server!r} is unavailable: {exc}") from None
        return result_json(server, result)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """End every session (stopping stdio subprocesses) and the loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            done = self._submit(self._close_all())
            with suppress(Exception):
                done.result(timeout=timeout_s)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=timeout_s)
        if not self._thread.is_alive():
            self._loop.close()

    async def _close_all(self) -> None:
        await asyncio.gather(*(s.close() for s in self._sessions.values()), return_exceptions=True)

"""How ``aidawork api`` runs its ASGI app: uvicorn on h11, with limits against slow and
greedy clients decided here, once.

- Header deadline: uvicorn has a keep-alive timeout but none for request headers (any
  byte received cancels the keep-alive timer), so a client that sends one header byte at
  a time holds its connection forever. ``HeaderDeadlineProtocol`` arms a timer whenever
  the connection waits for a request's headers (when it opens, and when a response is
  complete) and closes the connection when it fires before the headers are whole. The
  timer is not reset by data: the headers must arrive within the deadline, however slowly.
- Body deadline: enforced in the app (``worker.api.limits.BodyLimit``), where the body is read.
- Connection cap: uvicorn's ``limit_concurrency`` (503 and close for a request beyond it).
- Header size: h11 refuses headers above ``MAX_HEADER_BYTES`` with 400.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import structlog
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from worker.ops.settings import Settings

log = structlog.get_logger("aidawork.api")

MAX_HEADER_BYTES = 16 * 1024  # h11's own default, stated: larger headers get 400
SHUTDOWN_GRACE_S = 5  # open event streams end this long after SIGTERM; clients resume with Last-Event-ID


class HeaderDeadlineProtocol(H11Protocol):
    """h11 with a deadline for each request's headers (``header_timeout_s``)."""

    header_timeout_s: ClassVar[float] = 10.0
    _header_timer: asyncio.TimerHandle | None = None  # armed: set on the connection's protocol

    def _awaiting_headers(self) -> bool:
        # No cycle yet, or the last one has been answered: the next bytes are a new request.
        return self.cycle is None or self.cycle.response_complete

    def _sync_header_timer(self) -> None:
        if self._awaiting_headers() and not self.transport.is_closing():
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)
        else:
            self._cancel_header_timer()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self._awaiting_headers() and not self.transport.is_closing():
            log.info("request_headers_timed_out", client=self.client and self.client[0], after_s=self.header_timeout_s)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._sync_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._sync_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may already start a pipelined request
        self._sync_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)


def protocol_class(header_timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class uvicorn instantiates per connection, with this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": header_timeout_s})


def serve(app: ASGIApp, settings: Settings, *, host: str, port: int) -> None:
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=protocol_class(settings.api_header_timeout_s),
        # uvicorn refuses a request once connections (this one included) reach the limit;
        # + 1 makes api_max_connections the number of connections served at once.
        limit_concurrency=settings.api_max_connections + 1,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        # uvicorn's access log is replaced by the JSON request_served lines.
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )

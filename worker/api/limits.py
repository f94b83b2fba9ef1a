"""Request bodies of the HTTP API: how large, and how slowly they may arrive (ASGI
middleware, outside the routes). Refusals are ``BodyRefused`` exceptions, rendered by the
API's exception handler, or by ``refuse`` when nothing has read the body yet.

The connection-level limits (header deadline, connection cap) are in ``worker.api.server``;
the ``request_served`` access log in ``worker.api.app``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schema.wire.errors import ErrorCode

# (status, code, message, field, **headers) -> the JSON error response
Refuse = Callable[..., ASGIApp]


class BodyRefused(HTTPException):
    """A body refused before it was parsed; it passes through FastAPI's body reading
    unchanged (an ``HTTPException``), to the API's handler."""

    code = ErrorCode.BODY_REFUSED


class BodyTooLarge(BodyRefused):
    code = ErrorCode.BODY_TOO_LARGE

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the body is larger than {limit} bytes (AIDAWORK_API_MAX_BODY_BYTES)")


class BodyTooSlow(BodyRefused):
    code = ErrorCode.BODY_TIMEOUT

    def __init__(self) -> None:
        super().__init__(
            408,
            "the body did not arrive in time (AIDAWORK_API_BODY_TIMEOUT_S, AIDAWORK_API_BODY_MIN_BYTES_PER_S)",
            headers={"Connection": "close"},  # the rest of the body may still be on its way
        )


@dataclass
class BodyClock:
    """When the body must be whole: ``timeout_s`` after the headers, plus one second per
    ``min_bytes_per_s`` received, so a slow but steady upload of a large body is fine
    and a trickle is not."""

    timeout_s: float
    min_bytes_per_s: int
    started_at: float = field(default_factory=time.monotonic)

    def remaining_s(self, received: int) -> float:
        deadline = self.started_at + self.timeout_s + received / self.min_bytes_per_s
        return max(deadline - time.monotonic(), 0.0)


class BodyLimit:
    """Refuses a body over ``max_bytes`` before anything parses it: at once when the
    Content-Length says so, else as soon as the bytes received pass the limit (chunked
    uploads); and a body that arrives too slowly (``BodyClock``) with 408."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, timeout_s: float, min_bytes_per_s: int, refuse: Refuse
    ) -> None:
        self.app, self.max_bytes, self.refuse = app, max_bytes, refuse
        self.timeout_s, self.min_bytes_per_s = timeout_s, min_bytes_per_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            refused = BodyTooLarge(self.max_bytes)
            await self.refuse(refused.status_code, refused.code, refused.detail, "body")(scope, receive, send)
            return
        clock = BodyClock(self.timeout_s, self.min_bytes_per_s)
        received, whole = 0, False

        async def limited_receive() -> Message:
            nonlocal received, whole
            if whole:  # after the body only http.disconnect comes: no deadline
                return await receive()
            with anyio.move_on_after(clock.remaining_s(received)) as late:
                message = await receive()
            if late.cancelled_caught:
                raise BodyTooSlow()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)

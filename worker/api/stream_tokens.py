"""Stream tokens: what a browser shows ``GET /v1/runs/{id}/events`` instead of a bearer
header, which ``EventSource`` cannot send (``POST /v1/runs/{id}/stream-token``).

A token is ``<payload>.<signature>``: the payload (base64url JSON) names one run, its
owner and an expiry; the signature is HMAC-SHA256 under a key derived from the server
secret (AIDAWORK_SECRET_KEY) for this use only, so a stream token can never stand for a
round proof or the other way round. It is accepted by the events endpoint only, for that
run only, until it expires (AIDAWORK_API_STREAM_TOKEN_TTL_S, 5 minutes by default). It
travels in the query string, which the access log never prints (it logs the path only).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from schema.wire.errors import ErrorCode
from worker.api.errors import ApiError

_PURPOSE = b"aidawork stream token v1"


@dataclass(frozen=True)
class StreamToken:
    token: str
    expires_at: datetime


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class StreamTokens:
    def __init__(self, secret: bytes, ttl_s: int) -> None:
        self._key = hmac.new(secret, _PURPOSE, hashlib.sha256).digest()
        self.ttl_s = ttl_s

    def _sign(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, run_id: UUID, owner: str, *, now: float) -> StreamToken:
        expires = int(now) + self.ttl_s
        payload = _b64(json.dumps({"r": str(run_id), "o": owner, "e": expires}, separators=(",", ":")).encode())
        return StreamToken(f"{payload}.{self._sign(payload)}", datetime.fromtimestamp(expires, UTC))

    def owner_of(self, token: str, run_id: UUID, *, now: float) -> str:
        """The owner the token was issued to, for ``run_id``; a 401 naming what is wrong
        (malformed, bad signature, another run, expired) otherwise."""
        payload, _, signature = token.partition(".")
        if not hmac.compare_digest(self._sign(payload), signature):
            raise _refused("the stream token is not valid")
        try:
            claims = json.loads(_unb64(payload))
            token_run, owner, expires = UUID(claims["r"]), str(claims["o"]), int(claims["e"])
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise _refused("the stream token is not valid") from None
        if token_run != run_id:
            raise _refused("the stream token is for another run")
        if now >= expires:
            raise _refused("the stream token has expired: ask for a new one (POST /v1/runs/{id}/stream-token)")
        return owner


def _refused(message: str) -> ApiError:
    return ApiError(401, ErrorCode.UNAUTHENTICATED, message, "stream_token")

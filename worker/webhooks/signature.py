"""The webhook signature: ``AIDAWORK-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
"<t>.<body>">`` keyed by ``AIDAWORK_WEBHOOK_SECRET``. Signing the timestamp with the body
lets a receiver refuse a replay of an old delivery (``tolerance_s``)."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "AIDAWORK-Signature"
# The outbox row's id: the same for every attempt of one delivery, so a receiver can
# de-duplicate a redelivery (delivery is at least once).
DELIVERY_HEADER = "AIDAWORK-Delivery"
DEFAULT_TOLERANCE_S = 300


def _mac(body: bytes, secret: str, timestamp: int) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(body: bytes, secret: str, timestamp: int) -> str:
    """The ``AIDAWORK-Signature`` value for ``body`` sent at ``timestamp``."""
    return f"t={timestamp},v1={_mac(body, secret, timestamp)}"


def verify_webhook(
    body: bytes, header: str, secret: str, *, tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None
) -> bool:
    """True when ``header`` (the ``AIDAWORK-Signature`` value) signs exactly ``body`` with
    ``secret`` and its timestamp is within ``tolerance_s`` of now. ``body`` is the raw
    request body, before any JSON parsing. Any ``v1`` entry may match (secret rotation)."""
    # The README's receiver code is this function (a unit test runs both on the same cases).
    fields = [part.strip().partition("=") for part in header.split(",")]
    t = next((v for k, _, v in fields if k == "t" and v.isdigit()), None)
    macs = [v for k, _, v in fields if k == "v1"]
    if t is None or not macs or abs((time.time() if now is None else now) - int(t)) > tolerance_s:
        return False
    expected = _mac(body, secret, int(t))
    return any(hmac.compare_digest(expected, mac) for mac in macs)

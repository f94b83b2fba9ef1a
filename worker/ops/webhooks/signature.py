"""The webhook signatures, both keyed by the run's owner's secret (``owner_secret``):

* ``AIDAWORK-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``, keyed by
  the UTF-8 bytes of the secret; signing the timestamp with the body lets a receiver
  refuse a replay of an old delivery (``tolerance_s``);
* Standard Webhooks (``webhook-id``, ``webhook-timestamp``, ``webhook-signature:
  v1,<base64 HMAC-SHA256 of "<id>.<t>.<body>">``), keyed by the same bytes, so a receiver
  can verify with the official libraries given ``standard_secret(secret)``.

An owner's secret is derived from ``AIDAWORK_WEBHOOK_SECRET`` (nothing stored): a
receiver holds only its owner's, so a delivery of another owner's run does not verify."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

SIGNATURE_HEADER = "AIDAWORK-Signature"
# The outbox row's id: the same for every attempt of one delivery, so a receiver can
# de-duplicate a redelivery (delivery is at least once). Also sent as ``webhook-id``.
DELIVERY_HEADER = "AIDAWORK-Delivery"
STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
DEFAULT_TOLERANCE_S = 300
# Domain separation: the master secret keys nothing else with this context.
OWNER_KEY_CONTEXT = "aidawork-webhook-owner:"


def owner_secret(master: str, owner: str) -> str:
    """The owner's webhook secret: hex of HMAC-SHA256(master, "aidawork-webhook-owner:" +
    owner). One-way, so an owner's secret reveals neither the master nor another's."""
    return hmac.new(master.encode(), (OWNER_KEY_CONTEXT + owner).encode(), hashlib.sha256).hexdigest()


def standard_secret(secret: str) -> str:
    """``secret`` as the Standard Webhooks libraries take it: ``whsec_`` + base64 of its
    UTF-8 bytes (the same key bytes as ``AIDAWORK-Signature``)."""
    return "whsec_" + base64.b64encode(secret.encode()).decode()


def _mac(body: bytes, secret: str, timestamp: int) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(body: bytes, secret: str, timestamp: int) -> str:
    """The ``AIDAWORK-Signature`` value for ``body`` sent at ``timestamp``."""
    return f"t={timestamp},v1={_mac(body, secret, timestamp)}"


def standard_signature_header(body: bytes, secret: str, delivery_id: str, timestamp: int) -> str:
    """The Standard Webhooks ``webhook-signature`` value for ``body`` sent as delivery
    ``delivery_id`` (``webhook-id``) at ``timestamp`` (``webhook-timestamp``)."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha256).digest()).decode()


def verify_webhook(
    body: bytes, header: str, secret: str, *, tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None
) -> bool:
    """True when ``header`` (the ``AIDAWORK-Signature`` value) signs exactly ``body`` with
    ``secret`` (the owner's, from ``aidawork owner webhook-secret``) and its timestamp is
    within ``tolerance_s`` of now. ``body`` is the raw request body, before any JSON
    parsing. Any ``v1`` entry may match (secret rotation)."""
    # The README's receiver code is this function (a unit test runs both on the same cases).
    fields = [part.strip().partition("=") for part in header.split(",")]
    t = next((v for k, _, v in fields if k == "t" and v.isdigit()), None)
    macs = [v for k, _, v in fields if k == "v1"]
    if t is None or not macs or abs((time.time() if now is None else now) - int(t)) > tolerance_s:
        return False
    expected = _mac(body, secret, int(t))
    return any(hmac.compare_digest(expected, mac) for mac in macs)

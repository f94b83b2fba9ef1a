"""The ``aidawork webhooks`` process: POSTs the outbox's due deliveries, signed.

It runs apart from the workers and beat, so a slow or dead receiver can hold only its own
threads: a round never waits for a webhook (its event's outbox row is committed with the
event, by a trigger, and this process picks it up afterwards). Several of these processes
may run; their claims never overlap (``schema.store.webhooks``).

Delivery is at least once: a crash between a receiver's 2xx and the record of it
delivers again after the attempt's lease, with the same ``AIDAWORK-Delivery`` id.

Each delivery is signed with its run's owner's key (``signature.owner_secret``), and its
URL is checked again before each attempt: a URL stored before the submit-time check got
stricter (or by another path into the store) is failed, never called.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import httpx
import structlog
from sqlalchemy import Engine

from schema.store import webhooks as outbox
from schema.store.webhooks import DueDelivery, OutboxListener
from schema.wire.vocab import WebhookStatus
from worker.ops.settings import Settings
from worker.ops.webhooks.policy import WebhookRefused, check_url_shape, check_webhook_url, retry_delay_s, url_origin
from worker.ops.webhooks.signature import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    STANDARD_ID_HEADER,
    STANDARD_SIGNATURE_HEADER,
    STANDARD_TIMESTAMP_HEADER,
    owner_secret,
    signature_header,
    standard_signature_header,
)

log = structlog.get_logger("aidawork.webhooks")
USER_AGENT = "aidawork-webhooks/1"


@dataclass(frozen=True)
class AttemptResult:
    status_code: int | None
    error: str | None  # None: delivered (a 2xx)


def lease_s(timeout_s: float) -> float:
    """How long a claimed attempt is held before another deliverer may retry it: past
    the longest a healthy attempt can take (connect, write and read, each up to the
    timeout), so an attempt in flight is not sent twice."""
    return 3 * timeout_s + 5


def body_of(delivery: DueDelivery) -> bytes:
    """The event as the event stream serves it, plus its run's ``owner``: signed with the
    body, so a receiver can check the owner is the one it serves."""
    return json.dumps({**delivery.event.model_dump(mode="json"), "owner": delivery.owner},
                      ensure_ascii=False, separators=(",", ":")).encode()


def post(http: httpx.Client, delivery: DueDelivery, secret: str) -> AttemptResult:
    """One attempt, signed with ``secret`` (the owner's) in both schemes. The error names
    the status or the exception's type, never the URL."""
    body, sent_at, delivery_id = body_of(delivery), int(time.time()), str(delivery.id)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature_header(body, secret, sent_at),
        DELIVERY_HEADER: delivery_id,
        STANDARD_ID_HEADER: delivery_id,
        STANDARD_TIMESTAMP_HEADER: str(sent_at),
        STANDARD_SIGNATURE_HEADER: standard_signature_header(body, secret, delivery_id, sent_at),
    }
    try:
        # Streamed and closed unread: the status is all we need from a receiver.
        with http.stream("POST", delivery.url, content=body, headers=headers) as response:
            code = response.status_code
    except httpx.TimeoutException as exc:
        return AttemptResult(None, f"timeout ({type(exc).__name__})")
    # InvalidURL is not an HTTPError: a URL httpx refuses is a failed attempt like any other.
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return AttemptResult(None, type(exc).__name__)
    if 200 <= code < 300:
        return AttemptResult(code, None)
    return AttemptResult(code, f"HTTP {code}")


class Deliverer:
    def __init__(self, engine: Engine, settings: Settings, http: httpx.Client | None = None) -> None:
        if settings.webhook_secret is None:
            raise ValueError("AIDAWORK_WEBHOOK_SECRET is not set")
        self.engine, self.settings = engine, settings
        self._master = settings.webhook_secret.get_secret_value()
        self.http = http or httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False)
        # httpx logs every request's URL at INFO: the URL may hold a token.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    def attempt(self, delivery: DueDelivery) -> WebhookStatus | None:
        """POST one claimed delivery and record how it went; its new status (None: the
        lease had been taken over by another deliverer meanwhile)."""
        refusal = self._refusal(delivery.url)
        result = refusal or post(self.http, delivery, owner_secret(self._master, delivery.owner))
        fields = {
            "delivery_id": delivery.id,
            "run_id": str(delivery.event.run_id),
            "event_kind": delivery.event.kind.value,
            "event_seq": delivery.event.seq,
            "attempt": delivery.attempt,
            "target": url_origin(delivery.url),
            "status_code": result.status_code,
        }
        if result.error is None:
            recorded = outbox.record_delivered(self.engine, delivery, result.status_code or 200)
            log.info("webhook_delivered", **fields, recorded=recorded)
            return WebhookStatus.DELIVERED if recorded else None
        s = self.settings
        retry_in_s = retry_delay_s(delivery.attempt, base_s=s.webhook_backoff_s, max_s=s.webhook_backoff_max_s)
        # A refusal does not heal with time: an empty window fails the delivery now.
        retry_for_s = 0.0 if refusal else s.webhook_retry_for_s
        status = outbox.record_attempt_failed(
            self.engine, delivery, status_code=result.status_code, error=result.error,
            retry_in_s=retry_in_s, retry_for_s=retry_for_s,
        )
        if status is WebhookStatus.FAILED:
            log.warning("webhook_failed", **fields, error=result.error)
        else:
            log.info("webhook_attempt_failed", **fields, error=result.error, retry_in_s=round(retry_in_s, 3))
        return status

    def _refusal(self, url: str) -> AttemptResult | None:
        """The URL checked again, as at submit: against this process's prefixes if it has
        them (the deliverer needs no ``AIDAWORK_WEBHOOK_URLS``), else its shape alone."""
        prefixes = self.settings.webhook_prefixes
        try:
            check_webhook_url(url, prefixes) if prefixes else check_url_shape(url)
        except WebhookRefused as exc:
            return AttemptResult(None, f"{exc.code}: {exc.message}")
        return None

    def _safe_attempt(self, delivery: DueDelivery) -> None:
        try:
            self.attempt(delivery)
        except Exception as exc:  # the database, mostly: the lease brings the delivery back
            log.error("webhook_attempt_crashed", delivery_id=delivery.id, error=type(exc).__name__)

    def run(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` is set: claim as many due rows as there are free
        threads, then sleep until a NOTIFY, a finished attempt or the poll interval."""
        s = self.settings
        listener: OutboxListener | None = None
        inflight: set[Future[None]] = set()
        with ThreadPoolExecutor(max_workers=s.webhook_concurrency, thread_name_prefix="webhook") as pool:
            log.info("webhook_deliverer_started", concurrency=s.webhook_concurrency)
            while not stop.is_set():
                listener = listener or self._listen()
                inflight = {f for f in inflight if not f.done()}
                free = s.webhook_concurrency - len(inflight)
                claimed = self._claim(free) if free else []
                inflight |= {pool.submit(self._safe_attempt, d) for d in claimed}
                if not free or len(claimed) == free:  # every thread busy: wait for one
                    wait(inflight, timeout=s.webhook_poll_s, return_when=FIRST_COMPLETED)
                elif not claimed:
                    listener = self._wait(listener, s.webhook_poll_s)
        if listener is not None:
            listener.close()

    def _claim(self, limit: int) -> list[DueDelivery]:
        try:
            return outbox.claim_due(self.engine, limit=limit, lease_s=lease_s(self.settings.webhook_timeout_s))
        except Exception as exc:
            log.warning("webhook_claim_failed", error=type(exc).__name__)
            time.sleep(self.settings.webhook_poll_s)
            return []

    def _listen(self) -> OutboxListener | None:
        try:
            return OutboxListener(self.engine)
        except Exception as exc:  # the poll still finds deliveries; LISTEN is tried again
            log.warning("webhook_listen_failed", error=type(exc).__name__)
            return None

    def _wait(self, listener: OutboxListener | None, timeout_s: float) -> OutboxListener | None:
        if listener is None:
            time.sleep(timeout_s)
            return None
        try:
            listener.wait(timeout_s)
            return listener
        except Exception as exc:
            log.warning("webhook_listen_lost", error=type(exc).__name__)
            listener.close()
            return None

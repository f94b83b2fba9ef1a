"""The webhook outbox (``webhook_deliveries``): claiming due deliveries, recording how each
attempt ended, the run's deliveries for its view, and waking a deliverer on NOTIFY.

Rows are written by the trigger of migration 0012 in the transaction of their event, so
no code path that emits an event can forget them. A claim takes due rows with
``FOR UPDATE SKIP LOCKED`` (several deliverers never take the same row) and commits at
once: no transaction stays open while a receiver is called. The claim counts the attempt
and leases the row (``next_attempt_at`` moves past the attempt's timeout); the attempt's
end is fenced by that count, so a deliverer that outlived its lease changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine, TextClause, text

from schema.store.bodies import event_data_sql
from schema.store.tx import run_transaction
from schema.wire import TERMINAL_STATUSES, RunEvent, WebhookDeliveryView
from schema.wire.vocab import WebhookStatus

NOTIFY_CHANNEL = "aidawork_webhooks"


@dataclass(frozen=True)
class DueDelivery:
    """One claimed attempt: ``attempt`` fences its end; ``url`` is a secret (never log it)."""

    id: int
    attempt: int
    url: str
    event: RunEvent
    created_at: datetime
    owner: str  # the run's: its deliveries are signed with this owner's key


_CLAIM_SQL = text(
    f"""
WITH due AS (
  SELECT id FROM webhook_deliveries
  WHERE status = 'pending' AND next_attempt_at <= now()
  ORDER BY next_attempt_at LIMIT :limit
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE webhook_deliveries AS d
  SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => :lease_s)
  FROM due WHERE d.id = due.id
  RETURNING d.id, d.run_id, d.event_seq, d.attempts, d.created_at
)
SELECT c.id, c.attempts AS attempt, c.created_at AS queued_at, r.webhook_url AS url, r.owner,
  e.run_id, e.seq, e.kind, {event_data_sql("e")} AS data, e.created_at
FROM claimed AS c JOIN runs AS r ON r.id = c.run_id
  JOIN run_events AS e ON e.run_id = c.run_id AND e.seq = c.event_seq
ORDER BY c.id
"""
)


def claim_due(engine: Engine, *, limit: int, lease_s: float) -> list[DueDelivery]:
    """Up to ``limit`` due deliveries, each leased for ``lease_s`` and its attempt counted."""
    rows = run_transaction(
        engine,
        lambda conn: conn.execute(_CLAIM_SQL, {"limit": limit, "lease_s": lease_s}).all(),
        name="claim_webhooks",
        single_statement=True,
    )
    return [
        DueDelivery(
            id=row.id,
            attempt=row.attempt,
            url=row.url,
            created_at=row.queued_at,
            owner=row.owner,
            event=RunEvent.model_validate(
                {"run_id": row.run_id, "seq": row.seq, "kind": row.kind, "data": row.data, "created_at": row.created_at}
            ),
        )
        for row in rows
    ]


_DELIVERED_SQL = text(
    "UPDATE webhook_deliveries SET status = 'delivered', next_attempt_at = NULL, delivered_at = now(), "
    "last_status_code = :code, last_error = NULL "
    "WHERE id = :id AND attempts = :attempt AND status = 'pending' RETURNING status"
)

# Gives up when the next attempt would fall after the retry window (counted from the event).
_PAST_WINDOW = "now() + make_interval(secs => :retry_in_s) > created_at + make_interval(secs => :retry_for_s)"
_ATTEMPT_FAILED_SQL = text(
    f"""
UPDATE webhook_deliveries SET last_status_code = :code, last_error = :error,
  status = CASE WHEN {_PAST_WINDOW} THEN 'failed' ELSE 'pending' END,
  next_attempt_at = CASE WHEN {_PAST_WINDOW} THEN NULL ELSE now() + make_interval(secs => :retry_in_s) END
WHERE id = :id AND attempts = :attempt AND status = 'pending'
RETURNING status
"""
)


def record_delivered(engine: Engine, delivery: DueDelivery, status_code: int) -> bool:
    """The receiver answered 2xx. False: the attempt's lease had been taken over."""
    return _record(engine, _DELIVERED_SQL, {"id": delivery.id, "attempt": delivery.attempt, "code": status_code})


def record_attempt_failed(
    engine: Engine,
    delivery: DueDelivery,
    *,
    status_code: int | None,
    error: str,
    retry_in_s: float,
    retry_for_s: float,
) -> WebhookStatus | None:
    """Schedule the next attempt in ``retry_in_s``, or fail the delivery when that is past
    the retry window; the new status, or None when the lease had been taken over."""
    params = {
        "id": delivery.id,
        "attempt": delivery.attempt,
        "code": status_code,
        "error": error,
        "retry_in_s": retry_in_s,
        "retry_for_s": retry_for_s,
    }
    status = run_transaction(
        engine,
        lambda conn: conn.execute(_ATTEMPT_FAILED_SQL, params).scalar_one_or_none(),
        name="record_webhook",
        single_statement=True,
    )
    return None if status is None else WebhookStatus(status)


def _record(engine: Engine, sql: TextClause, params: Mapping[str, object]) -> bool:
    found = run_transaction(
        engine, lambda conn: conn.execute(sql, params).scalar_one_or_none(), name="record_webhook",
        single_statement=True,
    )
    return found is not None


_DELIVERIES_SQL = text(
    "SELECT id, event_seq, event_kind, status, attempts, last_status_code, last_error, next_attempt_at, "
    "delivered_at FROM webhook_deliveries WHERE run_id = :run_id ORDER BY event_seq"
)


def deliveries_of(conn: Connection, run_id: UUID) -> list[WebhookDeliveryView]:
    """The run's webhook deliveries, oldest first (``conn``: an open Connection)."""
    rows = conn.execute(_DELIVERIES_SQL, {"run_id": run_id})
    return [WebhookDeliveryView.model_validate(dict(r._mapping)) for r in rows]


# A URL is set only on a run that has not ended (no event is left to send it); it may be
# cleared at any time, and clearing it fails what is still pending for it, since the
# claim would join a run with no URL to send it to.
_ENDED = ", ".join(f"'{status.value}'" for status in sorted(TERMINAL_STATUSES))
_SET_WEBHOOK_SQL = text(
    "UPDATE runs SET webhook_url = CAST(:url AS text) WHERE id = :run_id AND owner = :owner "
    f"AND (CAST(:url AS text) IS NULL OR status NOT IN ({_ENDED})) RETURNING id"
)
_DROP_PENDING_SQL = text(
    "UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL, last_error = 'webhook removed' "
    "WHERE run_id = :run_id AND status = 'pending'"
)
_WEBHOOK_URL_SQL = text("SELECT webhook_url FROM runs WHERE id = :run_id AND owner = :owner")


def set_webhook_txn(conn: Connection, run_id: UUID, owner: str, url: str | None) -> bool:
    """Set (or, with ``url`` None, clear) the webhook of ``owner``'s run; the caller has
    checked the URL (``check_webhook_url``). False: no such run of this owner, or (setting)
    it has ended."""
    params = {"run_id": run_id, "owner": owner, "url": url}
    if conn.execute(_SET_WEBHOOK_SQL, params).one_or_none() is None:
        return False
    if url is None:
        conn.execute(_DROP_PENDING_SQL, {"run_id": run_id})
    return True


def read_webhook_url_txn(conn: Connection, run_id: UUID, owner: str) -> str | None:
    """The webhook URL of ``owner``'s run (None: it has none, or it is not theirs). A secret:
    only its owner is shown it, and it is never logged."""
    url: str | None = conn.execute(_WEBHOOK_URL_SQL, {"run_id": run_id, "owner": owner}).scalar_one_or_none()
    return url


class OutboxListener:
    """A dedicated connection LISTENing on the outbox channel: ``wait`` returns as soon as
    a new delivery was committed (or after the timeout: the deliverer polls as well, so a
    lost connection or a pooler that drops LISTEN only slows deliveries to the poll)."""

    def __init__(self, engine: Engine) -> None:
        self._raw: Any = engine.raw_connection()
        conn = self._raw.driver_connection  # the psycopg connection
        if conn is None:
            raise RuntimeError("the pool gave a closed connection")
        conn.autocommit = True
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        self._conn = conn

    def wait(self, timeout_s: float) -> bool:
        """True when a notification arrived; every pending one is consumed."""
        got = any(True for _ in self._conn.notifies(timeout=timeout_s, stop_after=1))
        if got:  # a burst of commits needs one claim, not one per notification
            for _ in self._conn.notifies(timeout=0):
                pass
        return got

    def close(self) -> None:
        try:
            self._raw.invalidate()  # never back to the pool: it is in autocommit and LISTENing
        finally:
            self._raw.close()

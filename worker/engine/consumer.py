"""Celery's consumer (``worker_consumer``), with its task events sent in batches on a
timer instead of at the event loop's next turn.

The worker buffers its task events (``task-received``, ``-started``, ``-succeeded``,
``-failed``) and Celery flushes the buffer as one ``task.multi`` message at the loop's
next turn after each event; the events of a round come at three different moments
(its message taken, its thread started, its thread done), two of them from the round's
thread, which also wakes the loop to flush. So a round cost three event publishes (a
Redis PUBLISH each, in the loop's thread) and two wake-ups: about 9 % of a worker's CPU
per round (py-spy). Here the loop flushes every ``EVENTS_FLUSH_S`` instead (and Celery's
own flush at 24 buffered events stays), so a busy worker sends one message for the
events of many rounds, and a round's thread does not wake the loop for them. Flower
sees every event as before, at most ``EVENTS_FLUSH_S`` later. What is still buffered
when the consumer shuts down is flushed first.

Task events are off until a monitor turns them on (``enable_events``, which Flower
broadcasts: ``worker.ops.celery_app``); the dispatcher buffers the ``task`` group either
way, so this timer flushes them from the moment they are on (until then it finds the
buffer empty: no Redis command).

Overrides Celery's private methods: used only with the tested Celery versions, and not
with ``AIDAWORK_STOCK_BROKER`` (``worker.ops.celery_app``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from celery.worker.consumer import Consumer as CeleryConsumer

EVENTS_FLUSH_S = 0.1


class _Timer(Protocol):  # kombu's timer entry
    def cancel(self) -> None: ...


class _Hub(Protocol):  # what is used of kombu's event loop
    def call_repeatedly(self, secs: float, fun: Callable[[], object]) -> _Timer: ...


class Consumer(CeleryConsumer):  # type: ignore[misc]
    _events_timer: _Timer | None = None

    def on_send_event_buffered(self) -> None:
        # The loop's timer flushes (register_with_event_loop): nothing to wake it for.
        return None

    def register_with_event_loop(self, hub: _Hub) -> None:
        super().register_with_event_loop(hub)
        # Called again when the consumer restarts its loop (a lost broker connection):
        # one timer at a time.
        if self._events_timer is not None:
            self._events_timer.cancel()
        self._events_timer = hub.call_repeatedly(EVENTS_FLUSH_S, self._flush_events)

    def shutdown(self) -> None:
        self._flush_events()
        super().shutdown()

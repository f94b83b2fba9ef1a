"""The Redis transport, with one change: a channel reuses one Redis client for its
synchronous commands instead of building a new one for every publish and ack.

kombu's Redis channel creates a ``redis.Redis`` object per operation
(``Channel.conn_or_acquire``), and each builds its table of ~200 response callbacks: about
6 % of a worker's CPU per round, measured with py-spy. A ``redis.Redis`` client takes a
connection from its pool for each command and is safe to share between threads, so one
per channel is enough. Selected in ``worker.app`` with ``broker_transport``."""

from __future__ import annotations

import threading
from typing import Any

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync_client: Any = None
        self._sync_client_lock = threading.Lock()
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _create_client(self, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            # The channel was closed under us (the broker went away and the consumer is
            # reconnecting): a connection error, which Celery recovers from, rather than
            # kombu's AttributeError on the missing connection, which stops the consumer.
            raise redis.exceptions.ConnectionError("the broker connection of this channel is closed")
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        if self._sync_client is None:
            with self._sync_client_lock:
                if self._sync_client is None:
                    self._sync_client = super()._create_client(asynchronous=False)  # type: ignore[no-untyped-call]
        return self._sync_client

    def _disconnect_pools(self) -> None:
        self._sync_client = None  # bound to the pool being dropped
        super()._disconnect_pools()  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel

"""The Redis transport, with two changes: a channel reuses one Redis client for its
synchronous commands instead of building a new one for every publish and ack, and its
BRPOP serves the queues in turn, each at its own priority order.

kombu's Redis channel creates a ``redis.Redis`` object per operation
(``Channel.conn_or_acquire``), and each builds its table of ~200 response callbacks: about
6 % of a worker's CPU per round, measured with py-spy. Here a channel keeps one client,
and that client keeps one connection (``single_connection_client``, which redis-py guards
with a lock for the threads that share it) instead of taking one from the pool for every
command: taking and giving back a pooled connection costs about as much CPU as the LPUSH
of a round's message itself (a third of its cost, measured alone). The commands of this
client are all short (a publish, a queue's length); BRPOP has its own client, and a
pipeline (the unacked bookkeeping) still takes a pooled connection. After a broken
connection redis-py reconnects the same connection on the next command.

Fair share (``runtime.shares``) needs the consumer to take one message per turn from each
non-empty round queue. kombu's channel already rotates its queues (``round_robin``: the
queue a message came from moves to the end), but it lists the BRPOP keys priority first,
across queues (every queue's step 0, then every queue's step 1, ...), so one queue's
urgent message would jump every other queue's turn: one owner's priorities would outrank
another owner's share. Here the keys are listed queue first (the first queue's steps in
order, then the next queue's), so BRPOP pops from the first non-empty queue of the
rotation, the most urgent of that queue's messages: priorities order rounds within a
queue, the rotation between queues. Selected in ``worker.app`` with ``broker_transport``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from time import monotonic
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

# Packed BRPOP commands kept per channel, one per queue order (the rotation of a few
# owners' queues visits far fewer; past this many the cache starts over).
BRPOP_CACHE_MAX = 512


def brpop_keys(queues: Sequence[str], steps: Sequence[int], key_for: Callable[[str, int], str]) -> list[str]:
    """BRPOP's keys for queues in their turn order: queue first, then priority steps."""
    return [key_for(queue, step) for queue in queues for step in steps]


class Channel(kombu_redis.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync_client: Any = None
        self._sync_client_lock = threading.Lock()
        self._brpop_packed: dict[tuple[tuple[str, ...], float], Any] = {}
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
                    self._sync_client = self.Client(connection_pool=self.pool, single_connection_client=True)
        return self._sync_client

    def _brpop_start(self, timeout: float | None = None) -> None:
        # kombu 5.x's own _brpop_start, with the keys in brpop_keys' order (see above).
        if timeout is None:
            timeout = float(self.brpop_timeout)
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        connection = self.client.connection
        key = (tuple(queues), timeout)
        packed = self._brpop_packed.get(key)
        if packed is None:
            keys: list[Any] = brpop_keys(queues, self.priority_steps, self._q_for_pri)
            command_args = ["BRPOP", *keys, timeout or 0]
            if self.global_keyprefix:
                command_args = self.client._prefix_args(command_args)
            packed = connection.pack_command(*command_args)
            if len(self._brpop_packed) >= BRPOP_CACHE_MAX:
                self._brpop_packed.clear()
            self._brpop_packed[key] = packed
        self._in_poll = connection
        self._brpop_sent_at = monotonic()  # type: ignore[assignment]  # kombu declares it None
        connection.send_packed_command(packed)

    def _disconnect_pools(self) -> None:
        self._sync_client = None  # bound to the pool being dropped
        self._brpop_packed.clear()
        super()._disconnect_pools()  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel

"""The Redis transport, with three changes: a channel reuses one Redis client for its
synchronous commands instead of building a new one for every publish and ack, its BRPOP
serves the queues in turn, each at its own priority order, and under a backlog it takes
messages in batches, in that same order.

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
queue, the rotation between queues.

Intake in batches: after each BRPOP the channel takes up to ``BATCH_MAX`` more messages
(never more than its free prefetch slots) in one Lua script, ``TAKE_MORE_LUA``, which pops
them as that many BRPOPs would: over the same keys, with the same rotation after each
message, so the fair share and the priorities hold (tests/e2e/test_broker_client.py
compares the two orders). A process with hundreds of round threads gives the GIL up at
every blocking call and then waits for it among them; the event loop's thread did that
for every message it took (the BRPOP sent, polled and read), so under a backlog the
messages waited in Redis while round threads sat idle (the README, issue 9, has the
figures). When a batch finds nothing (no backlog), the next ``PROBE_EVERY - 1`` BRPOPs
take none, so a worker that keeps up does not pay an empty call per message. A batch's
messages are in the worker's memory only, as any prefetched message is (no ack
emulation, ``worker.ops.celery_app``).

Selected in ``worker.ops.celery_app`` with ``broker_transport``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from time import monotonic
from typing import TypeAlias

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.json import loads

# Packed commands (a BRPOP, a batch's EVAL) kept per channel, one per queue order and
# parameter (the rotation of a few owners' queues visits far fewer; past this many the
# cache starts over).
PACKED_CACHE_MAX = 512
# At most this many more messages per BRPOP (one script's work in Redis, and the event
# loop's between two polls), and never more than the free prefetch slots.
BATCH_MAX = 128
# A batch that found nothing is tried again after this many BRPOPs.
PROBE_EVERY = 8

# KEYS: the BRPOP keys in brpop_keys' order, ARGV[1] queues of ARGV[2] priority steps each;
# ARGV[3]: at most this many messages. Each message is popped from the first non-empty key
# (a queue's steps in order, queue by queue), and its queue then moves to the end of the
# order, as kombu's round-robin cycle does after a BRPOP. Returns the 1-based index of each
# message's key, then the message, for each message in the order taken.
TAKE_MORE_LUA = """
local queues, steps, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local order, empty, taken = {}, {}, {}
for q = 1, queues do order[q] = q end
while #taken < 2 * limit do
  local popped = false
  for pos, q in ipairs(order) do
    for s = 1, steps do
      local key = (q - 1) * steps + s
      if not empty[key] then
        local message = redis.call('RPOP', KEYS[key])
        if message then
          taken[#taken + 1] = key
          taken[#taken + 1] = message
          table.remove(order, pos)
          order[#order + 1] = q
          popped = true
          break
        end
        empty[key] = true
      end
    end
    if popped then break end
  end
  if not popped then break end
end
return taken
"""


# A packed command's cache key (its command, queue order and parameter) and what is kept:
# the packed command, opaque, and the keys it names.
PackKey: TypeAlias = tuple[str, tuple[str, ...], float]
Packed: TypeAlias = tuple[object, list[str]]


def brpop_keys(queues: Sequence[str], steps: Sequence[int], key_for: Callable[[str, int], str]) -> list[str]:
    """BRPOP's keys for queues in their turn order: queue first, then priority steps."""
    return [key_for(queue, step) for queue in queues for step in steps]


class Channel(kombu_redis.Channel):
    def __init__(self, *args: object, **kwargs: object) -> None:
        self._sync_client: redis.Redis | None = None
        self._sync_client_lock = threading.Lock()
        self._packed: dict[PackKey, Packed] = {}
        self._backlog = True  # the last batch found messages (or none was tried yet)
        self._since_probe = 0
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _create_client(self, asynchronous: bool = False) -> redis.Redis:
        if self.connection is None or self.connection.client is None:
            # The channel was closed under us (the broker went away and the consumer is
            # reconnecting): a connection error, which Celery recovers from, rather than
            # kombu's AttributeError on the missing connection, which stops the consumer.
            raise redis.exceptions.ConnectionError("the broker connection of this channel is closed")
        if asynchronous:
            event_loop_client: redis.Redis = super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
            return event_loop_client
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

        def pack() -> Packed:
            keys = brpop_keys(queues, self.priority_steps, self._q_for_pri)
            command_args: list[str | float] = ["BRPOP", *keys, timeout or 0]
            if self.global_keyprefix:
                command_args = self.client._prefix_args(command_args)
            return connection.pack_command(*command_args), keys

        packed, _ = self._packed_once(("BRPOP", tuple(queues), timeout), pack)
        self._in_poll = connection
        self._brpop_sent_at = monotonic()  # type: ignore[assignment]  # kombu declares it None
        connection.send_packed_command(packed)

    def _brpop_read(self, **options: object) -> bool:
        delivered = bool(super()._brpop_read(**options))  # type: ignore[no-untyped-call]
        self._take_more()
        return delivered

    def _take_more(self) -> None:
        """After a BRPOP's message, the messages the next BRPOPs would take, up to the
        free prefetch slots and BATCH_MAX, in one call (see the module's docstring). It
        runs on the BRPOP's own connection, idle until the event loop sends the next
        BRPOP, as a packed EVAL kept per queue order and size (a power of two)."""
        self._since_probe += 1
        if self.global_keyprefix or (not self._backlog and self._since_probe < PROBE_EVERY):
            return
        free = self.qos.can_consume_max_estimate()
        most = BATCH_MAX if free is None else min(BATCH_MAX, free)
        if most <= 0:
            return
        self._since_probe = 0
        limit = 1 << (most.bit_length() - 1)
        queues = self._queue_cycle.consume(len(self.active_queues))
        steps = len(self.priority_steps)
        connection = self.client.connection

        def pack() -> Packed:
            keys = brpop_keys(queues, self.priority_steps, self._q_for_pri)
            return connection.pack_command("EVAL", TAKE_MORE_LUA, len(keys), *keys, len(queues), steps, limit), keys

        packed, keys = self._packed_once(("EVAL", tuple(queues), limit), pack)
        try:
            connection.send_packed_command(packed)
            taken = self.client.parse_response(connection, "EVAL")
        except self.connection_errors:
            connection.disconnect()  # as after a failed BRPOP: the next command reconnects
            raise
        self._backlog = bool(taken)
        batch = [(int(index) - 1, raw) for index, raw in zip(taken[::2], taken[1::2], strict=True)]
        for i, (at, raw) in enumerate(batch):
            queue = queues[at // steps]
            self._queue_cycle.rotate(queue)
            try:
                self.connection._deliver(loads(raw), queue)  # type: ignore[no-untyped-call]
            except BaseException:
                # The rest back where they were, each at the head of the key it came from.
                client = self._create_client()
                for rest_at, rest in reversed(batch[i + 1 :]):
                    client.rpush(keys[rest_at], rest)
                raise

    def _packed_once(self, key: PackKey, pack: Callable[[], Packed]) -> Packed:
        """What ``pack`` returns (a packed command and its keys), computed once per ``key``."""
        packed = self._packed.get(key)
        if packed is None:
            if len(self._packed) >= PACKED_CACHE_MAX:
                self._packed.clear()
            packed = self._packed[key] = pack()
        return packed

    def _disconnect_pools(self) -> None:
        self._sync_client = None  # bound to the pool being dropped
        self._packed.clear()
        super()._disconnect_pools()  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel

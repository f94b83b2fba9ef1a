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
compares the two orders). On Redis >= 7.0 (the server's version read once per
connection, ``INFO server``) the script finds each message with one LMPOP over the keys
still possibly non-empty, and an empty search costs one: a batch is a few commands, where
walking the 16 queues x 10 priority steps with RPOP cost up to 160 (about 44 commands per
round under a backlog, measured with bench/stack.py). An older server gets that RPOP walk
(``TAKE_MORE_RPOP_LUA``), in the same order.

Why batches: a process with hundreds of round threads gives the GIL up at every blocking
call and then waits for it among them; the event loop's thread did that
for every message it took (the BRPOP sent, polled and read), so under a backlog the
messages waited in Redis while round threads sat idle (the README, issue 9, has the
figures). When a batch finds nothing (no backlog), the next ``PROBE_EVERY - 1`` BRPOPs
take none, so a worker that keeps up does not pay an empty call per message. A batch's
messages are in the worker's memory only, as any prefetched message is (no ack
emulation, ``worker.ops.celery_app``).

Selected in ``worker.ops.celery_app`` with ``broker_transport`` (``SentinelTransport`` for a
``sentinel://`` broker URL: the same channel over kombu's Sentinel connection pools). It overrides private
methods of kombu's Redis channel (``_brpop_start``, ``_brpop_read``, ``_create_client``,
``_disconnect_pools``), so it is used only with the kombu versions it was tested with
(pinned in pyproject.toml), and not with ``AIDAWORK_STOCK_BROKER``, which selects kombu's
stock transport."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from time import monotonic
from typing import TypeAlias

import redis
import structlog
from kombu.transport import redis as kombu_redis
from kombu.utils.json import loads

log = structlog.get_logger("aidawork.broker")

# Packed commands (a BRPOP, a batch's EVAL) kept per channel, one per queue order and
# parameter (the rotation of a few owners' queues visits far fewer; past this many the
# cache starts over).
PACKED_CACHE_MAX = 512
# At most this many more messages per BRPOP (one script's work in Redis, and the event
# loop's between two polls), and never more than the free prefetch slots.
BATCH_MAX = 128
# A batch that found nothing is tried again after this many BRPOPs.
PROBE_EVERY = 8

# Both scripts: KEYS are the BRPOP keys in brpop_keys' order, ARGV[1] queues of ARGV[2]
# priority steps each; ARGV[3]: at most this many messages. Each message is popped from the
# first non-empty key (a queue's steps in order, queue by queue), and its queue then moves
# to the end of the order, as kombu's round-robin cycle does after a BRPOP. Both return the
# 1-based index of each message's key, then the message, for each message in the order
# taken. A script runs atomically, so a key found empty stays empty until it returns.
#
# On Redis >= 7.0: LMPOP pops from the first non-empty key of the list it is given, so one
# call finds each message (every command a script calls counts in Redis's INFO
# commandstats, and costs a command's dispatch), and a search that finds nothing costs one.
# The keys listed before the one a message came from are empty: they are left out of the
# next search. Once every key that may hold a message belongs to one queue, the next
# messages all come from that queue (the others are empty), so one LMPOP with a COUNT takes
# them from its first non-empty step. Redis's Lua unpacks a call of up to ~8000 arguments:
# the 16 queues x 10 steps of a default setup are 160 keys.
TAKE_MORE_LUA = """
local queues, steps, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local order, empty, index, taken = {}, {}, {}, {}
for q = 1, queues do order[q] = q end
for i, key in ipairs(KEYS) do index[key] = i end
local left = limit
while left > 0 do
  local call, only, alone = {'LMPOP', 0}, nil, true
  for _, q in ipairs(order) do
    for s = 1, steps do
      local i = (q - 1) * steps + s
      if not empty[i] then
        call[#call + 1] = KEYS[i]
        if only == nil then only = q elseif only ~= q then alone = false end
      end
    end
  end
  local searched = #call - 2
  if searched == 0 then break end
  local count = alone and left or 1
  call[2] = searched
  call[#call + 1] = 'RIGHT'
  call[#call + 1] = 'COUNT'
  call[#call + 1] = count
  local found = redis.call(unpack(call))
  if not found then break end
  local at = index[found[1]]
  for k = 3, searched + 2 do
    if call[k] == found[1] then break end
    empty[index[call[k]]] = true
  end
  for _, message in ipairs(found[2]) do
    taken[#taken + 1] = at
    taken[#taken + 1] = message
  end
  left = left - #found[2]
  if #found[2] < count then empty[at] = true end
  local q = math.floor((at - 1) / steps) + 1
  for pos, queue in ipairs(order) do
    if queue == q then table.remove(order, pos) break end
  end
  order[#order + 1] = q
end
return taken
"""

# Redis < 7.0 (no LMPOP): one RPOP per key tried, each key at most once per call.
TAKE_MORE_RPOP_LUA = """
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
# False: every channel takes its batches with TAKE_MORE_RPOP_LUA (the tests compare both).
USE_LMPOP = True
LMPOP_SINCE = (7, 0)  # the Redis version that has LMPOP


# A packed command's cache key (its command, queue order and parameter) and what is kept:
# the packed command, opaque, and the keys it names.
PackKey: TypeAlias = tuple[str, tuple[str, ...], float]
Packed: TypeAlias = tuple[object, list[str]]


def redis_version(text: str) -> tuple[int, ...]:
    """``INFO server``'s ``redis_version`` (``7.0.15``) as numbers; () if unreadable."""
    parts: list[int] = []
    for part in text.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


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
        self._lmpop: bool | None = None  # the server has LMPOP (asked once per connection)
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

        lmpop = self._server_has_lmpop()
        script = TAKE_MORE_LUA if lmpop else TAKE_MORE_RPOP_LUA

        def pack() -> Packed:
            keys = brpop_keys(queues, self.priority_steps, self._q_for_pri)
            return connection.pack_command("EVAL", script, len(keys), *keys, len(queues), steps, limit), keys

        packed, keys = self._packed_once(("EVAL LMPOP" if lmpop else "EVAL RPOP", tuple(queues), limit), pack)
        try:
            connection.send_packed_command(packed)
            taken = self.client.parse_response(connection, "EVAL")
        except self.connection_errors:
            connection.disconnect()  # as after a failed BRPOP: the next command reconnects
            raise
        except redis.exceptions.ResponseError as exc:
            if not lmpop:
                raise
            # A server that says it is 7.0 or later and has no LMPOP (a look-alike of
            # Redis): the script failed at its first call, having taken nothing.
            log.warning("broker_lmpop_unavailable", error=str(exc))
            self._lmpop = False
            return
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

    def _server_has_lmpop(self) -> bool:
        """Whether batches may use LMPOP (Redis >= 7.0): the server's version, read with
        one INFO per connection of this channel (asked again after a reconnect)."""
        if not USE_LMPOP:
            return False
        if self._lmpop is None:
            try:
                version = str(self._create_client().info("server").get("redis_version", ""))
            except redis.exceptions.ResponseError:  # INFO refused (an ACL): try LMPOP, see _take_more
                version = ".".join(map(str, LMPOP_SINCE))
            self._lmpop = redis_version(version) >= LMPOP_SINCE
        return self._lmpop

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
        self._lmpop = None  # the server may have changed
        super()._disconnect_pools()  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """This module's channel over Redis Sentinel (``sentinel://`` broker URLs): kombu's
    SentinelChannel makes the connection pools (each connection asks the sentinels for
    the master on connect, so a reconnect after a failover reaches the promoted replica),
    this module's Channel does everything else. Its private overrides above touch the
    pools only through ``self.pool`` and ``_disconnect_pools``, which kombu's sentinel
    channel keeps, so the two compose (tests/e2e/test_redis_sentinel.py)."""


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel

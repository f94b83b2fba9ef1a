"""Every Redis client a process makes besides Celery's own (rate limits, deltas and their
watchers, the reconciler's epoch key), built here from the broker's settings, so each
follows the broker wherever it is:

- ``redis://`` / ``rediss://``: one server, as the URL says;
- ``sentinel://host:port;sentinel://host:port;...``: the master of the group
  AIDAWORK_SENTINEL_MASTER, as Redis Sentinel names it. The client asks the sentinels for
  the master's address on every (re)connect, so after a failover its next command reaches
  the promoted replica. The URL's database (``/1``), user and password are the master's,
  read from the first URL, as kombu reads them for the broker itself; the sentinels are
  asked with AIDAWORK_SENTINEL_TIMEOUT_S and no password.

``redis_url`` is the one predicate "the broker is Redis, plain or through Sentinel": rate
limits, deltas and the epoch key need it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

if TYPE_CHECKING:
    from worker.ops.settings import Settings

REDIS_SCHEMES = ("redis:", "rediss:")
SENTINEL_SCHEME = "sentinel:"
SENTINEL_PORT = 26379  # Redis Sentinel's own default port


def sentinel_url(url: str) -> bool:
    """Whether ``url`` names Redis Sentinels (``sentinel://...;sentinel://...``)."""
    return url.startswith(SENTINEL_SCHEME)


def redis_url(url: str) -> bool:
    """Whether a broker URL is Redis: one server, or a group behind Sentinel."""
    return url.startswith(REDIS_SCHEMES) or sentinel_url(url)


@dataclass(frozen=True)
class SentinelAddress:
    """What a ``sentinel://`` broker URL says: the sentinels, and the master's database
    and credentials (from its first URL)."""

    sentinels: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The sentinels of ``sentinel://h1:p1;sentinel://h2:p2/db``; ValueError if malformed."""
    sentinels: list[tuple[str, int]] = []
    first = None
    for part in (p.strip() for p in url.split(";")):
        if not part:
            continue
        split = urlsplit(part)
        if split.scheme != "sentinel" or not split.hostname:
            raise ValueError(f"not a sentinel://host:port URL: {split.scheme}://{split.hostname or ''}")
        sentinels.append((split.hostname, split.port or SENTINEL_PORT))
        first = first or split
    if first is None:
        raise ValueError("a sentinel:// broker URL names no sentinel")
    path = first.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"the database of a sentinel:// URL is a number (/0, /1, ...), not {path!r}")
    return SentinelAddress(
        sentinels=tuple(sentinels),
        db=int(path or 0),
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
    )


@dataclass(frozen=True)
class RedisTarget:
    """Where this deployment's Redis is: the broker URL, and for a Sentinel URL the
    master's group name and how long a sentinel may take to answer."""

    url: str
    sentinel_master: str | None = None
    sentinel_timeout_s: float = 1.0

    @classmethod
    def of(cls, where: RedisTarget | str) -> RedisTarget:
        return where if isinstance(where, RedisTarget) else cls(where)

    def _sentinel_parts(self) -> tuple[SentinelAddress, str, dict[str, Any]]:
        if self.sentinel_master is None:
            raise ValueError("a sentinel:// broker URL needs the master's name (AIDAWORK_SENTINEL_MASTER)")
        address = parse_sentinel_url(self.url)
        timeouts = {"socket_timeout": self.sentinel_timeout_s, "socket_connect_timeout": self.sentinel_timeout_s}
        master = {"db": address.db, "username": address.username, "password": address.password}
        return address, self.sentinel_master, {"sentinel_kwargs": timeouts, **master}


def redis_target(settings: Settings) -> RedisTarget | None:
    """The Redis of ``settings``' broker; None when the broker is not Redis."""
    if not redis_url(settings.broker_url):
        return None
    return RedisTarget(settings.broker_url, settings.sentinel_master, settings.sentinel_timeout_s)


def sync_client(where: RedisTarget | str, **options: Any) -> redis.Redis:
    """A redis-py client for ``where`` (``options``: the connections', e.g. socket_timeout)."""
    target = RedisTarget.of(where)
    if not sentinel_url(target.url):
        return redis.Redis.from_url(target.url, **options)
    address, master, params = target._sentinel_parts()
    sentinel = redis.sentinel.Sentinel(list(address.sentinels), **params, **options)
    client: redis.Redis = sentinel.master_for(master, redis_class=redis.Redis)
    return client


def async_client(where: RedisTarget | str, **options: Any) -> redis.asyncio.Redis:
    """The asyncio client for ``where`` (the API's delta hub)."""
    target = RedisTarget.of(where)
    if not sentinel_url(target.url):
        return redis.asyncio.Redis.from_url(target.url, **options)
    address, master, params = target._sentinel_parts()
    sentinel = redis.asyncio.sentinel.Sentinel(list(address.sentinels), **params, **options)
    client: redis.asyncio.Redis = sentinel.master_for(master, redis_class=redis.asyncio.Redis)
    return client

"""A throwaway Redis Sentinel group for a test: a master, a replica and 3 sentinels on
free loopback ports, from Debian's ``redis-server`` (a sentinel is ``redis-sentinel``
when installed, else ``redis-server CONF --sentinel``, the same program). Failover is
quick: a master silent for ``DOWN_AFTER_MS`` is down, 2 sentinels agreeing is a quorum."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from tests.support.api import free_port
from tests.support.wait import wait_until

MASTER_NAME = "aidawork-test"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
SENTINELS = 3


def _sentinel_command(conf: Path) -> list[str]:
    binary = shutil.which("redis-sentinel")
    return [binary, str(conf)] if binary else ["redis-server", str(conf), "--sentinel"]


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class SentinelGroup:
    """Start with ``start()``; ``stop()`` kills every process it started."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="aidawork-sentinel-"))
        self.master_port = free_port()
        self.replica_port = free_port()
        self.sentinel_ports = [free_port() for _ in range(SENTINELS)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The broker URL: every sentinel, database 0."""
        return ";".join(f"sentinel://127.0.0.1:{port}/0" for port in self.sentinel_ports)

    def env(self) -> dict[str, str]:
        """The settings of a process that uses this group as its broker."""
        return {"AIDAWORK_BROKER_URL": self.url, "AIDAWORK_SENTINEL_MASTER": MASTER_NAME}

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = (self.dir / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _redis(self, name: str, port: int, *extra: str) -> None:
        self._spawn(name, ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--dir", str(self.dir), "--dbfilename", f"{name}.rdb", *extra])

    def start(self) -> None:
        self._redis("master", self.master_port)
        self._redis("replica", self.replica_port, "--replicaof", "127.0.0.1", str(self.master_port))
        replica = redis.Redis(port=self.replica_port)
        wait_until(lambda: _pings(replica) and replica.info("replication").get("master_link_status") == "up",
                   timeout_s=30, what="the replica to sync with the master")
        # The sentinels start once the replica is attached: each finds it in the master's
        # INFO at its first connection, not after INFO's 10 s period.
        for i, port in enumerate(self.sentinel_ports):
            conf = self.dir / f"sentinel-{i}.conf"  # a sentinel rewrites its config: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
            self._spawn(f"sentinel-{i}", _sentinel_command(conf))
        wait_until(self._ready, timeout_s=45, interval_s=0.2, what="the sentinels to know the replica and each other")

    def sentinel(self, i: int = 0) -> redis.Redis:
        return redis.Redis(port=self.sentinel_ports[i], socket_timeout=1.0, socket_connect_timeout=1.0)

    def _ready(self) -> bool:
        try:
            for i in range(SENTINELS):
                s = self.sentinel(i)
                if len(s.sentinel_sentinels(MASTER_NAME)) != SENTINELS - 1:
                    return False
                if not [r for r in s.sentinel_slaves(MASTER_NAME) if not r.get("is_sdown")]:
                    return False
        except redis.RedisError:
            return False
        return True

    def master_port_now(self) -> int | None:
        """The master's port as the first sentinel that answers says it now."""
        for i in range(SENTINELS):
            with contextlib.suppress(redis.RedisError):
                addr = self.sentinel(i).sentinel_get_master_addr_by_name(MASTER_NAME)
                if addr:
                    return int(addr[1])
        return None

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_switched(self, timeout_s: float = 60.0) -> float:
        """Poll the sentinels until one names the replica as master; the wall-clock time."""
        wait_until(lambda: self.master_port_now() == self.replica_port, timeout_s=timeout_s, interval_s=0.02,
                   what="Sentinel to promote the replica")
        return time.time()

    def stop(self) -> None:
        for name in list(self.procs):
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                self.kill(name)
        shutil.rmtree(self.dir, ignore_errors=True)

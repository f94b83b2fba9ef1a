"""Rolling SIGKILLs for e2e tests: a fixed set of worker slots, one random live worker
killed every ``interval_s`` and replaced at once, and any worker that died on its own (a
poison round's ``os._exit``) replaced too. Everything it did is counted, so a test can say
how hard the storm was."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.cluster import Cluster
from worker.engine.failpoints import EXIT_CODE


@dataclass
class RollingKills:
    cluster: Cluster
    slots: int
    concurrency: int
    env: dict[str, str]
    rng: random.Random
    live: list[str] = field(default_factory=list)
    started: int = 0
    kills: int = 0  # SIGKILLs sent by the storm
    self_exits: int = 0  # workers that died on their own, at a failpoint
    preempted: int = 0  # of those, victims of a kill that got there first

    def start(self) -> None:
        while len(self.live) < self.slots:
            self._spawn()

    def _spawn(self) -> None:
        name = f"w{self.started}"
        self.started += 1
        self.cluster.start_worker(name, concurrency=self.concurrency, env=self.env)
        self.live.append(name)

    def replace_exited(self) -> None:
        """Start a worker for every one that exited by itself; only a failpoint may do so."""
        for name in [n for n in self.live if self.cluster.procs[n].poll() is not None]:
            code = self.cluster.procs[name].returncode
            assert code == EXIT_CODE, f"worker {name} exited with {code}, not at a failpoint"
            self.self_exits += 1
            self.live.remove(name)
            self._spawn()

    def kill_one(self) -> str:
        """SIGKILL a random live worker and start its replacement at once."""
        self.replace_exited()
        victim = self.rng.choice(self.live)
        self.cluster.kill(victim)
        code = self.cluster.procs[victim].returncode
        if code == EXIT_CODE:  # it reached a failpoint just before the signal
            self.self_exits += 1
            self.preempted += 1
        else:
            assert code == -signal.SIGKILL, f"worker {victim} exited with {code}"
            self.kills += 1
        self.live.remove(victim)
        self._spawn()
        return victim

    def rage(self, *, interval_s: float, duration_s: float, on_tick: Callable[[int], None] | None = None) -> int:
        """Kill at a fixed rate (by the clock, not after each kill's own delay) for
        ``duration_s``; ``on_tick(i)`` runs before the i-th kill (to submit more work).
        Returns how many kills were due."""
        begin = time.monotonic()
        tick = 0
        while (tick + 1) * interval_s <= duration_s:
            tick += 1
            if on_tick is not None:
                on_tick(tick)
            time.sleep(max(0.0, begin + tick * interval_s - time.monotonic()))
            self.kill_one()
        return tick

    def keep_until(self, done: Callable[[], bool]) -> bool:
        """For ``wait_until``: keep every slot filled, and say whether ``done``."""
        self.replace_exited()
        return done()

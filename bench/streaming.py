"""What streaming costs: the in-flight figure (bench/inflight.py) with a streamed answer
(the last turn's ``ANSWER_WORDS`` words, one published delta each), once with nobody
listening (the workers then publish none) and once with a watcher attached - one pattern
subscription to every run's delta channel, announced as an API process with open streams
announces it (worker.api.deltas).

Run alone with ``.venv/bin/python -m bench.streaming``; ``make bench`` includes it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import redis

from bench import inflight
from bench.env import BROKER_URL
from worker.ops.deltas import CHANNEL_PATTERN, WATCH_REFRESH_S, announce_watcher

ANSWER_WORDS = 50
ANSWER = " ".join(f"word{i}" for i in range(ANSWER_WORDS))
RUNS, ROUNDS, LATENCY_MS, CONCURRENCY = 256, 3, 1000, 256


class Watcher(threading.Thread):
    """Receives every delta published on the bench broker and counts them."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.received = 0
        self._done = threading.Event()
        self._client = redis.Redis.from_url(BROKER_URL)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.psubscribe(CHANNEL_PATTERN)
        self._pubsub.get_message(ignore_subscribe_messages=False, timeout=2.0)  # subscribed
        # The workers publish deltas only while a reader says it watches (worker.ops.deltas).
        announce_watcher(self._client, started=True)
        self._announced_at = time.monotonic()

    def run(self) -> None:
        while not self._done.is_set():
            if time.monotonic() - self._announced_at >= WATCH_REFRESH_S:
                announce_watcher(self._client, started=False)
                self._announced_at = time.monotonic()
            if self._pubsub.get_message(timeout=0.2) is not None:
                self.received += 1

    def stop(self) -> None:
        self._done.set()
        self.join()
        self._pubsub.close()


@dataclass
class Streaming:
    one_word: inflight.InFlight
    quiet: inflight.InFlight
    watched: inflight.InFlight
    received: int


def measure() -> Streaming:
    def one(content: str = ANSWER) -> inflight.InFlight:
        return inflight.measure(
            runs=RUNS, rounds=ROUNDS, latency_ms=LATENCY_MS, concurrency=CONCURRENCY, content=content
        )

    one_word = one("done")
    quiet = one()
    watcher = Watcher()
    watcher.start()
    try:
        watched = one()
    finally:
        watcher.stop()
    return Streaming(one_word, quiet, watched, watcher.received)


def report(s: Streaming) -> list[str]:
    lines = [
        f"Streaming: in-flight throughput, {RUNS} runs x {ROUNDS} rounds, --concurrency {CONCURRENCY}, "
        f"latency_ms {LATENCY_MS}, the answer streamed as {ANSWER_WORDS} deltas "
        "(one Redis PUBLISH each while a reader watches, none otherwise)",
    ]
    figures = (
        ("baseline: a one-word answer (1 delta)", s.one_word),
        ("no watcher (no delta published)", s.quiet),
        ("a watcher attached (psubscribe)", s.watched),
    )
    for label, r in figures:
        rps = r.rounds_done / r.wall_s
        lines.append(
            f"  {label:<36} {rps:7.1f} rounds/s ({rps / r.ideal_rps:.0%} of ideal {r.ideal_rps:.0f}); "
            f"wall {r.wall_s:.2f} s; worker CPU {r.cpu_ms / max(r.rounds_done, 1):.1f} ms per round; "
            f"completed {r.completed}/{r.runs}"
        )
    lines.append(
        f"  deltas the watcher received: {s.received} ({RUNS * ANSWER_WORDS} of the runs, 1 of the warm-up run)"
    )
    return lines


def main() -> None:
    from bench import db

    db.reset()
    print("\n".join(report(measure())))


if __name__ == "__main__":
    main()

"""A worker's /metrics has no authentication, so by default it listens on loopback only,
and runs with tenant-chosen client tool names add no series to it (issue 35, point 11).
Read from the kernel's socket table and from the exposition as Prometheus parses it."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api import free_port
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import wait_suspended
from tests.support.requests import scripted_request
from tests.support.wait import wait_until
from worker import client

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def listening_addresses(port: int) -> list[str]:
    """The local addresses (hex, as the kernel writes them) of every socket listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == LISTEN:
                found.append(address)
    return found


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def suspended_rounds(port: int) -> float:
    return scrape(port).get(("aidawork_rounds_total", (("outcome", "suspend"),)), 0)


def suspend_on_a_random_client_tool(ctx: Any) -> None:
    name = f"t_{secrets.token_hex(6)}"
    turns = [{"tool_calls": [{"name": name, "args": {}}]}, {"content": "done"}]
    request = scripted_request(turns, tools=[], client_tools=[{"name": name}])
    wait_suspended(ctx.engine, client.submit(request, ctx=ctx).run_id)


def test_a_workers_metrics_listen_on_loopback_only_and_keep_their_series_bounded(
    cluster: Cluster, ctx: Any
) -> None:
    port = free_port()
    cluster.start_worker("w", concurrency=2, env={"AIDAWORK_METRICS_PORT": str(port)})
    wait_ready(cluster, "w")
    wait_until(lambda: listening_addresses(port), timeout_s=20, interval_s=0.1, what="the metrics port to listen")
    assert listening_addresses(port) == ["0100007F"]  # 127.0.0.1, and no other (nor ::)

    suspend_on_a_random_client_tool(ctx)
    wait_until(lambda: suspended_rounds(port) == 1, timeout_s=10, interval_s=0.1, what="the first round counted")
    before = set(scrape(port))
    for _ in range(5):
        suspend_on_a_random_client_tool(ctx)
    wait_until(lambda: suspended_rounds(port) == 6, timeout_s=10, interval_s=0.1, what="every round counted")
    assert set(scrape(port)) == before

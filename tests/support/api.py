"""A real ``aidawork api`` process (uvicorn) and what the tests send it; the HTTP API
in-process (ASGI) for the unit tests."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine

from tests.support.cluster import assert_json_lines
from tests.support.db import rows
from tests.support.env import BROKER_URL, REPO, WAIT_S, process_environ, xdist_index
from tests.support.wait import wait_until
from worker.engine.bootstrap import WorkerContext

TOKEN_A = "token-a-" + uuid.uuid4().hex



TOKEN_B = "token-b-" + uuid.uuid4().hex



A = {"Authorization": f"Bearer {TOKEN_A}"}



B = {"Authorization": f"Bearer {TOKEN_B}"}






BODY_LIMIT = 65_536



ADD = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]



# Ports for the servers the tests start (API, Flower, metrics, MCP, PgBouncer, throwaway
# PostgreSQL and Redis): below Linux's ephemeral range (32768-60999), so no outgoing
# connection holds one, and a block of its own per pytest-xdist worker, so two workers never
# hand out the same port between one's check and its server's bind.
PORT_BLOCK, FIRST_PORT = 1500, 20000
_ports = itertools.count(random.randrange(PORT_BLOCK))


def free_port() -> int:
    """A port nothing listens on, from this xdist worker's block, not handed out before by
    this process (until the block wraps around)."""
    base = FIRST_PORT + (xdist_index() % 8) * PORT_BLOCK
    for _ in range(PORT_BLOCK):
        port = base + next(_ports) % PORT_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {base}-{base + PORT_BLOCK - 1}")



class ApiServer:
    """One ``aidawork api`` process in its own session (killed with its group)."""

    def __init__(self, db_url: str, log_path: Path, extra_env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log_path = log_path
        env = process_environ()
        env.update(
            {
                "AIDAWORK_DATABASE_URL": db_url,
                "AIDAWORK_BROKER_URL": BROKER_URL,
                "AIDAWORK_API_TOKENS": json.dumps({TOKEN_A: "team-a", TOKEN_B: "team-b"}),
                "AIDAWORK_API_EVENTS_POLL_S": "0.05",
                "AIDAWORK_API_KEEPALIVE_S": "1",  # wakes sse() below at least every second
                "AIDAWORK_API_MAX_BODY_BYTES": str(BODY_LIMIT),
                "AIDAWORK_LOG_LEVEL": "INFO",
                "AIDAWORK_DEV": "1",
                **(extra_env or {}),
            }
        )
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "worker.cli", "api", "--port", str(self.port)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30.0)

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the API exited with {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                return self.http.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout_s=WAIT_S, interval_s=0.05, what="the API to answer /healthz")

    def stop(self) -> None:
        """Stop the process, then check that it wrote JSON lines only."""
        self.http.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        assert_json_lines("api", self.log_path)



def sse(
    api: ApiServer,
    run_id: str,
    headers: dict[str, str],
    *,
    last_event_id: int | None = None,
    max_events: int | None = None,
    deltas: bool = False,
) -> list[dict[str, Any]]:
    """Read the run's event stream: until the server ends it, or ``max_events`` (then
    the connection is closed by the client). Each event is {id, event, data}; the live
    deltas (no id) are left out unless ``deltas`` (then their id is None and they do not
    count toward ``max_events``)."""
    if last_event_id is not None:
        headers = {**headers, "Last-Event-ID": str(last_event_id)}
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + WAIT_S
    with api.http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            assert time.monotonic() < deadline, f"the stream did not end within {WAIT_S}s: {out}"
            if line.startswith(":"):
                continue  # a keepalive comment
            if line == "":
                if fields:
                    durable = "id" in fields
                    if durable or deltas:
                        seq = int(fields["id"]) if durable else None
                        out.append({"id": seq, "event": fields["event"], "data": json.loads(fields["data"])})
                    fields = {}
                    if max_events is not None and len([e for e in out if e["id"] is not None]) >= max_events:
                        break
                continue
            name, _, value = line.partition(": ")
            assert name not in fields, f"field {name} twice in one event"
            fields[name] = value
    return out



def event_seqs(engine: Engine, run_id: str) -> list[int]:
    return [r["seq"] for r in rows(engine, "SELECT seq FROM run_events WHERE run_id = :id ORDER BY seq", id=run_id)]



def counts(engine: Engine) -> dict[str, int]:
    tables = ("roots", "runs", "run_checkpoints", "run_events", "local_reads", "prerequisites")
    return {t: rows(engine, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in tables}


JSON_HEADERS = {**A, "Content-Type": "application/json"}


TOKEN = "unit-token-" + "0" * 16



class StoreTouched(AssertionError):
    pass



def no_store() -> WorkerContext:
    raise StoreTouched("a refused request reached the store")



def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and {"code", "message", "field"} <= set(body["error"]), body
    return body["error"]  # type: ignore[no-any-return]


def in_process_request(method: str, url: str, settings: Any, **kwargs: Any) -> httpx.Response:
    """One request to an API app built from ``settings`` in process (ASGI, no sockets),
    whose store may not be touched (``no_store``)."""
    import anyio

    from worker.api import create_app

    app = create_app(settings, no_store)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            response = await http.request(method, url, **kwargs)
            await response.aread()
            return response

    return anyio.run(go)

"""Small helpers shared by the e2e tests: reading worker logs, waiting for workers to be
ready, and reading run rows. Everything here observes real processes and real rows."""

from __future__ import annotations

import socket
import time
from typing import Any
from uuid import UUID

from sqlalchemy import Engine

from tests.conftest import Cluster, broker_app, rows, wait_until

WAIT_S = 60.0  # generous: a loaded 2-core machine boots a Celery worker in a few seconds


def events(cluster: Cluster, name: str, event: str | None = None, **fields: Any) -> list[dict[str, Any]]:
    """The JSON log lines of process ``name`` with this event name and field values."""
    out = []
    for line in cluster.logs(name):
        if event is not None and line.get("event") != event:
            continue
        if all(str(line.get(k)) == str(v) for k, v in fields.items()):
            out.append(line)
    return out


def wait_ready(cluster: Cluster, *names: str, timeout_s: float = WAIT_S) -> None:
    """Wait until each named worker process answers a remote-control ping, i.e. it is
    consuming from the broker (so a task sent now can reach it)."""
    app = broker_app()
    host = socket.gethostname()
    for name in names:
        proc = cluster.procs[name]
        node = f"aidawork-{proc.pid}@{host}"

        def answered(proc: Any = proc, node: str = node, name: str = name) -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker {name} exited with {proc.returncode} while starting")
            replies = app.control.ping(destination=[node], timeout=0.5, limit=1)
            return any(node in reply for reply in replies)

        wait_until(answered, timeout_s=timeout_s, interval_s=0.05, what=f"worker {name} to answer a ping")


def run_row(engine: Engine, run_id: UUID) -> dict[str, Any]:
    return rows(engine, "SELECT * FROM runs WHERE id = :id", id=run_id)[0]


def wait_terminal(engine: Engine, run_id: UUID, *, timeout_s: float = WAIT_S) -> dict[str, Any]:
    """Wait until the run has ended; returns its row."""

    def ended() -> dict[str, Any] | None:
        row = run_row(engine, run_id)
        return row if row["status"] in ("completed", "failed", "cancelled") else None

    return wait_until(ended, timeout_s=timeout_s, what=f"run {run_id} to end")  # type: ignore[no-any-return]


def round_rows(engine: Engine, run_id: UUID) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM rounds WHERE run_id = :id ORDER BY boundary_seq", id=run_id)


def model_calls(engine: Engine, run_id: UUID) -> list[dict[str, Any]]:
    return rows(engine, "SELECT * FROM model_calls WHERE run_id = :id ORDER BY id", id=run_id)


def calls_per_boundary(engine: Engine, run_id: UUID) -> dict[int, int]:
    out: dict[int, int] = {}
    for call in model_calls(engine, run_id):
        out[call["boundary_seq"]] = out.get(call["boundary_seq"], 0) + 1
    return out


def wait_model_call_succeeded(
    engine: Engine, run_id: UUID, boundary_seq: int, *, timeout_s: float = WAIT_S
) -> dict[str, Any]:
    """Wait until the ledger says the model call of this round returned (the round is now
    in its tools)."""

    def done() -> dict[str, Any] | None:
        found = rows(
            engine,
            "SELECT * FROM model_calls WHERE run_id = :id AND boundary_seq = :b AND status = 'succeeded'",
            id=run_id,
            b=boundary_seq,
        )
        return found[0] if found else None

    return wait_until(
        done,
        timeout_s=timeout_s,
        interval_s=0.02,  # type: ignore[no-any-return]
        what=f"the model call of round {boundary_seq} to succeed",
    )


def wait_exit(cluster: Cluster, name: str, *, timeout_s: float = WAIT_S) -> int:
    proc = cluster.procs[name]
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"process {name} did not exit within {timeout_s}s")
        time.sleep(0.02)
    return proc.returncode

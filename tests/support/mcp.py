"""Real MCP servers for the tests: the ``mcp-server-time`` reference server over stdio,
and the tiny streamable-HTTP server of ``tests.support.mcp_http_server`` as a subprocess
on 127.0.0.1 and a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.api import free_port
from tests.support.env import REPO, WAIT_S
from tests.support.wait import wait_until

# --local-timezone: the server need not guess the machine's zone.
TIME_SERVER: dict[str, Any] = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


def stdio_processes(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds ``AIDAWORK_TEST_MCP_MARK=marker``
    (a stdio server started with that in its ``env``)."""
    needle = f"AIDAWORK_TEST_MCP_MARK={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and b"Z" not in _state(entry):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _state(entry: Path) -> bytes:
    return (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]


class HttpMcpServer:
    """``python -m tests.support.mcp_http_server`` in its own session, killed with its group."""

    def __init__(self, log_path: Path, *, token: str | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log_path = log_path
        args = [sys.executable, "-m", "tests.support.mcp_http_server", "--port", str(self.port)]
        if token is not None:
            args += ["--token", token]
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> HttpMcpServer:
        def accepting() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the MCP HTTP server exited: {self.log_path.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_until(accepting, timeout_s=WAIT_S, interval_s=0.05, what="the MCP HTTP server to accept connections")
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

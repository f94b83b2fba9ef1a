"""A stdio MCP server's stderr, logged line by line as structured events.

The SDK hands its ``errlog`` to the subprocess as its stderr, so it must be a real file
descriptor: the write end of a pipe, whose read end a daemon thread reads. Left to inherit
the process's stderr, the server's lines would land as plain text among our JSON lines.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

import structlog
from structlog.typing import FilteringBoundLogger

# A server that writes without newlines cannot make us buffer without bound: a longer line
# is logged in pieces.
MAX_LINE_BYTES = 4096


def _log() -> FilteringBoundLogger:
    # Looked up per line, not cached at import: structlog may be configured after import.
    logger: FilteringBoundLogger = structlog.get_logger("aidawork.mcp")
    return logger


def _log_lines(server: str, read_fd: int) -> None:
    with open(read_fd, "rb") as pipe:
        for raw in iter(lambda: pipe.readline(MAX_LINE_BYTES), b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            # INFO, not WARNING: stdout carries the protocol, so a stdio server writes all its
            # logging, routine or not, to stderr.
            _log().info("mcp_server_logged", server=server, stream="stderr", line=line)


@contextmanager
def stderr_logged(server: str) -> Iterator[TextIO]:
    """A file to give the server as its stderr. Close it once the server is started: the
    server then holds the only write end, and the reading thread ends when it exits."""
    read_fd, write_fd = os.pipe()  # not inheritable: no other subprocess keeps the pipe open
    threading.Thread(target=_log_lines, args=(server, read_fd), name=f"aidawork-mcp-stderr-{server}",
                     daemon=True).start()
    with open(write_fd, "w") as errlog:
        yield errlog

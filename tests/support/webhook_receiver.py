"""A loopback HTTP receiver for webhook tests: records every POST (path, raw body,
headers) and answers the status ``answer`` gives it (200 unless a test says otherwise)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    body: bytes
    headers: dict[str, str]


@dataclass
class LoopbackReceiver:
    server: ThreadingHTTPServer
    got: list[Received] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies POSTed to paths under ``path``, in arrival order."""
        return [json.loads(g.body) for g in self.got if g.path.startswith(path)]


@contextmanager
def loopback_receiver(answer: Callable[[Received], int] = lambda _: 200) -> Iterator[LoopbackReceiver]:
    holder: list[LoopbackReceiver] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got = Received(self.path, body, dict(self.headers.items()))
            holder[0].got.append(got)
            self.send_response(answer(got))
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(LoopbackReceiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()

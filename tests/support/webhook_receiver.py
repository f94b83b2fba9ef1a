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

from tests.support.cluster import cli
from worker import client


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

    def assert_signed_by(self, db_url: str, owner: str, master_secret: str) -> str:
        """Every delivery verifies with ``owner``'s secret as ``aidawork owner webhook-secret``
        prints it, and not once its body changed; that secret."""
        env = {"AIDAWORK_WEBHOOK_SECRET": master_secret}
        printed = cli(db_url, "owner", "webhook-secret", owner, "--json", env=env)
        assert printed.returncode == 0, printed.stderr
        secret: str = json.loads(printed.stdout)["secret"]
        for got in self.got:
            assert client.verify_webhook(got.body, got.headers["AIDAWORK-Signature"], secret)
            assert not client.verify_webhook(got.body + b" ", got.headers["AIDAWORK-Signature"], secret)
        return secret


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

"""The HTTP API against slow and greedy clients, over raw sockets to a real ``aidawork
api`` process: headers that never finish and bodies that trickle are cut off, the
connection cap answers 503, a token's event streams are capped (429) and a slot comes back
when a stream ends, a trailing slash is a plain 404 (no redirect built from ``Host``), and
the docs can be switched off.

Deadlines are set short (1 s); sockets time out after a generous bound, so a missing
deadline fails the test: the assertion is that the server closes the connection, not how fast."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.support.api import ADD, TOKEN_A, TOKEN_B, A, ApiServer, B, counts
from tests.support.requests import scripted_request, without_owner
from tests.support.wait import wait_until

DEADLINE_S = 1.0
BOUND_S = 15.0  # far above the deadline: a loaded machine still passes, a missing deadline does not


@pytest.fixture
def start_api(db_url: str, redis_clean: None, tmp_path: Path) -> Iterator[Callable[..., ApiServer]]:
    servers: list[ApiServer] = []

    def start(**env: str) -> ApiServer:
        extra = {f"AIDAWORK_{name.upper()}": value for name, value in env.items()}
        server = ApiServer(db_url, tmp_path / f"api{len(servers)}.log", extra)
        servers.append(server)
        server.wait_ready()
        server.http.close()  # its keep-alive connection would count against the connection cap
        server.http = httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30.0)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


def connect(api: ApiServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=BOUND_S)
    sock.settimeout(BOUND_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def test_a_connection_whose_headers_never_finish_is_closed(start_api: Callable[..., ApiServer]) -> None:
    api = start_api(api_header_timeout_s=str(DEADLINE_S))
    with ExitStack() as stack:
        silent = [stack.enter_context(connect(api)) for _ in range(10)]
        partial = [stack.enter_context(connect(api)) for _ in range(10)]
        for sock in partial:
            sock.sendall(f"GET /v1/runs/{uuid.uuid4()} HTTP/1.1\r\nHost: x\r\nAuthor".encode())

        for sock in silent + partial:
            # Closed without an answer; a server that kept it open would fail recv's BOUND_S timeout.
            assert read_until_closed(sock) == b""

    # The deadline is per request: a client that keeps its connection and then dribbles
    # the next request's headers (each byte would reset uvicorn's keep-alive timer) is cut off too.
    with connect(api) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.settimeout(0.2)
        started, closed = time.monotonic(), False
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 200:
            try:
                sock.sendall(bytes([byte]))
                closed = sock.recv(65536) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            if closed or time.monotonic() - started > BOUND_S:
                break
        assert closed, "the connection stayed open while the headers trickled in"

    assert api.http.get("/healthz").status_code == 200  # other clients are served meanwhile
    assert "request_headers_timed_out" in api.log_path.read_text()


def test_a_trickled_body_gets_408_and_the_connection_is_closed(start_api: Callable[..., ApiServer], ctx) -> None:
    api = start_api(api_body_timeout_s=str(DEADLINE_S))
    body = json.dumps(without_owner(scripted_request(ADD))).encode()
    head = (
        f"POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN_A}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with connect(api) as sock:
        sock.sendall(head)
        sock.settimeout(0.25)
        answer, started = b"", time.monotonic()
        for byte in body:  # 4 bytes a second: the whole body would take minutes
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            answer += chunk
            if chunk == b"" or time.monotonic() - started > BOUND_S:
                break
        sock.settimeout(BOUND_S)
        answer += read_until_closed(sock)

    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "BODY_TIMEOUT"
    assert counts(ctx.engine)["runs"] == 0

    # A body sent at once is not held to the trickle rule.
    accepted = api.http.post("/v1/runs", content=body, headers={**A, "Content-Type": "application/json"})
    assert accepted.status_code == 201, accepted.text


def fresh_status(api: ApiServer) -> int:
    """The status of GET /healthz on a new connection, which the client then closes."""
    with connect(api) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return int(read_until_closed(sock).split(b" ", 2)[1])


def test_connections_beyond_the_cap_get_503(start_api: Callable[..., ApiServer]) -> None:
    api = start_api(api_max_connections="3", api_header_timeout_s="60")
    with ExitStack() as stack:
        idle = [stack.enter_context(connect(api)) for _ in range(2)]
        assert fresh_status(api) == 200  # 2 idle + this one: within the cap of 3
        idle.append(stack.enter_context(connect(api)))
        wait_until(lambda: fresh_status(api) == 503, timeout_s=BOUND_S, what="a request beyond the cap to get 503")
    wait_until(lambda: fresh_status(api) == 200, timeout_s=BOUND_S, what="the slots to come back")


def open_stream(stack: ExitStack, api: ApiServer, run_id: str, headers: dict[str, str]) -> httpx.Response:
    """An open event stream whose first event has arrived (so the server holds it). A 429
    is retried: a stream the client has just closed gives its slot back when the server
    notices, a moment later."""
    deadline = time.monotonic() + BOUND_S
    while True:
        response = stack.enter_context(api.http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers))
        if response.status_code != 429 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert response.status_code == 200, response.read()
    lines = response.iter_lines()
    stack.callback(lines.close)  # holds the reader: dropping it would close the connection
    assert next(line for line in lines if line.startswith("event: ")) == "event: run_queued"
    return response


def stream_status(api: ApiServer, run_id: str, headers: dict[str, str]) -> int:
    with api.http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as response:
        if response.status_code != 200:
            error = json.loads(response.read())["error"]
            assert error["code"] in ("TOO_MANY_STREAMS", "RUN_NOT_FOUND"), error
            assert error["code"] != "TOO_MANY_STREAMS" or "AIDAWORK_API_MAX_STREAMS_PER_TOKEN" in error["message"]
        return response.status_code


def submit_queued(api: ApiServer, headers: dict[str, str]) -> str:
    created = api.http.post("/v1/runs", json=without_owner(scripted_request(ADD)), headers=headers)
    assert created.status_code == 201, created.text
    return str(created.json()["run_id"])


def test_a_token_has_at_most_the_configured_event_streams_open(start_api: Callable[..., ApiServer]) -> None:
    api = start_api(api_max_streams_per_token="2")
    run_a, other_a, run_b = submit_queued(api, A), submit_queued(api, A), submit_queued(api, B)  # no worker: queued
    for _ in range(3):  # refused streams take no slot
        assert stream_status(api, run_b, A) == 404
    with ExitStack() as first:
        open_stream(first, api, run_a, A)
        with ExitStack() as second:
            open_stream(second, api, other_a, A)
            assert stream_status(api, run_a, A) == 429
            with ExitStack() as theirs:
                open_stream(theirs, api, run_b, B)  # another token has its own slots
        with ExitStack() as again:
            open_stream(again, api, other_a, A)  # the client closed its second stream: a slot came back
            assert stream_status(api, run_a, A) == 429
            # A run that ends ends its streams, and frees their slots.
            assert api.http.post(f"/v1/runs/{run_a}/cancel", headers=A).status_code == 200
            assert api.http.post(f"/v1/runs/{other_a}/cancel", headers=A).status_code == 200
            wait_until(lambda: stream_status(api, run_a, A) == 200, timeout_s=BOUND_S, what="the ended streams' slots")
    assert TOKEN_A not in api.log_path.read_text() and TOKEN_B not in api.log_path.read_text()


def test_a_trailing_slash_is_a_json_404_without_a_redirect(start_api: Callable[..., ApiServer]) -> None:
    api = start_api()
    run_id = submit_queued(api, A)
    for method, path in [("GET", f"/v1/runs/{run_id}/"), ("POST", "/v1/runs/"), ("GET", "/v1/roots/x/runs/")]:
        response = api.http.request(method, path, headers={**A, "Host": "evil.example"})
        assert response.status_code == 404, (path, response.status_code)
        assert "location" not in response.headers, path
        assert response.json()["error"]["code"] == "NOT_FOUND", path
    assert api.http.get(f"/v1/runs/{run_id}", headers=A).status_code == 200


@pytest.mark.parametrize(("docs", "status"), [("1", 200), ("0", 404)])
def test_the_docs_can_be_switched_off(start_api: Callable[..., ApiServer], docs: str, status: int) -> None:
    api = start_api(api_docs=docs)
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert api.http.get(path).status_code == status, path
    assert api.http.get("/healthz").status_code == 200

"""The HTTP API against a real ``aidawork api`` process (uvicorn) and real workers:
submitting and following a run over server-sent events, resuming a stream with
Last-Event-ID, owners isolated by their tokens (404 for anything of another owner),
refused requests storing nothing, and the OpenAPI document."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx

from tests.support.api import ADD, BODY_LIMIT, JSON_HEADERS, TOKEN_A, TOKEN_B, A, ApiServer, B, counts, event_seqs, sse
from tests.support.cluster import Cluster, wait_ready
from tests.support.db import rows
from tests.support.env import WAIT_S
from tests.support.requests import scripted_request, without_owner
from tests.support.wait import wait_until

READ_ONE = [{"tool_calls": [{"name": "read_files", "args": {"paths": ["docs/a.md"]}}]}, {"content": "read it"}]


def test_a_submitted_run_streams_its_events_until_completion(api: ApiServer, cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1")
    wait_ready(cluster, "w1")
    # The tool output is far above max_tool_output_bytes: the model's next context gets it
    # truncated, the stream gets it whole.
    script = [{"tool_calls": [{"name": "text_blob", "args": {"size_bytes": 40_000}}]}, {"content": "done"}]
    body = without_owner(scripted_request(script, tools=["text_blob"]))
    body["config"]["policy"]["max_tool_output_bytes"] = 1024

    created = api.http.post("/v1/runs", json=body, headers=A)
    assert created.status_code == 201, created.text
    run_id, root_id = created.json()["run_id"], created.json()["root_id"]
    assert created.headers["location"] == f"/v1/runs/{run_id}"

    events = sse(api, run_id, A)  # returns only because the server ended the stream
    assert [e["event"] for e in events] == [
        "run_queued",
        "model_responded",
        "tool_completed",
        "model_responded",
        "run_completed",
    ]
    assert [e["id"] for e in events] == event_seqs(ctx.engine, run_id) == [1, 2, 3, 4, 5]
    assert all(e["data"]["seq"] == e["id"] and e["data"]["kind"] == e["event"] for e in events)
    (completed,) = [e["data"]["data"] for e in events if e["event"] == "tool_completed"]
    assert completed["result"] == {"text": "x" * 40_000}
    assert events[-1]["data"]["data"]["output"] == "done"

    view = api.http.get(f"/v1/runs/{run_id}", headers=A).json()
    assert (view["status"], view["owner"], view["output"], view["rounds"]) == ("completed", "team-a", "done", 2)

    # A second run in the same Root (naming the token's own owner is allowed), then the
    # Root's runs in order.
    again = api.http.post("/v1/runs", json={**scripted_request(ADD, owner="team-a"), "root_id": root_id}, headers=A)
    assert again.status_code == 201, again.text
    assert (again.json()["root_id"], again.json()["root_seq"]) == (root_id, 1)
    second = again.json()["run_id"]
    assert sse(api, second, A)[-1]["event"] == "run_completed"
    listed = api.http.get(f"/v1/roots/{root_id}/runs", headers=A)
    assert listed.status_code == 200, listed.text
    assert [(r["run_id"], r["root_seq"], r["status"]) for r in listed.json()["runs"]] == [
        (run_id, 0, "completed"),
        (second, 1, "completed"),
    ]
    after = api.http.get(f"/v1/roots/{root_id}/runs", params={"after_seq": 0}, headers=A).json()["runs"]
    assert [r["run_id"] for r in after] == [second]
    assert rows(ctx.engine, "SELECT DISTINCT owner FROM runs") == [{"owner": "team-a"}]


def test_a_reconnect_with_last_event_id_gets_exactly_the_rest(api: ApiServer, cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1")
    wait_ready(cluster, "w1")
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "add", "args": {"a": i, "b": 1}}], "latency_ms": 400} for i in range(5)
    ]
    turns.append({"content": "counted", "latency_ms": 200})  # about 2.2 s in all
    created = api.http.post("/v1/runs", json=without_owner(scripted_request(turns)), headers=A)
    assert created.status_code == 201, created.text
    run_id = created.json()["run_id"]

    first = sse(api, run_id, A, max_events=3)  # the client drops the connection mid-run
    last_seen = first[-1]["id"]
    assert api.http.get(f"/v1/runs/{run_id}", headers=A).json()["status"] not in ("completed", "failed", "cancelled")
    rest = sse(api, run_id, A, last_event_id=last_seen)

    seqs = [e["id"] for e in first + rest]
    assert rest[0]["id"] == last_seen + 1
    assert seqs == list(range(1, len(seqs) + 1)) == event_seqs(ctx.engine, run_id)  # no gap, no duplicate
    assert rest[-1]["event"] == "run_completed" and rest[-1]["data"]["data"]["output"] == "counted"
    assert len([e for e in first + rest if e["event"] == "tool_completed"]) == 5

    # After the end: any seq gets the exact tail from the table; the last seq gets nothing.
    assert [e["id"] for e in sse(api, run_id, A, last_event_id=4)] == seqs[4:]
    assert sse(api, run_id, A, last_event_id=seqs[-1]) == []
    refused = api.http.get(f"/v1/runs/{run_id}/events", headers={**A, "Last-Event-ID": "four"})
    assert (refused.status_code, refused.json()["error"]["field"]) == (400, "Last-Event-ID")


def test_another_owner_gets_404_for_everything_and_changes_nothing(api: ApiServer, cluster: Cluster, ctx) -> None:
    cluster.start_worker("w1")
    wait_ready(cluster, "w1")
    created = api.http.post("/v1/runs", json=without_owner(scripted_request(READ_ONE, tools=["read_files"])), headers=A)
    assert created.status_code == 201, created.text
    run_id, root_id = created.json()["run_id"], created.json()["root_id"]
    wait_until(
        lambda: api.http.get(f"/v1/runs/{run_id}", headers=A).json()["status"] == "suspended",
        timeout_s=WAIT_S,
        what="the run to suspend on its local read",
    )
    before = counts(ctx.engine)
    delivery = {"tool_call_id": "call_0_0", "files": {"docs/a.md": "# A\n"}}

    def attempts(rid: str, root: str) -> dict[str, httpx.Response]:
        return {
            "get": api.http.get(f"/v1/runs/{rid}", headers=B),
            "events": api.http.get(f"/v1/runs/{rid}/events", headers=B),
            "cancel": api.http.post(f"/v1/runs/{rid}/cancel", headers=B),
            "deliver": api.http.post(f"/v1/runs/{rid}/deliveries", json=delivery, headers=B),
            "resolve": api.http.post(f"/v1/runs/{rid}/prerequisites", json={"key": "k", "value": 1}, headers=B),
            "root": api.http.get(f"/v1/roots/{root}/runs", headers=B),
        }

    theirs = attempts(run_id, root_id)
    missing = attempts(str(uuid.uuid4()), str(uuid.uuid4()))
    for name, response in theirs.items():
        assert response.status_code == 404, (name, response.text)
        # Indistinguishable from a run that does not exist.
        assert response.json()["error"]["code"] == missing[name].json()["error"]["code"], name
        assert response.json()["error"]["code"] in ("RUN_NOT_FOUND", "ROOT_NOT_FOUND"), name
    into_their_root = api.http.post(
        "/v1/runs", json={**without_owner(scripted_request(ADD)), "root_id": root_id}, headers=B
    )
    assert (into_their_root.status_code, into_their_root.json()["error"]["field"]) == (422, "root_id")
    for headers in ({}, {"Authorization": "Bearer " + "x" * 40}, {"Authorization": f"Basic {TOKEN_A}"}):
        refused = api.http.get(f"/v1/runs/{run_id}", headers=headers)
        assert (refused.status_code, refused.headers.get("www-authenticate")) == (401, "Bearer")
    assert counts(ctx.engine) == before
    assert api.http.get(f"/v1/runs/{run_id}", headers=A).json()["status"] == "suspended"

    # The owner is refused a delivery the run did not ask for (nothing stored), then delivers.
    wrong = api.http.post(f"/v1/runs/{run_id}/deliveries", json={**delivery, "files": {"docs/b.md": "no"}}, headers=A)
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "DELIVERY_REFUSED"), wrong.text
    assert "docs/a.md" in wrong.json()["error"]["message"]
    assert wrong.json()["error"]["field"] == "files"
    assert counts(ctx.engine) == before
    delivered = api.http.post(f"/v1/runs/{run_id}/deliveries", json=delivery, headers=A)
    assert delivered.json() == {"stored": True, "resuming": True}, delivered.text
    assert sse(api, run_id, A)[-1]["event"] == "run_completed"
    assert api.http.get(f"/v1/roots/{root_id}/runs", headers=A).json()["runs"][0]["status"] == "completed"
    log = api.log_path.read_text()
    assert "request_served" in log and TOKEN_A not in log and TOKEN_B not in log


def test_a_queued_run_is_cancelled_once(api: ApiServer, ctx) -> None:
    # No worker: the run stays queued until cancelled.
    created = api.http.post("/v1/runs", json=without_owner(scripted_request(ADD)), headers=A)
    run_id = created.json()["run_id"]
    cancelled = api.http.post(f"/v1/runs/{run_id}/cancel", headers=A)
    assert cancelled.json() == {"run_id": run_id, "cancelled": True}, cancelled.text
    assert [e["event"] for e in sse(api, run_id, A)] == ["run_queued", "run_cancelled"]
    again = api.http.post(f"/v1/runs/{run_id}/cancel", headers=A)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "RUN_ENDED")


def _with(request: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(request))
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


VALID = without_owner(scripted_request(ADD, tools=["add", "echo"]))
# name -> (body bytes, expected status, expected error.field)
BAD_SUBMISSIONS: dict[str, tuple[bytes, int, str]] = {
    "malformed_json": (json.dumps(VALID).encode()[:-2] + b",", 400, "body"),
    "not_an_object": (b"[1, 2]", 422, "body"),
    "missing_input": (json.dumps(_with(VALID, ["input"], ...)).encode(), 422, "input"),
    "empty_input": (json.dumps(_with(VALID, ["input"], "")).encode(), 422, "input"),
    "unknown_field": (json.dumps({**VALID, "urgency": 1}).encode(), 422, "urgency"),
    "priority_out_of_range": (json.dumps({**VALID, "priority": 10}).encode(), 422, "priority"),
    "other_owner": (json.dumps({**VALID, "owner": "team-b"}).encode(), 403, "owner"),
    "root_id_not_a_uuid": (json.dumps({**VALID, "root_id": "r1"}).encode(), 422, "root_id"),
    "unknown_root": (json.dumps({**VALID, "root_id": str(uuid.uuid4())}).encode(), 422, "root_id"),
    "unknown_tool": (
        json.dumps(_with(VALID, ["config", "tools"], ["add", "teleport"])).encode(),
        422,
        "config.tools[1]",
    ),
    "wrong_arg_type": (
        json.dumps(_with(VALID, ["config", "model", "turns", 0, "tool_calls", 0, "args", "a"], "two")).encode(),
        422,
        "config.model.turns[0].tool_calls[0].args.a",
    ),
    "nan": (
        json.dumps(VALID).replace('"b": 3', '"b": NaN').encode(),
        422,
        "config.model.turns[0].tool_calls[0].args.b",
    ),
    "too_large": (json.dumps({**VALID, "input": "x" * BODY_LIMIT}).encode(), 413, "body"),
}


def test_refused_requests_name_the_field_and_store_nothing(api: ApiServer, ctx) -> None:
    for name, (body, status, field) in BAD_SUBMISSIONS.items():
        response = api.http.post("/v1/runs", content=body, headers=JSON_HEADERS)
        assert response.status_code == status, (name, response.text)
        assert response.json()["error"]["field"] == field, (name, response.text)
        assert field in response.json()["error"]["message"] or field == "body", (name, response.text)

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused as the bytes arrive
        yield b'{"input": "'
        for _ in range(8):
            yield b"y" * 16_384
        yield b'"}'

    chunked = api.http.post("/v1/runs", content=chunks(), headers=JSON_HEADERS)
    assert (chunked.status_code, chunked.json()["error"]["code"]) == (413, "BODY_TOO_LARGE")
    some_run = str(uuid.uuid4())
    bad_delivery = api.http.post(
        f"/v1/runs/{some_run}/deliveries", json={"tool_call_id": "c", "files": {"a": 1}}, headers=A
    )
    assert (bad_delivery.status_code, bad_delivery.json()["error"]["field"]) == (422, "files.a")
    bad_id = api.http.post("/v1/runs/not-a-run/cancel", headers=A)
    assert (bad_id.status_code, bad_id.json()["error"]["field"]) == (422, "run_id")
    assert counts(ctx.engine) == dict.fromkeys(counts(ctx.engine), 0)

    # The same API accepts the valid request (the refusals above were about the fields),
    # with its priority stored.
    accepted = api.http.post("/v1/runs", content=json.dumps({**VALID, "priority": 8}).encode(), headers=JSON_HEADERS)
    assert accepted.status_code == 201, accepted.text
    assert counts(ctx.engine)["runs"] == 1
    assert rows(ctx.engine, "SELECT priority FROM runs") == [{"priority": 8}]


def test_the_openapi_document_lists_the_endpoints(api: ApiServer) -> None:
    document = api.http.get("/openapi.json")
    assert document.status_code == 200
    spec = document.json()
    assert {(path, method) for path, item in spec["paths"].items() for method in item} == {
        ("/v1/runs", "post"),
        ("/v1/runs/{run_id}", "get"),
        ("/v1/runs/{run_id}/cancel", "post"),
        ("/v1/runs/{run_id}/deliveries", "post"),
        ("/v1/runs/{run_id}/prerequisites", "post"),
        ("/v1/runs/{run_id}/tool-results", "post"),
        ("/v1/runs/{run_id}/approvals", "post"),
        ("/v1/runs/{run_id}/tool-retries", "post"),
        ("/v1/runs/{run_id}/events", "get"),
        ("/v1/roots/{root_id}/runs", "get"),
        ("/v1/owner", "get"),
        ("/v1/runs", "get"),
        ("/v1/runs/{run_id}/rounds", "get"),
        ("/v1/runs/{run_id}/stream-token", "post"),
        ("/v1/runs/{run_id}/fork", "post"),
        ("/v1/agents", "post"),
        ("/v1/agents", "get"),
        ("/v1/agents/{name}", "get"),
        ("/v1/agents/{name}", "patch"),
        ("/v1/agents/{name}", "delete"),
    }
    # The inspector's reads are described by their response models.
    for path, model in [("/v1/runs", "RunList"), ("/v1/runs/{run_id}/rounds", "RunRounds")]:
        schema = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model}"}, path
    assert "digest_check" in spec["components"]["schemas"]["RoundView"]["properties"]
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "text/event-stream" in spec["paths"]["/v1/runs/{run_id}/events"]["get"]["responses"]["200"]["content"]
    submission = spec["components"]["schemas"]["RunSubmission"]
    assert set(submission["required"]) == {"input"}
    # A run names a config or a saved agent, exactly one.
    assert [sorted(branch["required"]) for branch in submission["oneOf"]] == [["config"], ["agent"]]

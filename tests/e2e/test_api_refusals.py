"""The HTTP API (a real ``aidawork api`` process on a real PostgreSQL) given JSON values
no store can hold: NaN, Infinity and 1e400 literals, NUL and unpaired surrogates in keys,
values, file paths and contents, nesting past 64 levels (and past what json.loads can
parse), integers past 4000 and 4300 digits. Each is a 422 JSON refusal naming the field,
never a 500; no table changes; the log holds no traceback and none of what was sent."""

from __future__ import annotations

import json
from typing import Any

import httpx

from runtime.canonical import MAX_JSON_DEPTH, NON_FINITE, NUL_CHARACTER, TOO_DEEP, TOO_MANY_DIGITS, UNPAIRED_SURROGATE
from tests.support.api import ADD, JSON_HEADERS, ApiServer
from tests.support.requests import scripted_request, without_owner
from tests.support.suspensions import READ_ONE, assert_unchanged, snapshot, suspended_run

MARKER = "marker-7f3a"  # in every refused body: it must not reach the log
AWAIT = [{"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}, {"content": "approved"}]


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def prerequisite(value: str, key: str = "approval") -> bytes:
    return ('{"key": "' + key + '", "value": {"m": "' + MARKER + '", "v": ' + value + "}}").encode()


PREREQUISITES: dict[str, tuple[bytes, str, str]] = {
    "nan": (prerequisite("NaN"), "value.v", NON_FINITE),
    "infinity": (prerequisite("Infinity"), "value.v", NON_FINITE),
    "minus_infinity": (prerequisite("[-Infinity]"), "value.v[0]", NON_FINITE),
    "1e400": (prerequisite("1e400"), "value.v", NON_FINITE),
    "nul_in_value": (prerequisite('"a\\u0000"'), "value.v", NUL_CHARACTER),
    "surrogate_in_value": (prerequisite('"\\ud800"'), "value.v", UNPAIRED_SURROGATE),
    "surrogate_in_a_key_of_the_value": (prerequisite('{"\\udc00": 1}'), "value.v", UNPAIRED_SURROGATE),
    "nul_in_key": (prerequisite("1", key="appro\\u0000val"), "key", NUL_CHARACTER),
    "surrogate_in_key": (prerequisite("1", key="approval\\ud800"), "key", "string"),
    "900_deep": (prerequisite(nested(900)), "value.v" + "[0]" * (MAX_JSON_DEPTH - 1), TOO_DEEP),
    "20000_deep": (prerequisite(nested(20_000)), "body", TOO_DEEP),
    "4001_digits": (prerequisite("3" * 4001), "value.v", TOO_MANY_DIGITS),
    "5000_digits": (prerequisite("3" * 5000), "body", TOO_MANY_DIGITS),
}


def delivery(path: str, content: str, call: str = "call_0_0") -> bytes:
    return ('{"tool_call_id": "' + call + '", "files": {"' + path + '": "' + MARKER + content + '"}}').encode()


DELIVERIES: dict[str, tuple[bytes, str, str]] = {
    "nul_in_content": (delivery("notes/a.txt", "\\u0000"), "files[0].content", NUL_CHARACTER),
    "surrogate_in_content": (delivery("notes/a.txt", "\\ud83d"), "files[0].content", UNPAIRED_SURROGATE),
    "nul_in_path": (delivery("notes/a\\u0000.txt", ""), "files[0].path", NUL_CHARACTER),
    "surrogate_in_path": (delivery("notes/\\udfff.txt", ""), "files[0].path", UNPAIRED_SURROGATE),
    "nul_in_tool_call_id": (delivery("notes/a.txt", "", call="call_0_0\\u0000"), "tool_call_id", NUL_CHARACTER),
}

SUBMISSION = json.dumps(without_owner(scripted_request(ADD, tools=["add", "echo"])))
B_PATH = "config.model.turns[0].tool_calls[0].args.b"


def submission(b: str) -> bytes:
    return SUBMISSION.replace('"b": 3', '"b": ' + b).replace('"input": "go"', f'"input": "{MARKER}"').encode()


SUBMISSIONS: dict[str, tuple[bytes, str, str]] = {
    "infinity": (submission("Infinity"), B_PATH, NON_FINITE),
    "1e400": (submission("-1e400"), B_PATH, NON_FINITE),
    "300_deep": (submission(nested(300)), B_PATH + "[0]" * (MAX_JSON_DEPTH - 8), TOO_DEEP),
    "20000_deep": (submission(nested(20_000)), "body", TOO_DEEP),
    "4001_digits": (submission("9" * 4001), B_PATH, TOO_MANY_DIGITS),
    "5000_digits": (submission("9" * 5000), "body", TOO_MANY_DIGITS),
    "nul_in_a_key": (submission('{"\\u0000": 1}'), B_PATH, NUL_CHARACTER),
}


def assert_refused_422(response: httpx.Response, name: str, field: str, reason: str) -> None:
    assert response.status_code == 422, (name, response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == "REQUEST_INVALID", (name, error)
    assert error["field"] == field, (name, error)
    assert reason in error["message"], (name, error)
    assert MARKER not in response.text, name


def test_unstorable_values_are_422_naming_the_field_and_store_nothing(api: ApiServer, ctx) -> None:
    awaiting = suspended_run(ctx, AWAIT, ["await_prerequisite"], owner="team-a")
    reading = suspended_run(ctx, READ_ONE, ["read_files"], owner="team-a")
    before = snapshot(ctx)
    sent: list[tuple[str, str, bytes, str, str]] = [
        *[(n, f"/v1/runs/{awaiting}/prerequisites", *case) for n, case in PREREQUISITES.items()],
        *[(n, f"/v1/runs/{reading}/deliveries", *case) for n, case in DELIVERIES.items()],
        *[(n, "/v1/runs", *case) for n, case in SUBMISSIONS.items()],
    ]

    for name, url, body, field, reason in sent:
        assert_refused_422(api.http.post(url, content=body, headers=JSON_HEADERS), name, field, reason)

    assert_unchanged(ctx, before, "refused API requests")
    log = api.log_path.read_text()
    assert "Traceback" not in log and "request_crashed" not in log and MARKER not in log
    served: list[dict[str, Any]] = [json.loads(line) for line in log.splitlines() if '"request_served"' in line]
    assert len(served) >= len(sent) and {line["status"] for line in served} <= {200, 422}

    # The same inputs, storable, are taken.
    resolved = api.http.post(f"/v1/runs/{awaiting}/prerequisites", content=prerequisite("1"), headers=JSON_HEADERS)
    assert resolved.json() == {"stored": True, "resuming": True}, resolved.text
    delivered = api.http.post(
        f"/v1/runs/{reading}/deliveries", content=delivery("notes/a.txt", ""), headers=JSON_HEADERS
    )
    assert delivered.json() == {"stored": True, "resuming": True}, delivered.text

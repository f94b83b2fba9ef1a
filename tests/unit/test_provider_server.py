"""The loopback provider server of tests/support/providers.py checks itself."""

from __future__ import annotations

import httpx

from tests.support.providers import FakeProvider, Reply, add_then_answer


def test_the_fake_records_requests_and_answers_from_its_script(fake: FakeProvider) -> None:
    fake.script(Reply(201, {"n": 1}, headers={"x-test": "yes"}), Reply(503, {"n": 2}))

    first = httpx.post(f"{fake.url}/v1/x", json={"a": 1}, headers={"X-Key": "k"})
    second = httpx.post(f"{fake.url}/v1/y", json={"b": 2})

    assert (first.status_code, first.json(), first.headers["x-test"]) == (201, {"n": 1}, "yes")
    assert (second.status_code, second.json()) == (503, {"n": 2})
    assert [(r.path, r.body) for r in fake.requests] == [("/v1/x", {"a": 1}), ("/v1/y", {"b": 2})]
    assert fake.requests[0].headers["x-key"] == "k"


def test_the_played_model_calls_add_then_answers_with_its_result() -> None:
    server = FakeProvider(add_then_answer)
    try:
        first = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "go"}]})
        call = first.json()["choices"][0]["message"]["tool_calls"][0]
        second = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "tool", "tool_call_id": call["id"], "content": '{"sum":5}'}]},
        )
        third = httpx.post(
            f"{server.url}/v1/messages",
            json={"messages": [{"role": "user", "content": [{"type": "tool_result", "content": '{"sum":5}'}]}]},
        )
    finally:
        server.close()

    assert call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert second.json()["choices"][0]["message"]["content"] == "The sum is 5."
    assert third.json()["content"] == [{"type": "text", "text": "The sum is 5."}]

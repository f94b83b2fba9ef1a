"""Token deltas without services: the scripted model streams its content in words before
it returns (and nothing changes without a sink), the loop hands its hooks' sink to the
model, the SSE framing of a delta has no id, a delta after its round's durable response
is dropped, and an SSE stream sends received deltas before the durable page read after
them."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest

from runtime.config import ScriptedModelConfig
from runtime.loop import drive_react_loop
from runtime.messages import user_message
from runtime.models.base import ModelRequest
from runtime.models.scripted import ScriptedModel, chunks
from runtime.state import RunState
from schema.store.owners import EventTail, TailKey
from schema.wire import RunEvent
from tests.support.fakes import RecordingHooks, deps_for
from tests.support.requests import scripted_request
from worker.api.deltas import DeltaListener
from worker.api.streams import EventHub, follow, format_delta_sse
from worker.ops.deltas import MODEL_STREAM_RESTARTED, DeltaOrder, RunDelta, decode, encode

CONTENT = "The answer, after some thought,  is\nforty-two. "


def model(content: str = CONTENT, latency_ms: int = 0) -> ScriptedModel:
    turns = [{"content": content, "latency_ms": latency_ms}]
    return ScriptedModel(ScriptedModelConfig.model_validate({"provider": "scripted", "turns": turns}))


def request(on_delta=None) -> ModelRequest:
    return ModelRequest(system="s", messages=(user_message("hi"),), tools=(), messages_digest="d", round_index=0,
                        on_delta=on_delta)


@pytest.mark.parametrize("text", [CONTENT, "one", "  leading", "trailing  ", "a\n\nb", "   "])
def test_chunks_are_words_that_join_to_the_text(text: str) -> None:
    assert "".join(chunks(text)) == text
    assert all(piece for piece in chunks(text))


def test_the_scripted_model_streams_its_content_in_words_before_it_returns() -> None:
    log: list[str] = []

    response = model(latency_ms=30).complete(request(on_delta=log.append))
    log.append("returned")

    assert len(log) == len(CONTENT.split()) + 1 and log[-1] == "returned"
    assert "".join(log[:-1]) == CONTENT == response.content


def test_without_a_sink_the_scripted_model_answers_as_before() -> None:
    streamed = model().complete(request(on_delta=lambda text: None))
    plain = model().complete(request())

    assert plain == streamed
    assert plain.digest() == streamed.digest()


def test_the_loop_gives_the_model_its_hooks_sink_and_the_round_is_unchanged() -> None:
    raw = scripted_request([{"content": CONTENT}])
    hooks = RecordingHooks(deltas=[])
    streamed = drive_react_loop(deps_for(raw), RunState.start("go"), hooks)
    plain = drive_react_loop(deps_for(raw), RunState.start("go"), RecordingHooks())

    assert "".join(hooks.deltas or []) == CONTENT
    assert hooks.log[0] == "started" and hooks.log[-1] == "finished" and set(hooks.log[1:-1]) == {"delta"}
    assert streamed.digests == plain.digests and streamed.outcome == plain.outcome
    assert hooks.started[0][0].on_delta is not None


def test_a_delta_is_an_sse_message_with_no_id() -> None:
    text = format_delta_sse(RunDelta(2, 'said "x"\nthen é'))
    restarted = format_delta_sse(RunDelta(2, kind=MODEL_STREAM_RESTARTED))

    assert text == 'event: model_delta\ndata: {"round": 2, "delta": "said \\"x\\"\\nthen é"}\n\n'
    assert restarted == 'event: model_stream_restarted\ndata: {"round": 2}\n\n'


def test_a_published_delta_decodes_to_itself_and_anything_else_to_none() -> None:
    delta = RunDelta(3, "hé", attempt=2)

    assert decode(encode(delta)) == delta
    assert decode(encode(RunDelta(3, kind=MODEL_STREAM_RESTARTED))) == RunDelta(3, kind=MODEL_STREAM_RESTARTED)
    for junk in (b"not json", b"{}", json.dumps({"kind": "other", "round": 1}), b"[1]"):
        assert decode(junk) is None


def test_a_delta_of_a_round_already_responded_is_dropped() -> None:
    order = DeltaOrder()
    assert order.keeps(RunDelta(0, "a"))
    order.responded("model_responded", {"boundary_seq": 0})
    order.responded("tool_completed", {"boundary_seq": 5})

    assert not order.keeps(RunDelta(0, "late")) and order.keeps(RunDelta(1, "b"))


def _event(run_id: UUID, seq: int, kind: str, data: dict) -> RunEvent:
    return RunEvent(run_id=run_id, seq=seq, kind=kind, data=data, created_at=datetime.now(UTC))


def test_a_stream_sends_received_deltas_before_the_durable_page_after_them() -> None:
    run_id = uuid4()
    responded = _event(run_id, 1, "model_responded", {"boundary_seq": 0, "content": "a b", "tool_calls": []})
    completed = _event(run_id, 2, "run_completed", {"output": "a b"})
    pages = [[responded, completed]]

    def read(keys: list[TailKey]) -> dict[TailKey, EventTail]:
        return {keys[0]: EventTail(events=pages.pop(), ended=True)} if pages else {}

    async def go() -> list[str]:
        hub = EventHub(read, poll_s=0.01)
        wake = asyncio.Event()
        listener = DeltaListener(str(run_id), wake)
        listener.deliver(RunDelta(0, "a "))
        listener.deliver(RunDelta(0, "b"))
        sub = hub.subscribe(TailKey(run_id, "team", 0), wake=wake)
        out = [text async for text in follow(hub, sub, keepalive_s=5, deltas=listener)]
        await hub.close()
        return out

    out = asyncio.run(go())

    assert [text.split("\n")[0] for text in out] == [
        "event: model_delta",
        "event: model_delta",
        "id: 1",
        "id: 2",
    ]
    assert "".join(json.loads(text.split("data: ")[1])["delta"] for text in out[:2]) == "a b"


def test_a_new_rounds_first_delta_waits_for_a_read_and_goes_before_its_response() -> None:
    from worker.api.streams import DeltaGate

    gate = DeltaGate()
    now, asked = gate.admit([RunDelta(1, "a "), RunDelta(1, "b")])
    assert (now, asked) == ([], True) and [d.delta for d in gate.held] == ["a ", "b"]
    assert [d.delta for d in gate.release()] == ["a ", "b"]
    assert gate.admit([RunDelta(1, "c")]) == ([RunDelta(1, "c")], False)  # the round streams: no more waits
    gate.order.responded("model_responded", {"boundary_seq": 1})
    assert gate.admit([RunDelta(1, "late")]) == ([], False)

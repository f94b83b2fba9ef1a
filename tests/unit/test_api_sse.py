"""Server-sent event framing, Last-Event-ID parsing and the mapping of validation errors
to the field they name."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from schema.wire import RunEvent
from worker.api.errors import ApiError, validation_refusal
from worker.api.streams import format_sse, parse_last_event_id


def parse(stream: str) -> list[dict[str, str]]:
    """A strict SSE parser: a field may appear once per event; events end at a blank line."""
    events, fields = [], {}
    assert stream.endswith("\n\n")
    for line in stream.split("\n")[:-1]:
        if line == "":
            events.append(fields)
            fields = {}
            continue
        name, sep, value = line.partition(": ")
        assert sep and name in ("id", "event", "data") and name not in fields, line
        fields[name] = value
    return events


def event(seq: int, kind: str, data: dict[str, Any]) -> RunEvent:
    return RunEvent(run_id=uuid4(), seq=seq, kind=kind, data=data, created_at=datetime.now(UTC))


def test_an_event_is_one_sse_message_with_seq_kind_and_json() -> None:
    e = event(7, "tool_completed", {"result": {"text": "line 1\nline 2\r\n\n: not a comment\nid: 99"}})

    (parsed,) = parse(format_sse(e))

    assert parsed["id"] == "7" and parsed["event"] == "tool_completed"
    assert RunEvent.model_validate(json.loads(parsed["data"])) == e  # the raw output, whole


def test_consecutive_events_stay_separate() -> None:
    stream = format_sse(event(1, "run_queued", {})) + format_sse(event(2, "run_completed", {"output": "a\n\nb"}))

    assert [(p["id"], p["event"]) for p in parse(stream)] == [("1", "run_queued"), ("2", "run_completed")]


@pytest.mark.parametrize(("raw", "seq"), [(None, 0), ("", 0), ("0", 0), ("12", 12), (" 3 ", 3)])
def test_last_event_id_is_a_seq(raw: str | None, seq: int) -> None:
    assert parse_last_event_id(raw) == seq


@pytest.mark.parametrize("raw", ["-1", "abc", "1.5", "1e3", "0x10", "\u00b2", "\u0661", "9" * 10])
def test_a_bad_last_event_id_is_refused_naming_the_header(raw: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_last_event_id(raw)
    assert (info.value.status, info.value.field) == (400, "Last-Event-ID")


@pytest.mark.parametrize(
    ("error", "status", "field"),
    [
        ({"type": "missing", "loc": ("body", "input"), "msg": "Field required"}, 422, "input"),
        ({"type": "string_type", "loc": ("body", "files", "a.md"), "msg": "x"}, 422, "files.a.md"),
        ({"type": "int_parsing", "loc": ("body", "config", "tools", 1), "msg": "x"}, 422, "config.tools[1]"),
        ({"type": "uuid_parsing", "loc": ("path", "run_id"), "msg": "x"}, 422, "run_id"),
        ({"type": "less_than_equal", "loc": ("query", "limit"), "msg": "x"}, 422, "limit"),
        ({"type": "model_attributes_type", "loc": ("body",), "msg": "x"}, 422, "body"),
        ({"type": "json_invalid", "loc": ("body", 5), "msg": "x", "ctx": {"error": "Expecting value"}}, 400, "body"),
    ],
)
def test_validation_errors_name_the_field(error: dict[str, Any], status: int, field: str) -> None:
    refusal = validation_refusal([error])

    assert (refusal.status, refusal.field) == (status, field)
    assert field in refusal.message or field == "body"

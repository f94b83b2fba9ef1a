"""Next-round context slimming: a long tool output is cut in the model's context only.

Property tests of ``slim_tool_results_for_next_round`` (UTF-8 safe cut, exact marker,
determinism, exemptions), then ``drive_react_loop`` with a 100 kB ``text_blob``: the
stored message, the invocation and the event keep everything, the next model call gets
the slimmed form.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from runtime.canonical import canonical_json
from runtime.config import MAX_TOOL_OUTPUT_BYTES, Policy
from runtime.context import context_chain, slim_tool_results_for_next_round
from runtime.loop import Continue, Finish, RunState, drive_react_loop
from runtime.messages import Message, ToolCall, tool_message, user_message
from tests.support.fakes import RecordingHooks, deps_for, replay_chain
from tests.support.requests import scripted_request

MARKER = re.compile(
    r"\n\[output truncated for the model context: showing the first (?P<kept>\d+) of (?P<total>\d+) bytes, "
    r"(?P<cut>\d+) bytes cut\. The full output is stored with tool_call_id (?P<id>\S+) "
    r"\(tool_invocations, and the run's tool_completed event\)\.\]\Z"
)

# Text mixing 1-, 2-, 3- and 4-byte UTF-8 characters (and anything else encodable).
MULTI = ["a", "é", "ß", "中", "語", "😀", "🎉", "\n", '"', "\\"]
texts = st.text(alphabet=st.sampled_from(MULTI) | st.characters(codec="utf-8"), max_size=1500)
long_texts = st.text(alphabet=st.sampled_from(MULTI), min_size=200, max_size=2500)
limits = st.integers(min_value=256, max_value=2048)


def tool_msg(result: Any, name: str = "echo", call_id: str = "call_3_1") -> Message:
    return tool_message(ToolCall(call_id, name, {}), result)


def output_text(result: Any) -> str:
    """What the slimming measures: the string itself, or the canonical JSON."""
    return result if isinstance(result, str) else canonical_json(result)


def split_context(context: Message) -> tuple[str, re.Match[str]]:
    assert context.role == "tool"
    assert context.content is not None
    match = MARKER.search(context.content)
    assert match is not None, context.content[-300:]
    return context.content[: match.start()], match


def check_cut(original: str, context: Message, max_bytes: int, call_id: str = "call_3_1") -> str:
    """Every promise about one cut output; returns the kept part."""
    kept, marker = split_context(context)
    raw, kept_raw = original.encode(), kept.encode()
    assert len(raw) > max_bytes
    # At most max bytes, a prefix of the original, on a character boundary.
    assert len(kept_raw) <= max_bytes
    assert original.startswith(kept)
    assert raw.startswith(kept_raw)
    assert raw[: len(kept_raw)].decode("utf-8") == kept  # strict: no partial character
    # The longest such prefix: the next character would not have fitted.
    assert len(kept_raw) + len(original[len(kept)].encode()) > max_bytes
    assert len(kept_raw) > max_bytes - 4
    # The marker states the exact numbers and where the full output is.
    assert int(marker["cut"]) == len(raw) - len(kept_raw)
    assert int(marker["kept"]) == len(kept_raw)
    assert int(marker["total"]) == len(raw)
    assert marker["id"] == call_id
    # The context form carries no full result.
    assert context.result is None
    assert context.tool_call_id == call_id
    return kept


# --- properties ---------------------------------------------------------------------------


@settings(max_examples=300)
@given(long_texts, limits)
def test_a_long_string_output_is_cut_to_a_whole_character_prefix_with_an_exact_marker(text, max_bytes) -> None:
    message = tool_msg(text)
    context = slim_tool_results_for_next_round(message, max_bytes)
    if len(text.encode()) <= max_bytes:
        assert context == message
    else:
        check_cut(text, context, max_bytes)


@settings(max_examples=300)
@given(texts, limits)
def test_any_string_output_is_cut_correctly_or_left_unchanged(text, max_bytes) -> None:
    message = tool_msg(text)
    context = slim_tool_results_for_next_round(message, max_bytes)
    if len(text.encode()) <= max_bytes:
        assert context is message or context == message
    else:
        check_cut(text, context, max_bytes)


structured = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | long_texts,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["a", "é", "中", "k😀"]), c, max_size=3),
    max_leaves=6,
)


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["text", "é", "中文", "z"]), structured, min_size=1, max_size=3), limits)
def test_a_structured_output_is_measured_and_cut_as_its_canonical_json(result, max_bytes) -> None:
    message = tool_msg(result)
    context = slim_tool_results_for_next_round(message, max_bytes)
    original = canonical_json(result)
    if len(original.encode()) <= max_bytes:
        assert context == message
        assert context.result == result
    else:
        check_cut(original, context, max_bytes)


@settings(max_examples=200)
@given(long_texts, limits, st.randoms(use_true_random=False))
def test_slimming_is_deterministic_and_survives_a_storage_round_trip(text, max_bytes, rnd: random.Random) -> None:
    result = {"text": text, "n": 3, "nested": {"b": 2, "a": [1, 2]}}
    message = tool_msg(result)
    # What a cold worker reads back from JSONB: same values, other key order, 3 -> 3.0.
    items = list(result.items())
    rnd.shuffle(items)
    reloaded = Message.from_json(json.loads(json.dumps(tool_msg({**dict(items), "n": 3.0}).to_json())))

    first = slim_tool_results_for_next_round(message, max_bytes)
    again = slim_tool_results_for_next_round(message, max_bytes)
    cold = slim_tool_results_for_next_round(reloaded, max_bytes)
    assert first == again
    assert canonical_json(first.to_json()) == canonical_json(cold.to_json())
    history = [user_message("go"), Message(role="assistant", tool_calls=(ToolCall("call_3_1", "echo", {}),))]
    chain = context_chain([*history, first])
    assert chain == context_chain([*history, again]) == context_chain([*history, cold])
    assert chain == replay_chain([*history, first])[-1]
    if len(canonical_json(result).encode()) > max_bytes:
        assert chain != context_chain([*history, message])


@given(long_texts, limits)
def test_read_files_results_are_never_cut(text, max_bytes) -> None:
    for result in (text * 4, {"files": [{"path": "a.txt", "content": text * 4}]}):
        message = tool_msg(result, name="read_files")
        assert slim_tool_results_for_next_round(message, max_bytes) == message


IMAGE_DATA = "iVBORw0KGgo" * 20_000


@pytest.mark.parametrize(
    "result",
    [
        {"type": "image", "data": IMAGE_DATA},
        {"mime_type": "image/png", "data": IMAGE_DATA},
        {"mime_type": "image/jpeg", "data": IMAGE_DATA, "type": "blob"},
        [{"type": "image", "data": IMAGE_DATA}, {"mime_type": "image/webp", "data": IMAGE_DATA}],
    ],
)
def test_image_results_are_never_cut(result) -> None:
    message = tool_msg(result, name="screenshot")
    assert len(canonical_json(result)) > 100_000
    assert slim_tool_results_for_next_round(message, 256) == message
    assert slim_tool_results_for_next_round(message, MAX_TOOL_OUTPUT_BYTES) == message


@pytest.mark.parametrize(
    "result",
    [
        {"type": "text", "data": IMAGE_DATA},
        {"mime_type": "text/plain", "data": IMAGE_DATA},
        [{"type": "image", "data": "x"}, {"type": "text", "data": IMAGE_DATA}],
    ],
)
def test_results_that_only_look_like_images_are_cut(result) -> None:
    context = slim_tool_results_for_next_round(tool_msg(result), 1024)
    check_cut(canonical_json(result), context, 1024)


def test_user_and_assistant_messages_are_never_cut() -> None:
    big = "中" * 50_000
    for message in (user_message(big), Message(role="assistant", content=big)):
        assert slim_tool_results_for_next_round(message, 256) == message


def test_the_cut_starts_at_exactly_one_byte_over_the_limit() -> None:
    fits = "a" + "中" * 85  # 1 + 255 = 256 bytes
    assert len(fits.encode()) == 256
    assert slim_tool_results_for_next_round(tool_msg(fits), 256) == tool_msg(fits)

    over = "aa" + "中" * 85  # 257 bytes: the last 3-byte character must go whole
    context = slim_tool_results_for_next_round(tool_msg(over), 256)
    kept = check_cut(over, context, 256)
    assert kept == "aa" + "中" * 84
    assert "showing the first 254 of 257 bytes, 3 bytes cut" in (context.content or "")

    emoji = "😀" * 65  # 260 bytes; 64 emoji = 256 bytes fit exactly
    kept = check_cut(emoji, slim_tool_results_for_next_round(tool_msg(emoji), 256), 256)
    assert kept == "😀" * 64


def test_policy_default_and_minimum_output_limit() -> None:
    assert Policy().max_tool_output_bytes == MAX_TOOL_OUTPUT_BYTES == 16_384
    assert Policy(max_tool_output_bytes=256).max_tool_output_bytes == 256
    with pytest.raises(ValidationError):
        Policy(max_tool_output_bytes=255)


# --- in the loop ------------------------------------------------------------------------

BLOB = 100_000


def _blob_run(char: str, limit: int | None):
    raw = scripted_request(
        [{"tool_calls": [{"name": "text_blob", "args": {"size_bytes": BLOB, "char": char}}]}, {"content": "done"}],
        tools=("text_blob", "echo"),
    )
    if limit is not None:
        raw["config"]["policy"]["max_tool_output_bytes"] = limit
    deps = deps_for(raw)
    hooks = RecordingHooks()
    s0 = RunState.start("go")
    r0 = drive_react_loop(deps, s0, hooks)
    s1 = s0.after(r0)
    r1 = drive_react_loop(deps, s1, hooks)
    return deps, hooks, r0, s1, r1


@pytest.mark.parametrize(("char", "limit"), [("x", None), ("é", None), ("中", 1000), ("😀", 300)])
def test_loop_stores_the_full_blob_but_the_next_round_sees_the_slimmed_form(char, limit) -> None:
    deps, hooks, r0, s1, r1 = _blob_run(char, limit)
    max_bytes = limit or MAX_TOOL_OUTPUT_BYTES
    assert deps.policy.max_tool_output_bytes == max_bytes
    full = {"text": char * (BLOB // len(char.encode()))}
    assert len(full["text"].encode()) > BLOB - 4

    # Round 0: the stored message, the invocation and the event keep the whole output.
    assert r0.outcome == Continue()
    user, assistant, tool = r0.new_messages
    assert tool.message == tool_message(ToolCall("call_0_0", "text_blob", {"size_bytes": BLOB, "char": char}), full)
    assert tool.message.result == full
    (invocation,) = r0.tool_invocations
    assert invocation.result == full
    completed = [e for e in r0.events if e.kind == "tool_completed"]
    assert completed[0].data["result"] == full
    # ...while the context form is cut, and the chain digests chain the context forms.
    assert user.context == user.message and assistant.context == assistant.message
    kept = check_cut(canonical_json(full), tool.context, max_bytes, call_id="call_0_0")
    assert kept.startswith('{"text":"' + char)
    assert [m.chain_digest for m in r0.new_messages] == replay_chain([m.context for m in r0.new_messages])
    assert tool.chain_digest != replay_chain([m.message for m in r0.new_messages])[-1]

    # Round 1: the model is sent the slimmed message, and the digest of what it was sent.
    (request0, _), (request1, _) = hooks.started
    assert [m.role for m in request0.messages] == ["user"]
    assert request1.messages == (user.message, assistant.message, tool.context)
    assert request1.messages[2].result is None
    assert request1.messages_digest == context_chain(request1.messages) == tool.chain_digest
    assert r1.digests.messages == s1.history_digest == tool.chain_digest
    assert r1.outcome == Finish("done")

    # The model's input size shows it: a few thousand tokens, not the 25k+ of the full output.
    (response1, error1) = hooks.finished[1]
    assert error1 is None and response1 is not None
    full_tokens = tool.message.token_count
    assert full_tokens >= BLOB // len(char.encode()) // 4
    # The scripted model counts the messages it was sent (and, at most, the system prompt).
    sent = sum(m.token_count for m in request1.messages)
    assert sent <= response1.usage.input_tokens <= sent + (len(request1.system) + 3) // 4
    assert response1.usage.input_tokens < (2 * max_bytes + 1000) // 4 + 100
    assert response1.usage.input_tokens * 4 < full_tokens


def test_loop_small_outputs_reach_the_next_round_unchanged() -> None:
    raw = scripted_request([{"tool_calls": [{"name": "text_blob", "args": {"size_bytes": 16_000}}]}, {"content": "ok"}],
                   tools=("text_blob",))
    deps = deps_for(raw)
    hooks = RecordingHooks()
    s0 = RunState.start("go")
    r0 = drive_react_loop(deps, s0, hooks)
    drive_react_loop(deps, s0.after(r0), hooks)
    tool = r0.new_messages[2]
    assert len(canonical_json(tool.message.result).encode()) <= MAX_TOOL_OUTPUT_BYTES
    assert tool.context == tool.message
    assert hooks.started[1][0].messages[2].result == {"text": "x" * 16_000}

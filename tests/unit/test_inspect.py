"""``runtime.inspect``: which stored messages a past round saw, and the digest check,
against contexts built the way the core builds them (``Appender`` in ``runtime.loop``)."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from runtime.context import context_chain
from runtime.inspect import round_context, seen_by
from runtime.messages import Message
from runtime.rebuild import summary_message
from schema.wire.claim import LoadedMessage
from schema.wire.vocab import MessageRole

EARLIER, RUN = UUID(int=1), UUID(int=2)


@dataclass(frozen=True)
class Row:
    run_id: UUID
    boundary_seq: int
    message: LoadedMessage


def row(run_id: UUID, boundary: int, position: int, role: str, content: str) -> Row:
    return Row(run_id, boundary, LoadedMessage(position, {"role": role, "content": content}, None))


STORED = [
    row(EARLIER, 0, 0, "user", "first run"),
    row(EARLIER, 0, 1, "assistant", "first answer"),
    row(RUN, 0, 2, "user", "second run"),
    row(RUN, 0, 3, "assistant", "thinking"),
    row(RUN, 1, 4, "assistant", "done"),
]


def messages(*contents: tuple[str, str]) -> list[Message]:
    return [Message(role=MessageRole(role), content=text) for role, text in contents]


def test_a_round_saw_the_earlier_runs_its_own_input_and_its_earlier_rounds() -> None:
    assert [m.position for m in seen_by(STORED, RUN, 0)] == [0, 1, 2]
    assert [m.position for m in seen_by(STORED, RUN, 1)] == [0, 1, 2, 3]
    assert [m.position for m in seen_by(STORED, EARLIER, 0)] == [0]


def test_the_digest_verifies_only_against_the_context_the_core_would_have_sent() -> None:
    sent = messages(("user", "first run"), ("assistant", "first answer"), ("user", "second run"))
    good = round_context(STORED, RUN, 0, context_chain(sent), summary=None, max_output_bytes=1024, current_from=0)
    assert (good.check, good.digest) == ("verified", context_chain(sent))
    assert [m.content for m in good.messages] == ["first run", "first answer", "second run"]
    other = context_chain(sent[:2])
    assert round_context(STORED, RUN, 0, other, summary=None, max_output_bytes=1024, current_from=0).check == "mismatch"


def test_a_summary_starts_the_context_and_rounds_before_the_rebuild_are_not_checked() -> None:
    summary = summary_message("what came before")
    sent = [summary, *messages(("user", "first run"), ("assistant", "first answer"), ("user", "second run"),
                               ("assistant", "thinking"))]
    seen = round_context(STORED, RUN, 1, context_chain(sent), summary="what came before", max_output_bytes=1024,
                         current_from=1)
    assert seen.check == "verified" and seen.messages[0] == summary
    before = round_context(STORED, RUN, 0, "anything", summary="what came before", max_output_bytes=1024,
                           current_from=1)
    assert (before.check, before.digest) == ("unchecked", None)

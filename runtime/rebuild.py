"""Context rebuild on ModelInputRejection: the pure parts of the pipeline.

When the provider rejects the input as too long, the older part of the context (the
*source prefix*) is compressed into a summary and the call is retried with
``[summary] + the rest``. Choosing the prefix is deterministic: everything in the current
context before its last exchange (the last user message, or the last model response with
its tool results), never ending between a published model response and its tool results
(``split`` must be False). The summary is generated once per candidate, by the model
with a summarization prompt or by the deterministic summarizer the policy selects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runtime.canonical import canonical_json, digest
from runtime.context import context_chain
from runtime.errors import AidaworkError, ModelError
from runtime.hooks import RoundHooks
from runtime.messages import Message
from runtime.models.base import ModelClient, ModelRequest
from schema.wire.errors import ErrorCode
from schema.wire.rebuild import ChainBuild, RebuildCandidate, ReservationPlan, SourceMessage
from schema.wire.vocab import MessageRole

__all__ = [
    "ChainBuild",
    "RebuildCandidate",
    "ReservationPlan",
    "SourceMessage",
]

SUMMARY_PREFIX = "[Summary of the earlier conversation, rebuilt to fit the context window]\n"
MAX_SUMMARY_CHARS = 4000


class RebuildSourceChanged(AidaworkError):
    """The source prefix re-read inside the Root's transaction is not the one the
    candidate was prepared from (count, order, digest, eligibility or a split)."""

    code = ErrorCode.RUNTIME_WORK_MODEL_REBUILD_SOURCE_CHANGED


class RebuildExhausted(AidaworkError):
    """The open chain already consumed its two rebuilds, or there is nothing to compress."""

    code = ErrorCode.MODEL_CONTEXT_REBUILD_EXHAUSTED


def source_digest(source: Sequence[SourceMessage]) -> str:
    return digest([[m.message_id, m.position, m.body] for m in source])


def _is_split_after(messages: Sequence[SourceMessage], end: int) -> bool:
    """True when cutting after ``messages[end - 1]`` separates a model response that
    called tools from (some of) its tool results."""
    if end <= 0 or end >= len(messages):
        return False
    last = messages[end - 1].body
    following = messages[end].body
    return (last.get("role") == "assistant" and bool(last.get("tool_calls"))) or following.get("role") == "tool"


def choose_prefix(messages: Sequence[SourceMessage], ordinal: int = 2) -> tuple[list[SourceMessage], bool]:
    """The source prefix of the current context and whether it would split a published
    response. The chain's first rebuild compresses the older half of what may go; the
    second, everything but the last exchange (the last user message, or the last model
    response with its tool results). The cut moves back until it splits nothing."""
    end = len(messages) - 1
    while end > 0 and messages[end].body.get("role") == "tool":
        end -= 1  # keep the last model response together with its tool results
    if ordinal == 1:
        end //= 2
    while end > 0 and _is_split_after(messages, end):
        end -= 1
    if end == 0 and ordinal == 1:
        return choose_prefix(messages, 2)  # too little for half: take all that may go
    return list(messages[:end]), _is_split_after(messages, end)


PREVIEW_CHARS = 80


def _preview(text: object) -> str:
    text = str(text)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."


def deterministic_summary(source: Sequence[SourceMessage]) -> str:
    """A short, reproducible account of the source: requests, tool calls with a preview of
    their results, and answers (each cut to a short preview)."""
    lines = []
    for m in source:
        body = m.body
        role = body.get("role")
        if role == "user":
            lines.append(f"- user: {_preview(body.get('content'))}")
        elif role == "assistant":
            calls = body.get("tool_calls") or []
            if calls:
                lines.append(f"- assistant called {', '.join(c['name'] for c in calls)}")  # type: ignore[attr-defined]
            if body.get("content"):
                lines.append(f"- assistant: {_preview(body['content'])}")
        elif role == "tool":
            output = body.get("content") if body.get("content") is not None else canonical_json(body.get("result"))
            lines.append(f"- {body.get('name')} returned: {_preview(output)}")
    text = "\n".join(lines)
    if len(text) > MAX_SUMMARY_CHARS:
        text = text[: MAX_SUMMARY_CHARS - 40] + f"\n- ... ({len(source)} messages in all)"
    return text


Summarizer = Callable[[Sequence[SourceMessage]], str]


def prepare_model_rebuild_candidate(
    context: Sequence[SourceMessage], summarizer: Summarizer = deterministic_summary, ordinal: int = 2
) -> RebuildCandidate:
    """Choose the source prefix and generate its summary (the expensive part, done once)."""
    prefix, split = choose_prefix(context, ordinal)
    if not prefix:
        raise RebuildExhausted("the context has nothing left to compress: its last exchange alone is too long")
    return RebuildCandidate(
        ordinal=ordinal,
        source_message_ids=tuple(m.message_id for m in prefix),
        last_source_position=prefix[-1].position,
        source_digest=source_digest(prefix),
        summary=summarizer(prefix),
        split=split,
    )


def verify_prepared_prefix(
    candidate: RebuildCandidate, context: Sequence[SourceMessage], eligible_run_ids: set[str]
) -> None:
    """Inside the Root's transaction: the prefix chosen from the context as it is now must
    be exactly the candidate's (count, order, digest), from eligible runs, and unsplit."""
    prefix, split = choose_prefix(context, candidate.ordinal)
    ids = tuple(m.message_id for m in prefix)
    if candidate.split or split:
        raise RebuildSourceChanged("the source prefix would split a published model response from its tool results")
    if len(ids) != len(candidate.source_message_ids):
        raise RebuildSourceChanged(
            f"the source prefix has {len(ids)} messages now, {len(candidate.source_message_ids)} when prepared"
        )
    if ids != candidate.source_message_ids:
        raise RebuildSourceChanged("the source prefix's messages or their order changed since it was prepared")
    if any(m.run_id not in eligible_run_ids for m in prefix):
        raise RebuildSourceChanged("the source prefix holds messages of a run that is not eligible")
    if source_digest(prefix) != candidate.source_digest:
        raise RebuildSourceChanged("the source prefix's content changed since it was prepared")


class RebuildPredecessorMismatch(AidaworkError):
    """An ordinal-2 reservation did not bind the chain's consumed ordinal-1 build."""

    code = ErrorCode.MODEL_REBUILD_PREDECESSOR_MISMATCH


def plan_reservation(chain: Sequence[ChainBuild], predecessor_build_id: str | None) -> ReservationPlan:
    """At most two rebuilds per open chain: ordinal 1, then ordinal 2 bound to the
    consumed ordinal 1."""
    by_ordinal = {b.ordinal: b for b in chain}
    first, second = by_ordinal.get(1), by_ordinal.get(2)
    if second is not None and second.consumed:
        raise RebuildExhausted("the model rejected the input after two context rebuilds in this chain")
    if first is None:
        if predecessor_build_id is not None:
            raise RebuildPredecessorMismatch("the chain has no first rebuild to bind to")
        return ReservationPlan(None, 1, None)
    if not first.consumed:
        if predecessor_build_id is not None:
            raise RebuildPredecessorMismatch("the chain's first rebuild is not consumed yet")
        return ReservationPlan(first.build_id, 1, None)
    if predecessor_build_id != first.build_id:
        raise RebuildPredecessorMismatch(
            f"a second rebuild must bind the consumed first one ({first.build_id}), not {predecessor_build_id}"
        )
    if second is None:
        return ReservationPlan(None, 2, first.build_id)
    return ReservationPlan(second.build_id, 2, first.build_id)


SUMMARY_SYSTEM_PROMPT = (
    "Summarize the conversation excerpt below for your own later use: keep every fact, "
    "decision, tool result and open question that may matter; be concise."
)


def model_summarizer(model: ModelClient, hooks: RoundHooks, previous_summary: str | None) -> Summarizer:
    """The run's model writes the summary (one call, recorded through ``hooks``)."""

    def summarize(source: Sequence[SourceMessage]) -> str:
        transcript = with_previous(previous_summary, deterministic_summary)(source)
        messages = (Message(role=MessageRole.USER, content=transcript),)
        request = ModelRequest(SUMMARY_SYSTEM_PROMPT, messages, (), context_chain(messages), round_index=-1)
        hooks.model_call_started(request, digest({"summary_of": request.messages_digest}))
        try:
            response = model.complete(request)
        except ModelError as exc:
            hooks.model_call_finished(None, exc)
            raise
        hooks.model_call_finished(response, None)
        return response.content or transcript

    return summarize


def with_previous(previous_summary: str | None, summarizer: Summarizer) -> Summarizer:
    """A second rebuild folds the first one's summary into the new one."""

    def summarize(source: Sequence[SourceMessage]) -> str:
        text = summarizer(source)
        return f"{previous_summary}\n{text}"[-MAX_SUMMARY_CHARS:] if previous_summary else text

    return summarize


def summary_message(summary: str) -> Message:
    return Message(role=MessageRole.USER, content=SUMMARY_PREFIX + summary)


def checkpoint_history(summary: str | None) -> tuple[tuple[Message, ...], str]:
    """The start of a run's model context under its checkpoint: the rebuild summary, if
    any, and the chain digest the Root's messages extend (``runtime.context.loaded_context``)."""
    history = (summary_message(summary),) if summary is not None else ()
    return history, context_chain(history)

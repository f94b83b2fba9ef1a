"""How a model's answer ends, handled by rule, in one place.

The adapters report the provider's own finish reason on ``ModelResponse.finish_reason``
and raise, themselves, for the endings that carry no usable answer: a refusal
(``ModelRefused``), a content filter (``ModelContentFiltered``), a tool call cut off
mid-arguments (``ModelOutputTruncated``), a tool call of a kind we do not run
(``ModelToolCallUnsupported``). What remains is decided here, for one round:

- truncated (OpenAI ``length``, Anthropic ``max_tokens``): ``ModelOutputTruncated``,
  unless the policy says ``on_truncation: "continue"``: then the partial text is appended
  as an assistant message and the model is called again (a truncated answer with tool
  calls is never continued: its calls may be incomplete);
- paused (Anthropic ``pause_turn``): the paused content is appended and the model is
  called again, always;

each further call a model call of its own (``call`` records it in the ledger), at most
``MAX_CONTINUATIONS`` of them per round; the texts are concatenated into one response.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from runtime.canonical import chain_digest
from runtime.errors import ModelOutputTruncated
from runtime.models.base import ModelRequest, ModelResponse, Usage

MAX_CONTINUATIONS = 3
TRUNCATED = frozenset({"length", "max_tokens"})
PAUSED = frozenset({"pause_turn"})


def complete_turn(
    request: ModelRequest, on_truncation: str, call: Callable[[ModelRequest], ModelResponse]
) -> ModelResponse:
    """The round's answer: ``call(request)``, continued by the rules above."""
    response = call(request)
    texts = [response.content or ""]
    usage = response.usage
    continuations = 0
    while response.finish_reason in TRUNCATED or response.finish_reason in PAUSED:
        truncated = response.finish_reason in TRUNCATED
        if truncated and (on_truncation != "continue" or response.tool_calls):
            raise ModelOutputTruncated(_truncated_message(response, "".join(texts)))
        if continuations >= MAX_CONTINUATIONS:
            raise ModelOutputTruncated(
                f"the answer was still unfinished ({response.finish_reason}) after {MAX_CONTINUATIONS} "
                "continuations"
            )
        continuations += 1
        partial = replace(response, tool_calls=()).as_message()
        request = replace(
            request,
            messages=(*request.messages, partial),
            messages_digest=chain_digest(request.messages_digest, partial.to_json()),
        )
        response = call(request)
        texts.append(response.content or "")
        usage = Usage(
            usage.input_tokens + response.usage.input_tokens, usage.output_tokens + response.usage.output_tokens
        )
    if continuations == 0:
        return response
    text = "".join(texts)
    return replace(response, content=text or None, usage=usage)


def _truncated_message(response: ModelResponse, text: str) -> str:
    what = "a tool call" if response.tool_calls else "the answer"
    tail = f": {text[-200:]!r}" if text else ""
    return (
        f"the model's output was cut off by its token limit ({response.finish_reason}) in {what}{tail}; "
        "raise max_tokens / max_completion_tokens, or set policy.on_truncation to \"continue\""
    )

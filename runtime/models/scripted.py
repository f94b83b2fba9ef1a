"""A deterministic model whose script travels in the run request.

Turn ``i`` of the script answers round ``i`` of the run (``ModelRequest.round_index``),
so a round that is re-executed after a crash gets the same answer. Tool call ids are
``call_<turn>_<index>``, so a re-executed round produces identical ids.

Given ``ModelRequest.on_delta``, a turn streams its ``content`` word by word, spread over
its ``latency_ms`` (a sleep before each word), before it returns the same response it
returns unstreamed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from runtime.config import ScriptedModelConfig
from runtime.errors import ModelInputRejection, ModelScriptExhausted
from runtime.messages import ToolCall
from runtime.models.base import ModelRequest, ModelResponse, Usage


class ScriptedModel:
    def __init__(self, config: ScriptedModelConfig) -> None:
        self._turns = config.turns
        self._context_limit = config.context_limit_tokens

    def complete(self, request: ModelRequest) -> ModelResponse:
        input_tokens = request.message_tokens() + (len(request.system) + 3) // 4
        if self._context_limit is not None and input_tokens > self._context_limit:
            raise ModelInputRejection(
                f"the input is {input_tokens} tokens, over the context window of {self._context_limit}"
            )
        index = request.round_index
        if index < 0:  # a summarization request (context rebuild): answer deterministically
            text = request.messages[-1].content or "" if request.messages else ""
            return ModelResponse(
                content=f"Summary: {text[:400]}", usage=Usage(input_tokens, (len(text[:400]) + 12) // 4)
            )
        if index >= len(self._turns):
            raise ModelScriptExhausted(f"the script has {len(self._turns)} turns and turn {index + 1} was requested")
        turn = self._turns[index]
        if request.on_delta is not None and turn.content:
            stream(turn.content, turn.latency_ms / 1000, request.on_delta)
        elif turn.latency_ms:
            time.sleep(turn.latency_ms / 1000)
        calls = tuple(
            ToolCall(id=f"call_{index}_{i}", name=c.name, args=dict(c.args))
            for i, c in enumerate(turn.tool_calls or ())
        )
        usage = Usage(
            input_tokens=input_tokens,
            output_tokens=(len(turn.content or "") + 3) // 4 + 8 * len(calls),
        )
        return ModelResponse(content=turn.content, tool_calls=calls, usage=usage)


_WORD_STARTS = re.compile(r"(?<=\s)(?=\S)")


def chunks(text: str) -> list[str]:
    """``text`` in words, each with the whitespace after it: joined, they are ``text``."""
    return [piece for piece in _WORD_STARTS.split(text) if piece]


def stream(text: str, latency_s: float, on_delta: Callable[[str], None]) -> None:
    pieces = chunks(text)
    for piece in pieces:
        if latency_s:
            time.sleep(latency_s / len(pieces))
        on_delta(piece)

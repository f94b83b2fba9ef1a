"""A provider that echoes part of a key (its first 13 characters) or the key reversed:
every 8-character piece of a configured key, and of the key reversed, is redacted from
what the adapters hand on, answers and streamed deltas (split across chunks) alike, and
from the errors built from a provider's body. Against a loopback server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from runtime.models.provider_errors import ModelRequestRefused
from runtime.models.scrub import REDACTED, ScrubbedDeltas, scrub_text
from tests.support.provider_clients import ANTHROPIC_KEY, OPENAI_KEY, anthropic_client, model_request, openai_client
from tests.support.providers import FakeProvider, anthropic_stream, openai_error, openai_reply, openai_stream


def windows(key: str) -> set[str]:
    """Every 8-character piece of ``key`` and of ``key`` reversed."""
    return {k[i : i + 8] for k in (key, key[::-1]) for i in range(len(k) - 7)}


def leaked(text: str, key: str) -> list[str]:
    return sorted(w for w in windows(key) if w in text)


def fragments(key: str) -> str:
    return f"Your key starts {key[:13]} and backwards it is {key[::-1]}."


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider()
    yield server
    server.close()


def test_a_key_prefix_and_the_reversed_key_are_redacted_from_an_answer(fake: FakeProvider) -> None:
    fake.script(openai_reply(fragments(OPENAI_KEY), [("call_1", "echo", '{"x": "' + OPENAI_KEY[2:12] + '"}')]))
    response = openai_client(f"{fake.url}/v1").complete(model_request())

    assert response.content == f"Your key starts {REDACTED} and backwards it is {REDACTED}."
    assert response.tool_calls[0].args == {"x": REDACTED}
    assert leaked(repr(response), OPENAI_KEY) == []


def test_a_key_prefix_in_an_error_body_is_redacted_from_the_error(fake: FakeProvider) -> None:
    fake.script(openai_error(400, fragments(OPENAI_KEY)))
    with pytest.raises(ModelRequestRefused) as info:
        openai_client(f"{fake.url}/v1").complete(model_request())
    assert REDACTED in info.value.message and leaked(info.value.message, OPENAI_KEY) == []


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_key_fragments_split_across_streamed_chunks_never_reach_the_delta_sink(
    fake: FakeProvider, provider: str
) -> None:
    key = OPENAI_KEY if provider == "openai" else ANTHROPIC_KEY
    back = key[::-1]
    pieces = ["Starts ", key[:3], key[3:9], key[9:13], " then ", back[:5], back[5:], " end."]
    fake.script(openai_stream(pieces) if provider == "openai" else anthropic_stream(pieces))
    seen: list[str] = []
    model = openai_client(f"{fake.url}/v1") if provider == "openai" else anthropic_client(fake.url)
    response = model.complete(replace(model_request(), on_delta=seen.append))

    joined = "".join(seen)
    assert joined == response.content and joined.startswith(f"Starts {REDACTED} then ")
    # The reversed key's second chunk holds 8+ of its characters alone: that chunk is
    # redacted as it arrives, and what is left before it is shorter than a piece.
    assert joined.count(REDACTED) == 2 and joined.endswith(f"{REDACTED} end.")
    assert leaked(joined, key) == [] and all(leaked(s, key) == [] for s in seen)


def test_a_piece_shorter_than_eight_characters_is_kept() -> None:
    key = "sk-abcdefghijklmnop"
    assert scrub_text(f"x {key[:7]} y {key[3:11]} z", (key,)) == f"x {key[:7]} y {REDACTED} z"


def test_scrubbed_deltas_catch_a_key_piece_spanning_many_pushes() -> None:
    key = "sk-abcdefghijklmnop"
    out: list[str] = []
    deltas = ScrubbedDeltas(out.append, (key,))
    for piece in ["ok ", *key[4:14], " done"]:  # one character a push
        deltas.push(piece)
    deltas.flush()
    assert "".join(out) == f"ok {REDACTED} done"

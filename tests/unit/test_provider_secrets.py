"""A canary key reaches the provider in the right header and nowhere else: not in any
exception text, repr, structlog event, stdlib log record or output, even when the provider
echoes it back in an error body."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from pydantic import SecretStr
from structlog.testing import capture_logs

from runtime.config import AnthropicModelConfig, OpenAIModelConfig
from runtime.context import context_chain
from runtime.deps import build_runtime
from runtime.errors import ModelError, ModelInputRejection, ModelUnavailable
from runtime.messages import user_message
from runtime.models.anthropic import AnthropicProvider
from runtime.models.base import ModelClient, ModelRequest
from runtime.models.http import REDACTED, ModelKeys, ModelRequestRefused, ModelResponseInvalid, RetryPolicy
from runtime.models.openai_compat import OpenAIProvider
from tests.unit.test_provider_server import (
    FakeProvider,
    Reply,
    anthropic_error,
    anthropic_reply,
    openai_error,
    openai_reply,
)

CANARY = "sk-canary-XYZ"
FAST_RETRY = RetryPolicy(max_attempts=3, base_s=0.01, cap_s=0.02)
REQUEST = ModelRequest(
    system="s",
    messages=(user_message("hi"),),
    tools=(),
    messages_digest=context_chain((user_message("hi"),)),
    round_index=0,
    timeout_s=5.0,
)
ECHO = f"Invalid key {CANARY} for this org"  # a provider that echoes the key back


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    server = FakeProvider()
    yield server
    server.close()


def openai_client(base_url: str) -> ModelClient:
    keys = ModelKeys(openai=SecretStr(CANARY), base_urls=(base_url,))
    config = OpenAIModelConfig(provider="openai", name="m", base_url=base_url)
    return OpenAIProvider(keys, retry=FAST_RETRY)(config)


def anthropic_client(base_url: str) -> ModelClient:
    keys = ModelKeys(anthropic=SecretStr(CANARY), base_urls=(base_url,))
    config = AnthropicModelConfig(provider="anthropic", name="m", base_url=base_url)
    return AnthropicProvider(keys, retry=FAST_RETRY)(config)


# (scripted replies, the error expected) for each provider; every error body echoes the key.
OPENAI_SCENARIOS: list[tuple[list[Reply], type[Exception] | None]] = [
    ([openai_reply("fine")], None),
    ([openai_error(429, ECHO, headers={"retry-after": "0"}), openai_reply("after a retry")], None),
    ([openai_error(401, ECHO, code="invalid_api_key")], ModelRequestRefused),
    ([openai_error(403, ECHO)], ModelRequestRefused),
    ([openai_error(400, f"maximum context length exceeded; {ECHO}")], ModelInputRejection),
    ([Reply(500, raw=ECHO.encode())] * 3, ModelUnavailable),
    ([openai_reply(None, [("c1", "add", f'{{"key": "{CANARY}"')])], ModelResponseInvalid),
]
ANTHROPIC_SCENARIOS: list[tuple[list[Reply], type[Exception] | None]] = [
    ([anthropic_reply("fine")], None),
    ([anthropic_error(529, "overloaded_error", ECHO, headers={"retry-after": "0"}), anthropic_reply("ok")], None),
    ([anthropic_error(401, "authentication_error", ECHO)], ModelRequestRefused),
    ([anthropic_error(400, "invalid_request_error", f"prompt is too long; {ECHO}")], ModelInputRejection),
    ([anthropic_error(404, "not_found_error", ECHO)], ModelRequestRefused),
    ([anthropic_error(500, "api_error", ECHO)] * 3, ModelUnavailable),
]


def exception_texts(exc: BaseException) -> list[str]:
    texts = [str(exc), repr(exc), *(str(a) for a in exc.args)]
    if isinstance(exc, ModelError):
        texts.append(exc.message)
    return texts


def drive(
    client: ModelClient, scenarios: list[tuple[list[Reply], type[Exception] | None]], fake: FakeProvider
) -> list[str]:
    """Run every scenario; returns the texts of the errors they raised (asserting their types)."""
    texts: list[str] = []
    for replies, expected in scenarios:
        fake.script(*replies)
        if expected is None:
            client.complete(REQUEST)
            continue
        with pytest.raises(expected) as info:
            client.complete(REQUEST)
        texts += exception_texts(info.value)
    return texts


@pytest.mark.parametrize(
    ("make", "scenarios", "header", "sent"),
    [
        (openai_client, OPENAI_SCENARIOS, "authorization", f"Bearer {CANARY}"),
        (anthropic_client, ANTHROPIC_SCENARIOS, "x-api-key", CANARY),
    ],
    ids=["openai", "anthropic"],
)
def test_the_canary_key_is_sent_in_its_header_and_appears_nowhere_else(
    fake: FakeProvider,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    make: Callable[[str], ModelClient],
    scenarios: list[tuple[list[Reply], type[Exception] | None]],
    header: str,
    sent: str,
) -> None:
    base_url = f"{fake.url}/v1" if make is openai_client else fake.url
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log every request at DEBUG/INFO
    with capture_logs() as events:
        client = make(base_url)
        texts = drive(client, scenarios, fake)
        texts += [repr(client)]
    out, err = capfd.readouterr()

    # Sent, on every request, in the provider's header.
    assert fake.requests and all(r.headers[header] == sent for r in fake.requests)
    # The echoes reached the adapter and were redacted: this test can see a leak.
    assert any(REDACTED in t for t in texts)
    retried = [e for e in events if e["event"] == "model_call_retried"] or [
        line for line in (out + err).splitlines() if "model_call_retried" in line
    ]
    assert retried, "the retry log line was not captured, so the log check would prove nothing"
    assert any(REDACTED in str(e) for e in retried)
    # ... and the key itself is nowhere.
    haystacks = {
        "exceptions": "\n".join(texts),
        "structlog": "\n".join(str(e) for e in events),
        "stdlib logs": caplog.text + "\n".join(str(r.__dict__) for r in caplog.records),
        "stdout": out,
        "stderr": err,
    }
    for where, text in haystacks.items():
        assert CANARY not in text, f"the key leaked into {where}"


def test_a_connection_failure_does_not_leak_the_key(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    caplog.set_level(logging.DEBUG)
    with capture_logs() as events, pytest.raises(ModelUnavailable) as info:
        openai_client(f"http://127.0.0.1:{port}/v1").complete(REQUEST)

    assert CANARY not in "\n".join(exception_texts(info.value))
    assert CANARY not in str(events) and CANARY not in caplog.text


def test_keys_are_masked_in_every_repr_of_the_runtime() -> None:
    keys = ModelKeys(openai=SecretStr(CANARY), anthropic=SecretStr(CANARY), named={"b": SecretStr(CANARY)})
    runtime = build_runtime(model_keys=keys)
    resolved = keys.resolve("openai", "default", "https://api.openai.com/v1")

    for value in (keys, runtime, runtime.base, runtime.base.model_providers, resolved):
        assert CANARY not in repr(value) and CANARY not in str(value)
    assert resolved.header_value() == CANARY  # masked, not lost


def test_structlog_renders_no_key_even_through_the_json_renderer(fake: FakeProvider) -> None:
    # The workers' renderer: a leak through a value's repr or str would show up here.
    lines: list[str] = []

    def keep(_: Any, __: str, event: dict[str, Any]) -> str:
        line = structlog.processors.JSONRenderer(default=repr)(_, __, event)
        lines.append(str(line))
        raise structlog.DropEvent

    fake.script(openai_error(503, ECHO), openai_reply("ok"))
    saved = structlog.get_config()
    structlog.configure(processors=[keep], cache_logger_on_first_use=False)
    try:
        openai_client(f"{fake.url}/v1").complete(REQUEST)
    finally:
        structlog.configure(**saved)

    assert any("model_call_retried" in line for line in lines)
    assert all(CANARY not in line for line in lines)

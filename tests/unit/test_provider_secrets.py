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
from runtime.models.keys import ModelKeys, NamedKey
from runtime.models.openai_compat import OpenAIProvider
from runtime.models.provider_errors import ModelRequestRefused, ModelResponseInvalid
from runtime.models.scrub import REDACTED
from schema.wire.retry import RetryPolicy
from tests.support.providers import (
    FakeProvider,
    Reply,
    anthropic_error,
    anthropic_reply,
    echoing_error,
    echoing_reply,
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
    return OpenAIProvider(keys, retry=FAST_RETRY)(config, "team-a")


def anthropic_client(base_url: str) -> ModelClient:
    keys = ModelKeys(anthropic=SecretStr(CANARY), base_urls=(base_url,))
    config = AnthropicModelConfig(provider="anthropic", name="m", base_url=base_url)
    return AnthropicProvider(keys, retry=FAST_RETRY)(config, "team-a")


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
    named = {"b": NamedKey(SecretStr(CANARY), frozenset({"b"}))}
    keys = ModelKeys(openai=SecretStr(CANARY), anthropic=SecretStr(CANARY), named=named)
    runtime = build_runtime(model_keys=keys)
    resolved = keys.resolve("openai", "default", "https://api.openai.com/v1", "team-a")

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


# --- a hostile provider echoing keys into every field ------------------------------------------

OTHER = "sk-team-b-other-tenant-key"  # configured for another owner, never sent by these runs


def hostile_client(base_url: str, anthropic: bool) -> ModelClient:
    """team-a's client, on a deployment that also holds team-b's key."""
    keys = ModelKeys(
        openai=SecretStr(CANARY),
        anthropic=SecretStr(CANARY),
        named={"team-b": NamedKey(SecretStr(OTHER), frozenset({"team-b"}))},
        base_urls=(base_url,),
    )
    if anthropic:
        return AnthropicProvider(keys, retry=FAST_RETRY)(
            AnthropicModelConfig(provider="anthropic", name="m", base_url=base_url), "team-a"
        )
    return OpenAIProvider(keys, retry=FAST_RETRY)(
        OpenAIModelConfig(provider="openai", name="m", base_url=base_url), "team-a"
    )


@pytest.mark.parametrize("anthropic", [False, True], ids=["openai", "anthropic"])
def test_no_configured_key_survives_any_field_of_an_echoing_provider(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], anthropic: bool
) -> None:
    base_url = fake.url if anthropic else f"{fake.url}/v1"
    client = hostile_client(base_url, anthropic)
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    with capture_logs() as events:
        for key in (CANARY, OTHER):
            for status in (400, 403, 404, 422):
                fake.script(echoing_error(status, key, anthropic=anthropic))
                with pytest.raises(ModelRequestRefused) as refused:
                    client.complete(REQUEST)
                texts += exception_texts(refused.value)
            for status in (409, 500):  # retried by the SDK, every attempt echoing
                fake.script(*[echoing_error(status, key, anthropic=anthropic)] * 3)
                with pytest.raises(ModelUnavailable) as unavailable:
                    client.complete(REQUEST)
                texts += exception_texts(unavailable.value)
            fake.script(echoing_reply(key, anthropic=anthropic))
            response = client.complete(REQUEST)
            texts.append(repr(response) + repr(response.to_json()))
    out, err = capfd.readouterr()

    # The echoes arrived (the fake really sent them) and came out redacted ...
    assert len(fake.requests) == 2 * 11
    assert all(REDACTED in t for t in texts if "HTTP 4" in t and "refused" in t) and any(REDACTED in t for t in texts)
    assert [c.args for c in response.tool_calls if c.name == "echo"] == [{"x": REDACTED}]
    # ... and neither key is in any exception, response, log event or output.
    everything = "\n".join([*texts, str(events), caplog.text, out, err])
    assert CANARY not in everything and OTHER not in everything
    # The provider's own type and code strings are never copied: our vocabulary is.
    assert "echo Bearer" not in everything and "(invalid_request)" in everything


def test_a_non_json_error_page_is_not_echoed_and_codes_come_from_the_vocabulary(fake: FakeProvider) -> None:
    client = hostile_client(f"{fake.url}/v1", anthropic=False)
    fake.script(
        Reply(400, raw=b"<html>internal admin db_password=hunter2</html>"),
        Reply(400, {"error": {"type": "<script>custom</script>", "code": "weird code", "message": "x" * 5000}}),
    )
    with pytest.raises(ModelRequestRefused) as page:
        client.complete(REQUEST)
    with pytest.raises(ModelRequestRefused) as custom:
        client.complete(REQUEST)

    assert page.value.message.endswith("HTTP 400 (invalid_request)") and "hunter2" not in page.value.message
    assert "script" not in custom.value.message and "weird" not in custom.value.message
    assert "HTTP 400 (invalid_request): " in custom.value.message and len(custom.value.message) < 300


def test_a_redirect_from_an_allowed_base_url_is_not_followed(fake: FakeProvider) -> None:
    elsewhere = FakeProvider()
    try:
        fake.script(Reply(302, headers={"location": f"{elsewhere.url}/v1/chat/completions"}, raw=b""))
        with pytest.raises(ModelRequestRefused) as info:
            hostile_client(f"{fake.url}/v1", anthropic=False).complete(REQUEST)
    finally:
        elsewhere.close()

    assert elsewhere.requests == [] and len(fake.requests) == 1
    assert "HTTP 302 (redirect_not_followed)" in info.value.message


# --- the SDKs read nothing from the environment ------------------------------------------------

SDK_ENV = {
    "OPENAI_API_KEY": "sk-env-openai-canary",
    "OPENAI_ORG_ID": "org-env-canary",
    "OPENAI_PROJECT_ID": "proj-env-canary",
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "ANTHROPIC_API_KEY": "sk-env-anthropic-canary",
    "ANTHROPIC_AUTH_TOKEN": "tok-env-canary",
    "ANTHROPIC_CUSTOM_HEADERS": "X-Env-Canary: env-canary",
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
}


@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no_key"])
def test_the_sdks_take_no_key_header_or_url_from_the_environment(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, with_key: bool
) -> None:
    for name, value in SDK_ENV.items():
        monkeypatch.setenv(name, value)
    keys = ModelKeys(openai=SecretStr(CANARY), anthropic=SecretStr(CANARY), base_urls=(fake.url, f"{fake.url}/v1"))
    ref = "default" if with_key else None
    fake.script(openai_reply("a"), anthropic_reply("b"))
    OpenAIProvider(keys, retry=FAST_RETRY)(
        OpenAIModelConfig(provider="openai", name="m", base_url=f"{fake.url}/v1", api_key_ref=ref), "team-a"
    ).complete(REQUEST)
    AnthropicProvider(keys, retry=FAST_RETRY)(
        AnthropicModelConfig(provider="anthropic", name="m", base_url=fake.url, api_key_ref=ref), "team-a"
    ).complete(REQUEST)

    sent_openai, sent_anthropic = fake.requests  # both came here, not to the environment's URLs
    assert sent_openai.headers.get("authorization") == (f"Bearer {CANARY}" if with_key else None)
    assert sent_anthropic.headers.get("x-api-key") == (CANARY if with_key else None)
    assert "authorization" not in sent_anthropic.headers
    everything = str([r.headers for r in fake.requests])
    assert all(value not in everything for name, value in SDK_ENV.items() if not name.endswith("_URL"))
    assert "env-canary" not in everything

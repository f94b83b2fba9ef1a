"""Webhooks, the pure parts: the signature and its check, the backoff schedule, which URLs
a run may name, and the settings that turn webhooks on."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import pytest
import standardwebhooks

from runtime.deps import build_runtime
from schema.wire.retry import RetryPolicy, backoff_s
from tests.support.api import TOKEN, error_of
from tests.support.requests import scripted_request
from worker.api import create_app
from worker.cli.main import main as cli_main
from worker.client import verify_webhook
from worker.client.context import ClientContext
from worker.ops.settings import Settings, SettingsError, get_settings, load_settings
from worker.ops.webhooks.policy import WebhookRefused, check_webhook_url, parse_prefixes, retry_delay_s, url_origin
from worker.ops.webhooks.signature import owner_secret, signature_header, standard_secret, standard_signature_header

SECRET = "whsec-0123456789abcdef"
BODY = b'{"run_id":"r","seq":3,"kind":"run_completed","data":{},"created_at":"2026-12-01T00:00:00Z"}'
T = 1_800_000_000


def test_the_signature_is_hmac_sha256_of_t_dot_body_in_the_documented_format() -> None:
    expected = hmac.new(SECRET.encode(), f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert signature_header(BODY, SECRET, T) == f"t={T},v1={expected}"


def test_a_good_signature_verifies() -> None:
    assert verify_webhook(BODY, signature_header(BODY, SECRET, T), SECRET, now=T + 10)


@pytest.mark.parametrize(
    ("body", "secret", "now", "why"),
    [
        (BODY.replace(b"completed", b"failed"), SECRET, T, "tampered body"),
        (BODY, "another-secret-0123456789", T, "wrong secret"),
        (BODY, SECRET, T + 301, "stale t"),
        (BODY, SECRET, T - 301, "t from the future"),
    ],
)
def test_a_bad_signature_does_not_verify(body: bytes, secret: str, now: int, why: str) -> None:
    assert not verify_webhook(body, signature_header(BODY, SECRET, T), secret, now=now), why


@pytest.mark.parametrize("header", ["", "v1=abc", f"t={T}", "t=soon,v1=00", "garbage"])
def test_a_malformed_header_does_not_verify(header: str) -> None:
    assert not verify_webhook(BODY, header, SECRET, now=T)


def test_a_changed_t_with_the_old_mac_does_not_verify() -> None:
    mac = signature_header(BODY, SECRET, T).split("v1=")[1]
    assert not verify_webhook(BODY, f"t={T + 1},v1={mac}", SECRET, now=T)


def test_the_standard_signature_verifies_with_the_standardwebhooks_library_keyed_by_the_same_bytes() -> None:
    now = int(time.time())  # the library checks the timestamp against its own clock
    headers = {"webhook-id": "42", "webhook-timestamp": str(now),
               "webhook-signature": standard_signature_header(BODY, SECRET, "42", now)}
    whsec = standard_secret(SECRET)
    assert whsec == "whsec_" + base64.b64encode(SECRET.encode()).decode()
    assert standardwebhooks.Webhook(whsec).verify(BODY, headers)["kind"] == "run_completed"
    assert standardwebhooks.Webhook(whsec).sign("42", datetime.fromtimestamp(now, UTC), BODY) == \
        headers["webhook-signature"]
    for body, hdrs, key in [(BODY + b" ", headers, whsec), (BODY, {**headers, "webhook-id": "43"}, whsec),
                            (BODY, headers, standard_secret("another-secret-0123456789"))]:
        with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
            standardwebhooks.Webhook(key).verify(body, hdrs)


def test_an_owners_secret_is_the_documented_hmac_of_the_master_and_differs_per_owner() -> None:
    expected = hmac.new(SECRET.encode(), b"aidawork-webhook-owner:team-a", hashlib.sha256).hexdigest()
    assert owner_secret(SECRET, "team-a") == expected
    assert owner_secret(SECRET, "team-b") != expected != owner_secret("another-secret-0123456789", "team-a")
    signed = signature_header(BODY, owner_secret(SECRET, "team-a"), T)
    assert verify_webhook(BODY, signed, owner_secret(SECRET, "team-a"), now=T)
    assert not verify_webhook(BODY, signed, owner_secret(SECRET, "team-b"), now=T)


def test_the_owner_webhook_secret_command_needs_the_master_secret(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def run(*argv: str) -> int:
        get_settings.cache_clear()  # the command reads the environment as set here
        try:
            return cli_main(list(argv))
        finally:
            get_settings.cache_clear()

    monkeypatch.delenv("AIDAWORK_WEBHOOK_SECRET", raising=False)
    monkeypatch.delenv("AIDAWORK_WEBHOOK_URLS", raising=False)
    assert run("owner", "webhook-secret", "team-a") == 2
    assert "AIDAWORK_WEBHOOK_SECRET is not set" in capsys.readouterr().err
    monkeypatch.setenv("AIDAWORK_WEBHOOK_SECRET", SECRET)
    assert run("owner", "webhook-secret", "team a") == 2
    assert cli_main(["owner", "webhook-secret", "team-a"]) == 0
    out = capsys.readouterr().out
    assert owner_secret(SECRET, "team-a") in out and standard_secret(owner_secret(SECRET, "team-a")) in out
    assert SECRET not in out


def test_the_backoff_doubles_to_its_cap_with_half_of_each_step_random() -> None:
    lows = [retry_delay_s(n, base_s=1, max_s=60, rand=lambda: 0.0) for n in range(1, 9)]
    highs = [retry_delay_s(n, base_s=1, max_s=60, rand=lambda: 1.0) for n in range(1, 9)]
    assert highs == [1, 2, 4, 8, 16, 32, 60, 60]
    assert lows == [h / 2 for h in highs]
    assert retry_delay_s(10_000, base_s=1, max_s=60, rand=lambda: 1.0) == 60  # no overflow
    # ... and it is the one backoff of the system, not a second one.
    policy = RetryPolicy(base_s=1, cap_s=60)
    for n, r in [(1, 0.3), (5, 0.9), (12, 0.5)]:
        draw = (lambda value: lambda: value)(r)
        assert retry_delay_s(n, base_s=1, max_s=60, rand=draw) == backoff_s(n, policy, draw)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/aidawork/run?token=abc",
        "https://hooks.example.com/aidawork/",
        "http://127.0.0.1:8099",
        "http://127.0.0.1:8099/x",
        "https://hooks.example.com/hook",
        "https://hooks.example.com/hook/a..b/.x",
        "https://hooks.example.com/hook?t=1",
    ],
)
def test_a_url_under_a_prefix_is_allowed(url: str) -> None:
    check_webhook_url(url, ["https://hooks.example.com/aidawork/", "http://127.0.0.1:8099",
                            "https://hooks.example.com/hook"])


@pytest.mark.parametrize(
    ("url", "prefixes", "problem"),
    [
        ("https://hooks.example.com/x", [], "not enabled here"),
        ("https://other.example.com/aidawork/", ["https://hooks.example.com/aidawork/"], "not under any"),
        ("https://hooks.example.com/other", ["https://hooks.example.com/aidawork/"], "not under any"),
        ("http://127.0.0.1:80991/", ["http://127.0.0.1:8099"], "invalid port"),
        ("https://hooks.example.com.evil.net/", ["https://hooks.example.com"], "not under any"),
        ("https://hooks.example.com@evil.net/", ["https://hooks.example.com"], "not under any"),
        ("ftp://hooks.example.com/", ["https://hooks.example.com"], "http:// or https://"),
        ("https://hooks.example.com/a b", ["https://hooks.example.com"], "spaces or control"),
        ("https:///path", ["https://"], "must name a host"),
        # A prefix is matched on path-segment boundaries ...
        ("https://hooks.example.com/hookevil", ["https://hooks.example.com/hook"], "not under any"),
        ("https://hooks.example.com/hook.x/", ["https://hooks.example.com/hook"], "not under any"),
        # ... and no dot segment may walk out of it (httpx would send /hook/../x as /x),
        # percent-encoded or not, nor a "." one.
        ("https://hooks.example.com/hook/../../internal", ["https://hooks.example.com/hook/"], "dot segment"),
        ("https://hooks.example.com/hook/%2e%2e/internal", ["https://hooks.example.com/hook/"], "dot segment"),
        ("https://hooks.example.com/hook/%2E./internal", ["https://hooks.example.com/hook"], "dot segment"),
        ("https://hooks.example.com/hook/..%2Finternal", ["https://hooks.example.com/hook"], "dot segment"),
        ("https://hooks.example.com/hook/..%5Cinternal", ["https://hooks.example.com/hook"], "dot segment"),
        ("https://hooks.example.com/hook/%252e%252e/x", ["https://hooks.example.com/hook"], "dot segment"),
        ("https://hooks.example.com/hook/./x", ["https://hooks.example.com/hook"], "dot segment"),
        ("https://hooks.example.com/hook/..", ["https://hooks.example.com/hook"], "dot segment"),
    ],
)
def test_a_refused_url_names_the_field_and_the_problem_not_the_url(url: str, prefixes: list[str],
                                                                   problem: str) -> None:
    with pytest.raises(WebhookRefused) as caught:
        check_webhook_url(url, prefixes)
    assert caught.value.field == "webhook.url"
    assert caught.value.code == "WEBHOOK_REFUSED"
    assert problem in caught.value.message
    assert url not in caught.value.message


def test_only_scheme_and_host_of_a_url_are_logged() -> None:
    assert url_origin("https://user:pw@hooks.example.com:8443/p?token=t") == "https://hooks.example.com"


def test_webhook_prefixes_must_be_http_urls() -> None:
    assert parse_prefixes(" https://a.example/x/ ,http://127.0.0.1:1 ,") == ["https://a.example/x/", "http://127.0.0.1:1"]
    with pytest.raises(ValueError, match="prefix #2 must be an http:// or https:// URL"):
        parse_prefixes("https://a.example/,file:///etc")


def test_webhook_urls_need_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_WEBHOOK_URLS", "https://hooks.example.com/")
    monkeypatch.delenv("AIDAWORK_WEBHOOK_SECRET", raising=False)
    with pytest.raises(SettingsError, match="AIDAWORK_WEBHOOK_SECRET must be set"):
        load_settings()
    monkeypatch.setenv("AIDAWORK_WEBHOOK_SECRET", SECRET)
    assert load_settings().webhook_prefixes == ["https://hooks.example.com/"]
    assert SECRET not in repr(Settings(webhook_urls="https://h.example/", webhook_secret=SECRET))


@pytest.mark.parametrize("url", ["https://evil.example.com/?t=secret",
                                 "https://hooks.example.com/hook/%2e%2e/internal?t=secret"])
def test_the_api_refuses_a_webhook_outside_the_prefixes_with_a_typed_422_before_the_store(url: str) -> None:
    settings = Settings(api_tokens=json.dumps({TOKEN: "team-test"}), webhook_urls="https://hooks.example.com/hook/",
                        webhook_secret=SECRET)

    class NoStore:  # the refusal comes before any of these is touched
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"a refused request reached {name}")

    context = ClientContext(settings=settings, engine=NoStore(), store=NoStore(), runtime=build_runtime(),
                            dispatch=NoStore())  # type: ignore[arg-type]
    app = create_app(settings, lambda: context)
    body = {**scripted_request([{"content": "x"}]), "webhook": {"url": url}}
    body.pop("root_id")

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
            return await http.post("/v1/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})

    response = anyio.run(go)
    assert response.status_code == 422
    error = error_of(response)
    assert (error["code"], error["field"]) == ("WEBHOOK_REFUSED", "webhook.url")
    assert "secret" not in error["message"]

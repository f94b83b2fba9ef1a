"""What the deliverer sends, against a real PostgreSQL and a loopback receiver: deliveries a
receiver can verify with the ``standardwebhooks`` library, signed with the run's owner's
key (another owner's secret does not verify them), and a URL that escapes its prefix is
refused at submit and never called by the deliverer."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import replace
from typing import Any

import httpx
import pytest
import standardwebhooks
from pydantic import SecretStr
from sqlalchemy import Engine

from runtime.prepare import prepare_execution
from schema.store import runs as run_store
from schema.store import webhooks as outbox
from schema.store.runs import Submitted
from tests.support.cluster import cli
from tests.support.db import rows
from tests.support.requests import scripted_request
from tests.support.store import RUNTIME
from tests.support.webhook_receiver import loopback_receiver
from worker import client
from worker.ops.webhooks.deliverer import Deliverer
from worker.ops.webhooks.policy import WebhookRefused

SECRET = "whsec-db-0123456789abcdef"


def cancelled_run(engine: Engine, url: str, owner: str = "team-test") -> Submitted:
    """A run whose webhook is ``url``, stored as is (no submit-time check), then cancelled:
    one due delivery."""
    request, prepared = prepare_execution(RUNTIME, scripted_request([{"content": "x"}], webhook_url=url,
                                                                    owner=owner))
    run = run_store.submit_run(engine, request, prepared.turn_config.model_dump(mode="json"))
    assert run_store.cancel_run(engine, run.run_id)[0]
    return run


def deliver_all(engine: Engine, ctx: Any, **settings: Any) -> None:
    s = ctx.settings.model_copy(update={"webhook_secret": SecretStr(SECRET), **settings})
    with httpx.Client(timeout=5) as http:
        deliverer = Deliverer(engine, s, http)
        for due in outbox.claim_due(engine, limit=10, lease_s=30):
            deliverer.attempt(due)


def test_a_delivery_verifies_with_the_standardwebhooks_library(engine: Engine, ctx: Any) -> None:
    with loopback_receiver() as receiver:
        run = cancelled_run(engine, f"{receiver.url}/hook")
        deliver_all(engine, ctx)
    (got,) = receiver.got
    # Built by hand as the README tells a receiver: the owner's secret, then its whsec_ form.
    secret = hmac.new(SECRET.encode(), b"aidawork-webhook-owner:team-test", hashlib.sha256).hexdigest()
    whsec = "whsec_" + base64.b64encode(secret.encode()).decode()
    parsed = standardwebhooks.Webhook(whsec).verify(got.body, got.headers)
    assert (parsed["run_id"], parsed["kind"]) == (str(run.run_id), "run_cancelled")
    (row,) = run_store.get_run_view(engine, run.run_id).webhooks
    assert got.headers["webhook-id"] == str(row.id) == got.headers["AIDAWORK-Delivery"]
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(whsec).verify(got.body + b" ", got.headers)


ESCAPES = ["/hook/../../internal", "/hook/%2e%2e/internal", "/hook/.%2E/internal", "/hook/..%2finternal",
           "/hook/./x", "/hookevil"]


@pytest.mark.parametrize("path", ESCAPES)
def test_a_url_escaping_its_prefix_is_refused_at_submit_with_nothing_stored(ctx: Any, db_url: str,
                                                                            path: str) -> None:
    prefix = "http://127.0.0.1:9/hook"
    hooked = replace(ctx, settings=ctx.settings.model_copy(
        update={"webhook_urls": prefix, "webhook_secret": SecretStr(SECRET)}))
    request = scripted_request([{"content": "x"}], webhook_url=f"http://127.0.0.1:9{path}")
    with pytest.raises(WebhookRefused) as caught:
        client.submit(request, ctx=hooked)
    assert (caught.value.code, caught.value.field) == ("WEBHOOK_REFUSED", "webhook.url")
    assert path not in caught.value.message
    done = cli(db_url, "submit", "-", stdin=json.dumps(request),
               env={"AIDAWORK_WEBHOOK_URLS": prefix, "AIDAWORK_WEBHOOK_SECRET": SECRET})
    assert done.returncode == 2, done.stderr
    assert "WEBHOOK_REFUSED" in done.stderr or "webhook.url" in done.stderr
    assert rows(ctx.engine, "SELECT count(*) AS n FROM runs")[0]["n"] == 0


@pytest.mark.parametrize("prefixes", ["", "{receiver}/hook"])
def test_the_deliverer_never_calls_a_stored_url_that_escapes_its_prefix(engine: Engine, ctx: Any,
                                                                       prefixes: str) -> None:
    with loopback_receiver() as receiver:
        runs = [cancelled_run(engine, f"{receiver.url}{path}") for path in ESCAPES[:-1]]
        deliver_all(engine, ctx, webhook_urls=prefixes.format(receiver=receiver.url))
    assert receiver.got == []
    for run in runs:
        (view,) = run_store.get_run_view(engine, run.run_id).webhooks
        assert view.status == "failed" and view.attempts == 1
        assert (view.last_error or "").startswith("WEBHOOK_REFUSED: ")


def owner_secrets(db_url: str, owner: str) -> dict[str, str]:
    done = cli(db_url, "owner", "webhook-secret", owner, "--json", env={"AIDAWORK_WEBHOOK_SECRET": SECRET})
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout
    shown: dict[str, str] = json.loads(done.stdout)
    return shown


def test_an_owners_delivery_verifies_with_its_own_secret_only(engine: Engine, ctx: Any, db_url: str) -> None:
    with loopback_receiver() as receiver:
        cancelled_run(engine, f"{receiver.url}/team-a", owner="team-a")
        cancelled_run(engine, f"{receiver.url}/team-b", owner="team-b")
        deliver_all(engine, ctx)
    secrets = {owner: owner_secrets(db_url, owner) for owner in ("team-a", "team-b")}
    assert secrets["team-a"]["owner"] == "team-a" and secrets["team-a"]["secret"] != secrets["team-b"]["secret"]
    got = {g.path.lstrip("/"): g for g in receiver.got}
    for owner, other in (("team-a", "team-b"), ("team-b", "team-a")):
        body, headers = got[owner].body, got[owner].headers
        assert json.loads(body)["owner"] == owner  # signed with the body
        signature = headers["AIDAWORK-Signature"]
        assert client.verify_webhook(body, signature, secrets[owner]["secret"])
        assert not client.verify_webhook(body, signature, secrets[other]["secret"])
        assert not client.verify_webhook(body, signature, SECRET)  # the master is not a receiver's secret
        assert standardwebhooks.Webhook(secrets[owner]["whsec"]).verify(body, headers)["owner"] == owner
        for wrong in (secrets[other]["whsec"], "whsec_" + base64.b64encode(SECRET.encode()).decode()):
            with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
                standardwebhooks.Webhook(wrong).verify(body, headers)

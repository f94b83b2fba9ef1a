"""One place makes every Redis client from the broker settings (worker.ops.redis_clients):
a ``sentinel://`` URL is Redis too, is parsed as kombu reads it, and needs its master's
name; a plain URL stays a plain client. Nothing here connects."""

from __future__ import annotations

import pytest
import redis
import redis.sentinel

from worker.ops.celery_app import broker_transport, redis_broker, transport_options
from worker.ops.redis_clients import RedisTarget, parse_sentinel_url, redis_target, redis_url, sync_client
from worker.ops.settings import Settings, SettingsError, load_settings

URL = "sentinel://:secret@10.0.0.1:26379/2;sentinel://10.0.0.2;sentinel://10.0.0.3:26380/2"


def test_plain_and_sentinel_urls_are_both_redis_brokers() -> None:
    assert redis_url("redis://h:6379/0") and redis_url("rediss://h/0") and redis_url(URL)
    assert not redis_url("amqp://guest@h//")
    assert redis_broker(Settings(broker_url=URL, sentinel_master="m"))


def test_a_sentinel_url_names_every_sentinel_and_the_masters_database_and_password() -> None:
    found = parse_sentinel_url(URL)
    assert found.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26380))
    assert (found.db, found.username, found.password) == (2, None, "secret")


@pytest.mark.parametrize("bad", ["sentinel://", "redis://h:6379;sentinel://h2", "sentinel://h/x"])
def test_a_malformed_sentinel_url_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_sentinel_url(bad)


def test_a_sentinel_url_without_a_master_name_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_BROKER_URL", URL)
    monkeypatch.delenv("AIDAWORK_SENTINEL_MASTER", raising=False)
    with pytest.raises(SettingsError, match="AIDAWORK_SENTINEL_MASTER"):
        load_settings()
    monkeypatch.setenv("AIDAWORK_SENTINEL_MASTER", "mymaster")
    assert load_settings().sentinel_master == "mymaster"


def test_clients_follow_the_master_through_the_sentinels_or_the_plain_url() -> None:
    settings = Settings(broker_url=URL, sentinel_master="mymaster", sentinel_timeout_s=0.5)
    target = redis_target(settings)
    assert target == RedisTarget(URL, "mymaster", 0.5)
    pool = sync_client(target, socket_timeout=2.0).connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert (pool.service_name, pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (
        "mymaster", 2, "secret")
    assert not isinstance(sync_client("redis://127.0.0.1:6379/3").connection_pool,
                          redis.sentinel.SentinelConnectionPool)
    assert redis_target(Settings(broker_url="amqp://guest@h//")) is None


def test_the_celery_app_gets_the_sentinel_transport_and_the_master_name() -> None:
    settings = Settings(broker_url=URL, sentinel_master="mymaster")
    assert broker_transport(settings, fast=True) == "worker.engine.broker:SentinelTransport"
    assert broker_transport(settings, fast=False) is None  # kombu's own for sentinel://
    assert broker_transport(Settings(broker_url="redis://h/0"), fast=True) == "worker.engine.broker:Transport"
    options = transport_options(settings)
    assert options["master_name"] == "mymaster"
    assert "master_name" not in transport_options(Settings(broker_url="redis://h/0"))

"""The db tier runs without Redis: a connection to Redis from any of its tests fails that
test (CI runs the whole suite with Redis up, so a closed port alone would prove nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis.connection
import redis.exceptions


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    attempts: list[str] = []

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        attempts.append(f"{getattr(self, 'host', '?')}:{getattr(self, 'port', '?')}")
        # What a closed port answers, so the code under test behaves as without Redis.
        raise redis.exceptions.ConnectionError("the db tier has no Redis")

    monkeypatch.setattr(redis.connection.AbstractConnection, "connect", refuse)
    yield attempts
    assert attempts == [], f"a db-tier test connected to Redis ({attempts}): the db tier must not need it"

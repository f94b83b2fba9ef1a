"""Fixtures of the unit tests: no services, no sockets but loopback ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.providers import FakeProvider


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    """A loopback provider server that answers from a script (``fake.script(...)``)."""
    server = FakeProvider()
    yield server
    server.close()

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


@pytest.fixture(autouse=True)
def _cli_leaves_logging_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command run in process (``cli.main``) would set the process's logging up for the
    tests after it (a client command at WARNING): structlog caches each logger, level
    included, at first use, so later tests' INFO lines would vanish. worker.ops.logging has its
    own tests."""
    import worker.cli.main

    monkeypatch.setattr(worker.cli.main, "configure_logging", lambda *_, **__: None)

"""The Celery app's choice of transport and consumer (worker.ops.celery_app): aidawork's
fast paths, which override private kombu and Celery methods, only with the versions they
were tested with (the same ranges pyproject.toml pins) and not with AIDAWORK_STOCK_BROKER;
and task events off until a monitor turns them on. No broker is contacted."""

from __future__ import annotations

import re
import tomllib

import pytest
import structlog

from tests.support.env import REPO
from worker.ops import celery_app
from worker.ops.settings import Settings

REDIS = "redis://127.0.0.1:6379/0"
FAST = ("worker.engine.broker:Transport", "worker.engine.consumer:Consumer")
STOCK = (None, "celery.worker.consumer:Consumer")


def _choice(settings: Settings) -> tuple[object, object]:
    conf = celery_app.create_app(settings).conf
    return conf.broker_transport, conf.worker_consumer


def test_the_fast_paths_by_default_and_the_stock_classes_with_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(celery_app, "installed_version", lambda package: "5.7.0")
    assert _choice(Settings(broker_url=REDIS)) == FAST
    with structlog.testing.capture_logs() as logs:
        assert _choice(Settings(broker_url=REDIS, stock_broker=True)) == STOCK
    assert logs == []  # chosen, not a fallback: nothing to warn about


def test_the_switch_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIDAWORK_STOCK_BROKER", "true")
    assert Settings(broker_url=REDIS).stock_broker is True
    monkeypatch.setenv("AIDAWORK_STOCK_BROKER", "false")
    assert Settings(broker_url=REDIS).stock_broker is False


@pytest.mark.parametrize(("package", "version"), [("kombu", "5.8.0"), ("celery", "5.6.2"), ("kombu", "5.8.0rc1"),
                                                  ("celery", "6.0.0")])
def test_an_untested_kombu_or_celery_falls_back_to_the_stock_classes_with_a_warning(
    package: str, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(celery_app, "installed_version", lambda name: version if name == package else "5.7.3")
    with structlog.testing.capture_logs() as logs:
        assert _choice(Settings(broker_url=REDIS)) == STOCK
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["event"] == "broker_overrides_disabled"
    assert warning["installed"] == {package: version}
    assert warning["tested"] == {"kombu": ">=5.7,<5.8", "celery": ">=5.7,<5.8"}


def test_the_installed_versions_are_the_tested_ones() -> None:
    """This environment runs the fast paths: a test run on other versions would test the
    stock classes only, without saying so."""
    assert celery_app.untested_versions() == {}


def test_pyproject_pins_kombu_and_celery_to_the_tested_ranges() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for package, (lowest, below) in celery_app.TESTED.items():
        (spec,) = [s for s in project["dependencies"] if re.match(rf"{package}(\[[^]]*\])?[<>=]", s)]
        low, high = ".".join(map(str, lowest)), ".".join(map(str, below))
        assert re.sub(r"^[a-z]+(\[[^]]*\])?", "", spec) == f">={low},<{high}", spec


def test_task_events_are_off_until_a_monitor_turns_them_on() -> None:
    conf = celery_app.create_app(Settings(broker_url=REDIS)).conf
    assert conf.worker_send_task_events is False
    assert conf.task_send_sent_event is False

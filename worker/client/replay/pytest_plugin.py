"""A pytest plugin that makes a folder of exported cases (``aidawork export RUN >
NAME.case.json``) a regression suite: each ``*.case.json`` file is one test, which passes
when its replay with the recorded model is ``same`` in every round (the tools run for real
in this process, against this code); its failure message is the replay's report.

Activate it with ``pytest -p worker.client.replay.pytest_plugin`` (or ``pytest_plugins =
["worker.client.replay.pytest_plugin"]`` in a conftest.py). It reads the deployment's settings
from the environment as ``aidawork replay`` does: ``AIDAWORK_PLUGINS`` for the tools,
``AIDAWORK_SECRET_KEY`` to verify the proofs. ``--aidawork-config PATH`` replays every case
with that run config (JSON) instead of each run's own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CASE_SUFFIX = ".case.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aidawork", "AIDAWORK: exported cases (*.case.json) as tests")
    group.addoption("--aidawork-config", metavar="PATH", default=None,
                    help="replay every case with this run config (a JSON object) instead of the run's own")


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    if file_path.name.endswith(CASE_SUFFIX):
        collected: pytest.Collector = CaseFile.from_parent(parent, path=file_path)
        return collected
    return None


class CaseFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        yield CaseItem.from_parent(self, name=self.path.name.removesuffix(CASE_SUFFIX))


class CaseReplayFailed(Exception):
    """The replay found a round that is not the same (its report says which and why)."""


_runtime_key = pytest.StashKey[Any]()


class CaseItem(pytest.Item):
    def runtest(self) -> None:
        from worker.client.replay.session import load_verified, replay_verified

        settings, runtime = self._deployment()
        config = self._config()
        case, verified = load_verified(self.path, settings)
        report = replay_verified(case, verified, runtime, config=config, model="recorded", tools="live")
        if not report.ok:
            raise CaseReplayFailed(report.text())

    def _deployment(self) -> Any:
        """The settings and runtime (tools, plugins), built once per session."""
        stash = self.config.stash
        if _runtime_key not in stash:
            from worker.client.context import runtime_for
            from worker.ops.settings import get_settings

            settings = get_settings()
            stash[_runtime_key] = (settings, runtime_for(settings))
        return stash[_runtime_key]

    def _config(self) -> dict[str, Any] | None:
        path = self.config.getoption("aidawork_config")
        if path is None:
            return None
        config = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise pytest.UsageError(f"--aidawork-config {path}: a run config must be a JSON object")
        return config

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from runtime.errors import AidaworkError

        if isinstance(excinfo.value, CaseReplayFailed):
            return str(excinfo.value)
        if isinstance(excinfo.value, AidaworkError):  # a case that does not verify, a config that does not validate
            return f"{excinfo.value.code}: {excinfo.value.message}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"replay of {self.path.name}"

"""Logging and process conventions that need no services: an exception nobody caught and
a Python warning are JSON lines; a long-running command refused at start says why in a
JSON line; ``aidawork --version`` is the installed package's version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version

import pytest

from tests.support.env import REPO
from worker.cli import main as cli
from worker.ops.settings import Settings, SettingsError, load_settings

UNCAUGHT = """
import threading, warnings
from worker.ops.logging import configure_logging
configure_logging("INFO")
warnings.warn("a captured warning")
thread = threading.Thread(target=lambda: 1 / 0, name="side")
thread.start()
thread.join()
raise RuntimeError("nobody caught this")
"""


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIDAWORK_")}
    return subprocess.run([sys.executable, *code.split("\0")], cwd=REPO, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60)


def test_uncaught_exceptions_and_warnings_are_json_lines() -> None:
    done = _python(f"-c\0{UNCAUGHT}")
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line parses
    assert [(e["logger"], e["level"]) for e in lines] == [
        ("py.warnings", "warning"),
        ("aidawork", "critical"),
        ("aidawork", "critical"),
    ]
    assert "a captured warning" in lines[0]["event"]
    side, main = lines[1], lines[2]
    assert (side["event"], side["error"], side["thread"]) == ("exception_uncaught", "ZeroDivisionError", "side")
    assert (main["event"], main["error"]) == ("exception_uncaught", "RuntimeError")
    assert "nobody caught this" in main["exception"]


def test_a_process_refused_at_start_says_why_in_one_json_line() -> None:
    done = _python("-m\0worker.cli\0worker", {"AIDAWORK_LOG_LEVEL": "LOUD"})
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    refused = json.loads(line)
    assert (refused["event"], refused["command"], refused["level"]) == ("start_refused", "worker", "error")
    assert refused["error"].startswith("invalid configuration: AIDAWORK_LOG_LEVEL:")
    assert done.stdout == ""


def test_the_webhook_deliverer_without_its_secret_refuses_in_one_json_line() -> None:
    done = _python("-m\0worker.cli\0webhooks")
    assert done.returncode == 2
    *_, refused = [json.loads(line) for line in done.stderr.splitlines()]  # after plugins_loaded
    assert (refused["event"], refused["command"], refused["level"]) == ("start_refused", "webhooks", "error")
    assert refused["error"].startswith("AIDAWORK_WEBHOOK_SECRET is not set")
    assert done.stdout == ""


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"aidawork {version('aidawork')}\n"


def test_worker_name_and_flower_auth_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().worker_name == "aidawork@%h"
    monkeypatch.setenv("AIDAWORK_WORKER_NAME", "no-at-sign")
    with pytest.raises(SettingsError, match="AIDAWORK_WORKER_NAME"):
        load_settings()
    monkeypatch.setenv("AIDAWORK_WORKER_NAME", "w2@%h")
    monkeypatch.setenv("AIDAWORK_FLOWER_BASIC_AUTH", "admin-without-password")
    with pytest.raises(SettingsError, match=r"AIDAWORK_FLOWER_BASIC_AUTH: .*user:password") as refused:
        load_settings()
    assert "admin-without-password" not in str(refused.value)  # a secret is never echoed
    monkeypatch.setenv("AIDAWORK_FLOWER_BASIC_AUTH", "admin:s3cret,ops:other")
    assert load_settings().worker_name == "w2@%h"


def test_celerys_per_task_lines_only_at_debug() -> None:
    import logging

    from worker.ops.logging import CELERY_PER_TASK_LOGGERS, configure_logging

    try:
        for level, expected in (("INFO", logging.WARNING), ("DEBUG", logging.DEBUG), ("ERROR", logging.ERROR)):
            configure_logging(level)
            assert [logging.getLogger(n).getEffectiveLevel() for n in CELERY_PER_TASK_LOGGERS] == [expected] * 2
    finally:
        configure_logging("INFO")

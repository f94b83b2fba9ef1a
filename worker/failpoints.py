"""Crash injection for tests: ``AIDAWORK_FAILPOINTS=after_commit`` makes the process die
(``os._exit``, like SIGKILL: no cleanup, no ack) the first time it reaches that point.
Unset in production, where ``hit`` is a set lookup."""

from __future__ import annotations

import os

import structlog

from worker.settings import get_settings

EXIT_CODE = 86


def hit(name: str) -> None:
    if name in get_settings().failpoint_set:
        structlog.get_logger("aidawork.failpoint").warning("failpoint_hit", failpoint=name)
        os._exit(EXIT_CODE)

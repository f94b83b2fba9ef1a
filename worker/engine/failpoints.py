"""Crash injection for tests: ``AIDAWORK_FAILPOINTS=after_commit`` makes the process die
(``os._exit``, like SIGKILL: no cleanup, no ack) the first time it reaches that point;
``after_model_call@team-poison`` only in a round of a run of that owner, so one run can be
made a poison round while the other runs on the same workers stay healthy.
``in_model_call`` is where the model call is on the ledger ('started') and about to be
sent: dying there is dying with the call on the wire, so the round's next holder calls the
model again (a duplicate call). ``after_model_call`` is where the round has its model
response, from its call or (a round redone after its holder died) from the ledger, and no
tool has run yet.
Unset in production, where ``hit`` is a set lookup."""

from __future__ import annotations

import os

import structlog

from worker.ops.settings import get_settings

EXIT_CODE = 86


def hit(name: str, *, owner: str | None = None) -> None:
    armed = get_settings().failpoint_set
    if name in armed or (owner is not None and f"{name}@{owner}" in armed):
        structlog.get_logger("aidawork.failpoint").warning("failpoint_hit", failpoint=name, owner=owner)
        os._exit(EXIT_CODE)

"""The waits answered about the call itself are one vocabulary: the core shows the call's
args in their events, the store in a run's waits and takes an answer for each of them."""

from __future__ import annotations

from typing import get_args

from runtime.tools.calls import SuspensionKind
from schema.store.suspensions import ANSWERS_FOR
from schema.wire.vocab import ANSWERED_WAITS


def test_the_answered_waits_are_suspension_kinds_and_each_takes_answers() -> None:
    assert ANSWERED_WAITS.issubset(get_args(SuspensionKind))
    assert set(ANSWERS_FOR) == ANSWERED_WAITS
    assert all(ANSWERS_FOR[kind] for kind in ANSWERED_WAITS)

"""Where a run's rounds are sent: the facts fair share and priorities route by.

A ``Route`` is read by the statements that hand a run to a sender (the claim, submit,
the reconciler's pass, the reads of cold paths) and given to the dispatcher with every
send, so every send of a run routes the same way (``runtime.shares``)."""

from __future__ import annotations

from dataclasses import dataclass

MIN_PRIORITY = 0
MAX_PRIORITY = 9  # the most urgent
DEFAULT_PRIORITY = 5
DEFAULT_WEIGHT = 1  # an owner without a row in ``owners``


@dataclass(frozen=True)
class Route:
    owner: str
    weight: int = DEFAULT_WEIGHT  # owners.weight, 1..1000
    priority: int = DEFAULT_PRIORITY  # runs.priority, 0..9, 9 the most urgent

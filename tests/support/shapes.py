"""JSON values built to a given depth, for the limits on nesting."""

from __future__ import annotations

from typing import Any


def nested_lists(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value



def nested_objects(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value

"""The JSON values of the wire and the store, typed: ``JsonValue`` is pydantic's recursive
alias (a dict of str to JsonValue, a list of JsonValue, str, int, float, bool or None), so
mypy follows a value into its members; ``JsonObject`` is the shape of a JSON object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from pydantic import JsonValue

JsonObject: TypeAlias = dict[str, JsonValue]
# What a function only reads: covariant, so a dict[str, str] is one.
JsonMapping: TypeAlias = Mapping[str, JsonValue]

__all__ = ["JsonMapping", "JsonObject", "JsonValue"]

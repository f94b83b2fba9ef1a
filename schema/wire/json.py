"""The JSON values of the wire and the store, typed: ``JsonValue`` is pydantic's recursive
alias (a dict of str to JsonValue, a list of JsonValue, str, int, float, bool or None), so
mypy follows a value into its members; ``JsonObject`` is the shape of a JSON object.

``JsonField`` is a ``JsonValue`` field of a pydantic model: typed for mypy, but validated
and serialized by pydantic as any value, as the wire has always been. Pydantic's own
``JsonValue`` check would stop at 254 levels, and refuse a tuple or an unpaired surrogate
in its own words, before ``runtime.canonical.json_problem`` names the problem (what
the API answers, and the store refuses, stays decided there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, TypeAlias

from pydantic import GetPydanticSchema, JsonValue

JsonObject: TypeAlias = dict[str, JsonValue]
# What a function only reads: covariant, so a dict[str, str] is one.
JsonMapping: TypeAlias = Mapping[str, JsonValue]
# Only mypy sees JsonValue: pydantic builds the schema of an unchecked value (``object``).
JsonField: TypeAlias = Annotated[JsonValue, GetPydanticSchema(lambda _source, handler: handler(object))]
JsonObjectField: TypeAlias = dict[str, JsonField]

__all__ = ["JsonField", "JsonMapping", "JsonObject", "JsonObjectField", "JsonValue"]

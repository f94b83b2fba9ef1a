"""canonical_json / digest / chain_digest: the properties every proof relies on."""

from __future__ import annotations

import hashlib
import json
import random
from decimal import Decimal
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from runtime.canonical import canonical_json, chain_digest, digest

SAFE_INT = 2**53 - 1  # integral floats below 2**53 are documented to canonicalize as ints

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=25,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, min_size=2, max_size=6)
hex_digests = st.binary(min_size=1, max_size=16).map(lambda b: hashlib.sha256(b).hexdigest())


def reorder(value: Any, rnd: random.Random) -> Any:
    """The same value with every dict's insertion order shuffled (recursively)."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: reorder(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [reorder(v, rnd) for v in value]
    return value


def floats_to_ints_where_integral(value: Any) -> Any:
    """What the module doc promises: integral numbers become ints, a float taken at its
    shortest decimal form (1e16 -> 10000000000000000, as jsonb gives it back)."""
    if isinstance(value, float) and value.is_integer():
        return int(Decimal(repr(value)))
    if isinstance(value, dict):
        return {k: floats_to_ints_where_integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [floats_to_ints_where_integral(v) for v in value]
    return value


def has_integral_float(value: Any) -> bool:
    if isinstance(value, float):
        return value.is_integer() and abs(value) <= SAFE_INT
    if isinstance(value, dict):
        return any(has_integral_float(v) for v in value.values())
    if isinstance(value, list):
        return any(has_integral_float(v) for v in value)
    return False


@settings(deadline=None)
@given(json_objects, st.randoms(use_true_random=False))
def test_key_order_does_not_change_canonical_json_or_digest(value: dict[str, Any], rnd: random.Random) -> None:
    shuffled = reorder(value, rnd)
    assert canonical_json(shuffled) == canonical_json(value)
    assert digest(shuffled) == digest(value)


def test_key_order_example_reversed_keys_same_digest() -> None:
    assert digest({"b": 1, "a": {"y": 2, "x": 3}}) == digest({"a": {"x": 3, "y": 2}, "b": 1})
    assert canonical_json({"b": 1, "a": 2}) == '{"a":2,"b":1}'


@settings(deadline=None)
@given(st.integers(min_value=-SAFE_INT, max_value=SAFE_INT))
def test_integral_floats_digest_like_ints(n: int) -> None:
    assert canonical_json(float(n)) == canonical_json(n) == str(n)
    assert digest(float(n)) == digest(n)
    assert digest({"x": [float(n)], "y": {"z": float(n)}}) == digest({"x": [n], "y": {"z": n}})


def test_two_point_zero_is_written_as_two() -> None:
    assert canonical_json({"sum": 2.0}) == '{"sum":2}'
    assert digest(2.0) == digest(2)
    # A fractional float stays a float and therefore has another digest.
    assert canonical_json(2.5) == "2.5"
    assert digest(2.5) != digest(2)


@settings(deadline=None)
@given(json_values)
def test_canonical_json_round_trips_to_the_normalized_value(value: Any) -> None:
    text = canonical_json(value)
    loaded = json.loads(text)
    assert loaded == floats_to_ints_where_integral(value)
    # No integral float survives: 2.0 comes back as the int 2.
    assert not has_integral_float(loaded)
    # Canonical form is a fixed point.
    assert canonical_json(loaded) == text
    assert digest(loaded) == digest(value)


def test_canonical_json_has_no_whitespace_and_keeps_non_ascii() -> None:
    assert canonical_json({"k": ["é", 1, None, True]}) == '{"k":["é",1,null,true]}'
    assert canonical_json((1, 2)) == canonical_json([1, 2])


@settings(deadline=None)
@given(hex_digests, json_values, json_values)
def test_chain_digest_depends_on_order(previous: str, a: Any, b: Any) -> None:
    assume(canonical_json(a) != canonical_json(b))
    ab = chain_digest(chain_digest(previous, a), b)
    ba = chain_digest(chain_digest(previous, b), a)
    assert ab != ba


@settings(deadline=None)
@given(hex_digests, hex_digests, json_values)
def test_chain_digest_depends_on_the_previous_digest(p1: str, p2: str, value: Any) -> None:
    assume(p1 != p2)
    assert chain_digest(p1, value) != chain_digest(p2, value)


@settings(deadline=None)
@given(hex_digests, json_values, st.randoms(use_true_random=False))
def test_chain_digest_is_canonical_in_its_value(previous: str, value: Any, rnd: random.Random) -> None:
    assert chain_digest(previous, reorder(value, rnd)) == chain_digest(previous, value)
    assert chain_digest(previous, value) == hashlib.sha256(f"{previous}\n{canonical_json(value)}".encode()).hexdigest()


def test_chain_from_empty_differs_from_plain_digest() -> None:
    value = {"role": "user", "content": "hi"}
    assert chain_digest("", value) != digest(value)
    assert len(chain_digest("", value)) == 64

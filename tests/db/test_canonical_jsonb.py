"""The digest of a value does not change when the value goes through a jsonb column:
the stored messages are re-read by other workers, which must get the same digests."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from runtime.canonical import digest

# jsonb cannot store NUL; the project refuses such values before storing (json_problem).
NO_NUL = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
numbers = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e16, 1.5e300, 2.0**53 + 2, 0.1, -0.0, 1e-7, 123456789012345678.0]),
)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, st.text(NO_NUL, max_size=20)),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(NO_NUL, max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def test_digests_survive_a_jsonb_round_trip(engine: Engine) -> None:
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")

        @settings(max_examples=300, deadline=None)
        @given(values)
        def check(value: Any) -> None:
            stored = conn.execute(text("SELECT CAST(:v AS jsonb)"), {"v": json.dumps(value)}).scalar_one()
            assert digest(stored) == digest(value)

        check()


def test_values_at_the_depth_and_digit_limits_survive_jsonb_with_the_same_digest(engine: Engine) -> None:
    from runtime.canonical import MAX_INT_DIGITS, MAX_RESULT_DEPTH, json_problem

    big = 10**MAX_INT_DIGITS - 1
    value: Any = {"n": [big, -big], "s": "é"}
    for level in range(MAX_RESULT_DEPTH - 2):
        value = {"k": value} if level % 2 else [value]
    assert json_problem(value, max_depth=MAX_RESULT_DEPTH) is None
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT CAST(:v AS jsonb)"), {"v": json.dumps(value)}).scalar_one()
    assert stored == value
    assert digest(stored) == digest(value)

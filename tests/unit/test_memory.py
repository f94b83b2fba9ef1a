"""ContextCache (bounded LRU of RunState) and RunState.extended."""

from __future__ import annotations

import uuid

from runtime.canonical import chain_digest
from runtime.memory import ContextCache
from runtime.messages import Message, user_message
from runtime.state import RunState


def memory(run_id: uuid.UUID | None = None, *, n: int = 1, last_position: int | None = None) -> RunState:
    history = tuple(user_message(f"m{i}") for i in range(n))
    digest = ""
    for m in history:
        digest = chain_digest(digest, m.to_json())
    return RunState(
        run_id=run_id or uuid.uuid4(),
        input="go",
        history=history,
        last_position=n - 1 if last_position is None else last_position,
        history_digest=digest,
    )


def test_cache_evicts_the_least_recently_used_entry_at_capacity() -> None:
    cache = ContextCache(capacity=2)
    a, b, c = memory(), memory(), memory()
    cache.put(a)
    cache.put(b)
    cache.put(c)

    assert len(cache) == 2
    assert cache.get(a.run_id) is None
    assert cache.get(b.run_id) is b
    assert cache.get(c.run_id) is c


def test_get_moves_the_entry_to_the_most_recently_used_end() -> None:
    cache = ContextCache(capacity=2)
    a, b, c = memory(), memory(), memory()
    cache.put(a)
    cache.put(b)
    assert cache.get(a.run_id) is a
    cache.put(c)

    assert cache.get(b.run_id) is None
    assert cache.get(a.run_id) is a
    assert cache.get(c.run_id) is c


def test_put_of_an_existing_entry_refreshes_its_recency() -> None:
    cache = ContextCache(capacity=2)
    a, b = memory(), memory()
    cache.put(a)
    cache.put(b)
    a2 = memory(a.run_id, n=3)
    cache.put(a2)
    cache.put(memory())

    assert cache.get(b.run_id) is None
    assert cache.get(a.run_id) is a2


def test_get_of_an_unknown_run_is_none_and_does_not_change_the_cache() -> None:
    cache = ContextCache(capacity=2)
    a = memory()
    cache.put(a)

    assert cache.get(uuid.uuid4()) is None
    assert len(cache) == 1


def test_put_never_replaces_a_longer_history_with_a_shorter_one() -> None:
    cache = ContextCache()
    run_id = uuid.uuid4()
    longer = memory(run_id, n=5)
    shorter = memory(run_id, n=2)
    cache.put(longer)
    cache.put(shorter)

    assert cache.get(run_id) is longer
    assert len(cache) == 1


def test_put_replaces_a_shorter_history_with_a_longer_one() -> None:
    cache = ContextCache()
    run_id = uuid.uuid4()
    shorter = memory(run_id, n=2)
    longer = memory(run_id, n=5)
    cache.put(shorter)
    cache.put(longer)

    assert cache.get(run_id) is longer


def test_discard_removes_the_entry_and_ignores_unknown_runs() -> None:
    cache = ContextCache()
    a, b = memory(), memory()
    cache.put(a)
    cache.put(b)
    cache.discard(a.run_id)
    cache.discard(uuid.uuid4())

    assert cache.get(a.run_id) is None
    assert cache.get(b.run_id) is b
    assert len(cache) == 1


def test_a_discarded_run_can_be_cached_again_from_scratch() -> None:
    cache = ContextCache()
    run_id = uuid.uuid4()
    cache.put(memory(run_id, n=5))
    cache.discard(run_id)
    fresh = memory(run_id, n=1)
    cache.put(fresh)

    assert cache.get(run_id) is fresh


def test_extended_appends_messages_and_takes_the_new_position_and_digest() -> None:
    base = memory(n=2)
    new = (Message(role="assistant", content="ok"), user_message("more"))
    digest = chain_digest(chain_digest(base.history_digest, new[0].to_json()), new[1].to_json())
    grown = base.extended(new, last_position=9, history_digest=digest)

    assert grown.history == base.history + new
    assert grown.last_position == 9
    assert grown.history_digest == digest
    assert (grown.run_id, grown.input, grown.deps) == (base.run_id, base.input, base.deps)
    # The original is untouched (frozen).
    assert len(base.history) == 2 and base.last_position == 1


def test_extended_with_no_messages_returns_the_same_memory() -> None:
    base = memory(n=2)

    assert base.extended((), last_position=99, history_digest="other") is base


def test_an_extended_memory_replaces_its_origin_in_the_cache() -> None:
    cache = ContextCache()
    base = memory(n=2)
    cache.put(base)
    grown = base.extended((user_message("x"),), last_position=2, history_digest="d")
    cache.put(grown)
    cache.put(base)  # a stale writer loses

    assert cache.get(base.run_id) is grown

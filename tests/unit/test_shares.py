"""Fair share and priorities as a routing rule (runtime.shares) and the broker's key order
(worker.engine.broker): which queue a round goes to, at which priority, and that every send of
the worker shell routes by the run's owner, weight and priority."""

from __future__ import annotations

from collections import Counter
from uuid import UUID, uuid4

import pytest

from runtime.shares import broker_priority, owner_queues, queue_index
from schema.wire.route import Route
from tests.support.shell import RoundTask, execute_round, shell
from worker.engine.broker import brpop_keys
from worker.engine.round import RoundDisposition

RUN = UUID("00000000-0000-4000-8000-000000000001")

def test_the_queue_of_a_round_is_the_same_in_every_process() -> None:
    # crc32, not Python's salted hash(): these values hold under any PYTHONHASHSEED.
    assert owner_queues("team-a", 1, 16) == [13]
    assert owner_queues("team-a", 3, 16) == [13, 14, 15]
    assert queue_index(Route("team-a", 3), RUN, 0, 16) == queue_index(Route("team-a", 3), RUN, 0, 16)
    assert [queue_index(Route("team-a", 3), RUN, b, 16) for b in range(4)] == [15, 13, 14, 15]

def test_an_owner_of_weight_w_spreads_its_rounds_over_w_distinct_queues() -> None:
    runs = [uuid4() for _ in range(300)]
    used = Counter(queue_index(Route("team-b", 4), r, 0, 16) for r in runs)
    assert set(used) == set(owner_queues("team-b", 4, 16)) and len(used) == 4
    assert min(used.values()) > 40  # about 75 each: none left idle
    # The rounds of one run walk the owner's queues, so a long run does not sit in one.
    assert {queue_index(Route("team-b", 4), runs[0], b, 16) for b in range(4)} == set(used)

def test_weight_one_keeps_every_round_of_the_owner_on_one_queue() -> None:
    assert {queue_index(Route("team-c"), uuid4(), b, 16) for b in range(5)} == set(owner_queues("team-c", 1, 16))

def test_a_weight_above_the_queue_count_uses_every_queue_once() -> None:
    assert sorted(owner_queues("team-d", 1000, 8)) == list(range(8))
    assert owner_queues("team-d", 5, 1) == [0]

@pytest.mark.parametrize(("priority", "expected"), [(9, 0), (5, 4), (0, 9), (12, 0), (-3, 9)])
def test_the_most_urgent_priority_is_the_broker_step_served_first(priority: int, expected: int) -> None:
    # kombu's Redis transport pops a queue's lowest step first; out-of-range values clamp.
    assert broker_priority(priority) == expected

def test_brpop_lists_each_queue_with_all_its_priorities_before_the_next_queue() -> None:
    # Queue first: a queue's urgent message waits for that queue's turn instead of jumping
    # every other queue's (kombu lists priority first, across queues).
    keys = brpop_keys(["q.1", "q.0"], [0, 5, 9], lambda q, p: f"{q}/{p}")
    assert keys == ["q.1/0", "q.1/5", "q.1/9", "q.0/0", "q.0/5", "q.0/9"]

ADD = [{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"content": "5"}]

def test_the_next_round_is_sent_with_the_claims_weight_and_the_runs_priority() -> None:
    s = shell()
    s.store.weights["team-test"] = 3
    run_id = s.submit(ADD, priority=8)

    assert execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0)) is RoundDisposition.COMMITTED
    (sent,) = s.dispatch.sent
    assert (sent.boundary_seq, sent.route) == (1, Route("team-test", 3, 8))

def test_a_roots_next_run_is_sent_with_its_own_priority() -> None:
    s = shell()
    first = s.submit([{"content": "one"}], priority=2)
    second = s.submit([{"content": "two"}], root_id=str(s.store.runs[first].root_id), priority=9)

    assert execute_round(s.ctx, RoundTask(run_id=first, boundary_seq=0)) is RoundDisposition.COMMITTED
    (sent,) = s.dispatch.sent
    assert (sent.run_id, sent.boundary_seq, sent.route) == (second, 0, Route("team-test", 1, 9))


def test_the_cli_refuses_a_priority_out_of_range_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from worker.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["submit", "--priority", "12", "request.json"])
    assert exited.value.code == 2
    assert "--priority" in capsys.readouterr().err

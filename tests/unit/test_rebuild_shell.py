"""The worker shell of a context rebuild (``worker.engine.rebuild``, run from ``worker.engine.round``)
on the in-memory store: the chain reservation, the candidate and the admission, with the
core's real rules (``runtime.rebuild``) passed in as the store takes them. The db tier
proves the store's side (tests/db/test_rebuilds.py), the e2e tier the whole
(tests/e2e/test_rebuild_e2e.py)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from runtime.rebuild import RebuildSourceChanged
from schema.wire import RoundTask
from tests.support.shell import Shell, shell
from worker.engine import rebuild as rebuild_module
from worker.engine.round import execute_round


def report(i: int) -> dict[str, Any]:
    return {"tool_calls": [{"name": "echo", "args": {"report": f"region {i}: " + "figures and notes " * 6}}]}


def limited(s: Shell, turns: list[dict[str, Any]], limit: int) -> UUID:
    run_id = s.submit(turns, tools=["echo"])
    s.store.runs[run_id].config["model"]["context_limit_tokens"] = limit
    return run_id


def run_to_end(s: Shell, run_id: UUID) -> list[str]:
    first = execute_round(s.ctx, RoundTask(run_id=run_id, boundary_seq=0))
    return [first.value, *s.deliver_sent()]


def test_a_run_over_its_context_limit_rebuilds_and_completes() -> None:
    s = shell()
    run_id = limited(s, [report(i) for i in range(5)] + [{"content": "done"}], 330)
    assert set(run_to_end(s, run_id)) == {"committed"}
    run, cp = s.store.run(run_id), s.store.checkpoints[run_id]
    assert (run.status, run.boundary_seq) == ("completed", 6)
    assert cp.rebuilds >= 1 and cp.context_start_position > 0 and cp.summary
    assert len(s.store.consumptions) == cp.rebuilds == len(s.store.builds)
    assert [e["kind"] for e in s.store.events].count("context_rebuilt") == cp.rebuilds
    rejected = [c for c in s.store.model_calls if c["status"] == "failed"]
    assert rejected and all(c["error_code"] == "MODEL_INPUT_REJECTED" for c in rejected)
    assert len(s.store.model_calls) == 6 + len(rejected)


def test_a_run_still_over_its_limit_after_two_rebuilds_fails_with_the_exhaustion_code() -> None:
    s = shell()
    big = {"tool_calls": [{"name": "echo", "args": {"blob": "z" * 3000}}]}
    run_id = limited(s, [report(i) for i in range(4)] + [big, {"content": "never"}], 900)
    assert run_to_end(s, run_id)[-1] == "run_failed"
    run = s.store.run(run_id)
    assert (run.status, run.error_code) == ("failed", "MODEL_CONTEXT_REBUILD_EXHAUSTED")
    assert sorted(b["ordinal"] for b in s.store.builds.values()) == [1, 2]
    assert len(s.store.consumptions) == 2


def test_a_source_that_keeps_changing_fails_the_run_after_a_bounded_number_of_prepares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = shell()
    run_id = limited(s, [report(i) for i in range(5)] + [{"content": "done"}], 330)
    prepares: list[int] = []

    def changed(*args: Any, **kwargs: Any) -> None:
        prepares.append(1)
        raise RebuildSourceChanged("a message was appended meanwhile")

    monkeypatch.setattr(s.store, "admit_model_rebuild_request", changed)
    assert run_to_end(s, run_id)[-1] == "run_failed"
    assert s.store.run(run_id).error_code == RebuildSourceChanged.code
    assert len(prepares) == rebuild_module.MAX_PREPARES
    assert s.store.consumptions == {}

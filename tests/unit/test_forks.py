"""The pure parts of forks and diffs (``runtime.forks``): a fork request parsed and its
overrides nested, the proofs of copied rounds, and two runs' records compared per round."""

from __future__ import annotations

from uuid import uuid4

import pytest

from runtime.errors import RequestInvalid
from runtime.forks import ForkRules, diff_runs, nested_overrides, parse_fork_request
from runtime.proofs import ProofAuthority
from schema.wire.claim import StoredRound
from schema.wire.forks import RoundRecordView, RunRecordView, ToolResultView


def test_dotted_overrides_nest_like_an_agents_overrides() -> None:
    assert nested_overrides({"policy.max_rounds": 9, "policy.require_approval": ["add"], "system_prompt": "x"}) == {
        "policy": {"max_rounds": 9, "require_approval": ["add"]}, "system_prompt": "x"}


@pytest.mark.parametrize(("dotted", "field"), [
    ({"Policy": 1}, "config_overrides.Policy"),
    ({"policy..x": 1}, "config_overrides.policy..x"),
    ({"a b": 1}, 'config_overrides["a b"]'),
    ({"policy": {}, "policy.max_rounds": 2}, "config_overrides.policy.max_rounds"),
    ({"policy.max_rounds": 2, "policy": 1}, "config_overrides.policy.max_rounds"),
])
def test_a_path_that_is_not_a_config_path_or_overlaps_another_is_refused(dotted: dict, field: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        nested_overrides(dotted)
    assert refused.value.field == field


def test_a_fork_request_takes_at_most_one_edit_and_only_values_a_store_can_hold() -> None:
    assert parse_fork_request({"at_round": 2, "edit_input": "more"}).edit_input == "more"
    for raw, field in [
        ({"at_round": 1, "edit_input": "a", "edit_tool_result": {"tool_call_id": "c", "result": 1}},
         "edit_tool_result"),
        ({"at_round": 1, "edit_tool_result": {"tool_call_id": "c", "result": float("inf")}}, "edit_tool_result.result"),
        ({"at_round": "three"}, "at_round"),
        ([1], "request"),
    ]:
        with pytest.raises(RequestInvalid) as refused:
            parse_fork_request(raw)  # type: ignore[arg-type]
        assert refused.value.field == field, raw


def test_a_copied_rounds_proof_verifies_for_the_fork_only() -> None:
    proofs = ProofAuthority(b"s" * 32)
    rules = ForkRules(proofs, max_output_bytes=1000)
    fork, parent = uuid4(), uuid4()
    stored = StoredRound(0, "sys", "msgs", "tools", "resp", None)
    signed = StoredRound(0, "sys", "msgs", "tools", "resp", rules.sign(fork, 2, stored))
    assert proofs.verifies_stored_round(fork, 2, signed)
    assert not proofs.verifies_stored_round(parent, 2, signed)
    assert not proofs.verifies_stored_round(fork, 1, signed)


def _round(seq: int, messages: str = "m", result: object = 1, content: str = "ok") -> RoundRecordView:
    return RoundRecordView(
        boundary_seq=seq, outcome="continue", system_digest="s", messages_digest=messages, tools_digest="t",
        accepted_response_digest=f"r-{content}", response={"role": "assistant", "content": content},
        tool_results=(ToolResultView("call_0_0", "add", result, False),),
    )


def test_a_diff_names_what_differs_in_each_round_and_the_rounds_only_one_run_has() -> None:
    a = RunRecordView(uuid4(), "completed", None, None, (_round(0), _round(1), _round(2)))
    b = RunRecordView(uuid4(), "completed", a.run_id, 1,
                      (_round(0), _round(1, messages="m2", result=2), _round(2, content="other"), _round(3)))
    diff = diff_runs(a, b)
    assert [(r.round, r.verdict, r.differs) for r in diff.rounds] == [
        (1, "same", []),
        (2, "differs", ["messages_digest", "tool_results"]),
        (3, "differs", ["response"]),
        (4, "only_in_b", []),
    ]
    assert diff.rounds[1].a["messages_digest"] == "m" and diff.rounds[1].b["messages_digest"] == "m2"
    assert not diff.same and diff_runs(a, a).same

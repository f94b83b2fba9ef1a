"""Exported cases in memory: what verification refuses (naming the round) and what a replay
reports (same / differs / new / missing, drift failing closed), with the runtime's own
rounds and no services."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.cases.chain import chain_of
from runtime.cases.replay import replay_case
from runtime.cases.report import RoundStatus
from runtime.cases.verify import CaseInvalid, CaseTampered, parse_case, verify_case
from runtime.deps import DEV_SECRET, build_runtime
from runtime.proofs import ProofAuthority
from schema.wire.case import Case
from tests.support.cases import case_of, edited, runtime_with_lookup, tool_turns
from tests.support.requests import scripted_request

THREE_TOOLS = tool_turns([("add", {"a": 2, "b": 3}), ("lookup", {"q": "word"}), ("echo", {"y": [1, 2.5]})])


@pytest.fixture(scope="module")
def case() -> Case:
    return case_of(runtime_with_lookup(1), scripted_request(THREE_TOOLS, tools=["add", "echo", "lookup"]))


def _refused(case: Case, **kw: Any) -> CaseTampered:
    with pytest.raises(CaseTampered) as refused:
        verify_case(case, **kw)
    return refused.value


# --- verification ------------------------------------------------------------------------


def test_an_exported_case_verifies_with_the_deployments_key_and_its_own_chain(case: Case) -> None:
    verified = verify_case(case, proofs=ProofAuthority(DEV_SECRET), published=case.chain_digest)
    assert (verified.chain_digest, verified.proofs_checked, verified.published_checked) == (
        case.chain_digest, True, True)
    assert [r.outcome for r in case.rounds] == ["continue", "continue", "continue", "finish"]
    assert case.rounds[1].tool_calls[0].result == {"found": "word"}


def test_an_edited_tool_result_is_refused_naming_its_round(case: Case) -> None:
    def edit(raw: dict[str, Any]) -> None:
        raw["rounds"][1]["tool_calls"][0]["result"] = {"found": "forged"}

    refused = _refused(edited(case, edit))
    assert refused.boundary_seq == 1 and "result does not match its result_digest" in refused.message


def test_a_result_edited_with_its_digest_still_disagrees_with_what_the_model_saw(case: Case) -> None:
    from runtime.canonical import digest

    def edit(raw: dict[str, Any]) -> None:
        call = raw["rounds"][1]["tool_calls"][0]
        call["result"], call["result_digest"] = {"found": "forged"}, digest({"found": "forged"})

    refused = _refused(edited(case, edit))
    assert refused.boundary_seq == 1 and "its message does not match its result" in refused.message


def test_a_case_rewritten_consistently_fails_its_proofs_and_the_published_chain(case: Case) -> None:
    """Everything recomputed (the tamperer's best): the key, or a published digest, tells."""
    from runtime.canonical import digest

    def edit(raw: dict[str, Any]) -> None:
        answer = raw["rounds"][3]
        answer["response"]["content"] = "forged"
        answer["response_digest"] = digest(answer["response"])
        answer["messages"][0]["body"]["content"] = "forged"

    forged = _relinked(edited(case, edit))
    verify_case(forged)  # consistent in itself
    refused = _refused(forged, proofs=ProofAuthority(DEV_SECRET))
    assert refused.boundary_seq == 3 and "proof does not verify" in refused.message
    assert "published" in _refused(forged, published=case.chain_digest).message
    assert "does not verify" in _refused(case, proofs=ProofAuthority(b"another-deployment-key")).message


def _relinked(case: Case) -> Case:
    from runtime.cases.chain import links

    rounds = [r.model_copy(update={"link": link}) for r, link in zip(case.rounds, links(case), strict=True)]
    relinked = case.model_copy(update={"rounds": rounds})
    return relinked.model_copy(update={"chain_digest": chain_of(relinked)})


@pytest.mark.parametrize(
    ("where", "path", "value", "says"),
    [
        (0, ["run", "input"], "other input", "input message does not match"),
        (None, ["system"], "other prompt", "not the one of the run's config"),
        (1, ["rounds", 1, "response"], None, "response does not match its response_digest"),
        (2, ["rounds", 2, "tool_calls", 0, "args"], {"y": [1, 3]}, "args do not match its args_digest"),
        (2, ["rounds", 2, "request", "messages_digest"], "0" * 64, "request_digest does not match"),
        (0, ["rounds", 0, "proof"], "0" * 64, "digest chain breaks here"),
    ],
)
def test_each_edit_is_refused_naming_the_round(
    case: Case, where: int | None, path: list[Any], value: Any, says: str
) -> None:
    def edit(raw: dict[str, Any]) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    refused = _refused(edited(case, edit))
    assert (refused.boundary_seq, says in refused.message) == (where, True), refused.message


def test_a_file_that_is_not_a_case_is_invalid_not_tampered() -> None:
    with pytest.raises(CaseInvalid, match=r"not an aidawork\.case/1 case"):
        parse_case({"format": "other/1"})
    with pytest.raises(CaseInvalid, match=r"run\.run_id: Field required"):
        parse_case({"format": "aidawork.case/1", "chain_digest": "", "run": {}, "system": "", "tools": None})


# --- replay --------------------------------------------------------------------------------


def test_a_replay_with_the_recorded_model_reproduces_every_digest(case: Case) -> None:
    report = replay_case(case, runtime_with_lookup(1), case.run.config)
    assert [r.status for r in report.rounds] == [RoundStatus.SAME] * 4
    assert report.ok and report.drifted is None


def test_a_changed_tool_schema_fails_closed_at_the_round_that_calls_it(case: Case) -> None:
    report = replay_case(case, runtime_with_lookup(2), case.run.config)
    assert not report.ok
    drifted = report.drifted
    assert drifted is not None and drifted.boundary_seq == 1 and "schema" in drifted.what
    assert "no longer validate against the tool's schema" in (drifted.drift or "")
    assert [r.status for r in report.rounds] == ["differs", "differs", "missing", "missing"]
    assert "FAILED CLOSED at round 2" in report.text()  # counted from 1, as aidawork diff counts


def test_a_tool_dropped_from_the_config_fails_closed_naming_it(case: Case) -> None:
    config = {**case.run.config, "tools": ["add", "echo"]}
    report = replay_case(case, runtime_with_lookup(1), config)
    drifted = report.drifted
    assert drifted is not None and drifted.boundary_seq == 1 and "tool_name" in drifted.what
    assert "tools" in report.rounds[0].what  # the tool set itself changed from round 0


def test_a_changed_prompt_differs_in_every_round_without_a_drift(case: Case) -> None:
    report = replay_case(case, runtime_with_lookup(1), {**case.run.config, "system_prompt": "new prompt"})
    assert [r.what for r in report.rounds] == [("system",)] * 4
    assert report.drifted is None and not report.ok


def test_a_tool_whose_result_changed_differs_there_and_in_the_context_after(case: Case) -> None:
    runtime = build_runtime(toolsets=[_lookup_answering("other")])
    report = replay_case(case, runtime, case.run.config)
    assert report.rounds[1].what == ("result",)
    assert [r.what for r in report.rounds[2:]] == [("messages",), ("messages",)]


def _lookup_answering(found: str) -> Any:
    from dataclasses import replace

    from tests.support.cases import lookup_tool

    return replace(lookup_tool(1), handler=lambda args, ctx: {"found": found})


def test_a_live_model_is_served_the_recorded_results_and_drifts_on_new_args(case: Case) -> None:
    runtime = runtime_with_lookup(1)
    same = {**case.run.config, "model": {"provider": "scripted", "turns": THREE_TOOLS}}
    served = replay_case(case, runtime, same, model="live", tools="recorded")
    assert served.ok and [r.status for r in served.rounds] == ["same"] * 4

    other = tool_turns([("add", {"a": 2, "b": 3}), ("lookup", {"q": "another"})])
    drifted = replay_case(case, runtime, {**same, "model": {"provider": "scripted", "turns": other}},
                          model="live", tools="recorded")
    assert drifted.drifted is not None and drifted.drifted.boundary_seq == 1
    assert "no recorded call of this tool has these args" in (drifted.drifted.drift or "")

    ran = replay_case(case, runtime, {**same, "model": {"provider": "scripted", "turns": other}},
                      model="live", tools="live")
    assert ran.ok  # a live model may answer differently; nothing drifted
    assert ran.rounds[1].what == ("response", "args", "result") and ran.rounds[2].status == "differs"
    assert ran.rounds[3].status == "missing"


def test_a_live_model_that_goes_on_longer_makes_new_rounds(case: Case) -> None:
    longer = tool_turns([("add", {"a": 2, "b": 3}), ("lookup", {"q": "word"}), ("echo", {"y": [1, 2.5]}),
                         ("add", {"a": 1, "b": 1})])
    config = {**case.run.config, "model": {"provider": "scripted", "turns": longer}}
    report = replay_case(case, runtime_with_lookup(1), config, model="live", tools="live")
    assert [r.status for r in report.rounds] == ["same", "same", "same", "differs", "new"]


def test_the_report_as_json_names_each_round(case: Case) -> None:
    report = replay_case(case, runtime_with_lookup(2), case.run.config)
    body = report.to_json()
    assert body["ok"] is False
    assert [(r["round"], r["status"]) for r in body["rounds"]] == [  # type: ignore[index, union-attr]
        (1, "differs"), (2, "differs"), (3, "missing"), (4, "missing")]


# --- the command, in process ------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``aidawork`` with the development key and no plugins; no store is reachable."""
    import worker.cli.replay
    from worker.cli import main
    from worker.ops.settings import Settings

    settings = Settings(dev=True, plugins="", database_url="postgresql+psycopg://nowhere.invalid/none")
    monkeypatch.setattr(main, "get_settings", lambda: settings)
    monkeypatch.setattr(worker.cli.replay, "get_settings", lambda: settings)
    return main


def test_the_replay_command_exits_0_same_1_differs_2_refused(
    cli: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from tests.support.cases import write_case

    plain = case_of(build_runtime(), scripted_request(tool_turns([("add", {"a": 1, "b": 2})]), tools=["add"]))
    good = write_case(plain, tmp_path / "good.case.json")
    assert cli.main(["replay", str(good)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ok"

    changed = tmp_path / "new.json"
    changed.write_text(json.dumps({**plain.run.config, "system_prompt": "another"}))
    assert cli.main(["replay", str(good), "--config", str(changed), "--json"]) == 1
    out = capsys.readouterr().out  # (this process's logging is not set up: its INFO lines print before)
    assert [r["what"] for r in json.loads(out[out.index('{\n  "run_id"'):])["rounds"]] == [["system"], ["system"]]

    raw = json.loads(good.read_text())
    raw["rounds"][0]["tool_calls"][0]["result"] = {"sum": 4}
    tampered = write_case(raw, tmp_path / "tampered.case.json")
    for argv, says in (
        (["replay", str(tampered)], "CASE_TAMPERED: round 1: tool call call_0_0: its result does not match"),
        (["replay", str(tmp_path / "none.case.json")], "CASE_INVALID: cannot read"),
        (["replay", str(good), "--config", str(changed), "--agent", "a@1"], "give --config or --agent, not both"),
        (["replay", str(good), "--chain", "0" * 64], "not at the published"),
    ):
        assert cli.main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("aidawork: error: ") and says in err, err

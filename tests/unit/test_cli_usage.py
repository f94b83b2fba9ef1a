"""Usage errors of ``aidawork`` (Typer's parsing): exit 2 with the command's usage and one
``...: error:`` line naming what is wrong, never a traceback, before any setting or
store is read; ``--help`` of every command works with no settings at all."""

from __future__ import annotations

import uuid

import pytest

from worker.cli import main as cli

RUN = str(uuid.UUID(int=1))


@pytest.fixture(autouse=True)
def nothing_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing reads no setting: a usage error or --help never gets that far."""

    def read(*_: object, **__: object) -> None:
        raise AssertionError("the settings were read")

    monkeypatch.setattr(cli, "get_settings", read)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        pytest.param([], "Missing command", id="no_command"),
        pytest.param(["teleport"], "No such command 'teleport'", id="unknown_command"),
        pytest.param(["submitt", "x.json"], "Did you mean 'submit'", id="typo"),
        pytest.param(["submit"], "FILE", id="missing_argument"),
        pytest.param(["submit", "x.json", "--priority", "12"], "--priority", id="priority_range"),
        pytest.param(["submit", "x.json", "--priority", "high"], "--priority", id="priority_not_int"),
        pytest.param(["submit", "x.json", "--root-policy", "wait"], "--root-policy", id="bad_choice"),
        pytest.param(["submit", "x.json", "--frobnicate"], "--frobnicate", id="unknown_option"),
        pytest.param(["status", "not-a-run"], "RUN_ID", id="bad_run_id"),
        pytest.param(["deliver", RUN, "call_0_0"], "--file", id="missing_required_option"),
        pytest.param(["tool-result", RUN, "call_0_0"], "--json", id="missing_json"),
        pytest.param(["reject", RUN, "call_0_0"], "--reason", id="missing_reason"),
        pytest.param(["prune", "--older-than-days", "0"], "--older-than-days", id="days_zero"),
        pytest.param(["prune", "--older-than-days", "nan"], "--older-than-days", id="days_nan"),
        pytest.param(["worker", "--concurrency", "many"], "--concurrency", id="process_bad_int"),
        pytest.param(["flower", "--port"], "--port", id="option_without_value"),
        pytest.param(["owner"], "Missing command", id="owner_without_subcommand"),
        pytest.param(["owner", "set"], "OWNER", id="owner_missing_argument"),
        pytest.param(["owner", "list", "--json", "extra"], "extra", id="unexpected_argument"),
    ],
)
def test_a_usage_error_exits_2_naming_the_problem(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    *usage, error = err.strip().splitlines()
    # Click knows no command of an option missing its value: no usage then.
    assert usage[0].startswith("Usage: aidawork") if usage else argv[-1] == "--port", err
    assert error.startswith("aidawork") and ": error: " in error and named in error, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [[], ["worker"], ["api"], ["submit"], ["tool-result"], ["prune"], ["owner"], ["owner", "set"]],
    ids=lambda argv: " ".join(argv) or "aidawork",
)
def test_help_of_every_command_needs_no_settings(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--help", "-h"):
        with pytest.raises(SystemExit) as exited:
            cli.main([*argv, flag])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"Usage: {' '.join(['aidawork', *argv])} "), out

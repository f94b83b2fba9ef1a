"""``aidawork owner``: the flags are parsed and checked before anything is stored; a bad
one is exit 2 with one line naming the flag."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worker.cli import main as cli


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["owner", "set", "team-a", "--max-running", "0"], "--max-running"),
        (["owner", "set", "team-a", "--max-running", "two"], "--max-running"),
        (["owner", "set", "team-a", "--weight", "1001"], "--weight"),
        (["owner", "set", "team-a", "--weight", "0"], "--weight"),
        (["owner", "set", "team-a", "--weight", "none"], "--weight"),
        (["owner", "set", "team-a", "--budget-window", "2h"], "--budget-window"),
        (["owner", "set", "team-a", "--budget-window", "none"], "--budget-window"),
        (["owner", "set", "team-a", "--on-budget", "explode"], "--on-budget"),
        (["owner", "set", "team-a", "--token-budget", "-5", "--budget-window", "1d"], "--token-budget"),
        (["owner", "set", "team-a"], "nothing to set"),
        (["owner", "set", "bad owner!", "--max-running", "2"], "OWNER"),
    ],
)
def test_bad_owner_flags_exit_2_naming_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == cli.EXIT_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("aidawork: error: ") and named in err[0], err


def test_only_the_flags_given_are_changes() -> None:
    from worker.cli.owner import changes_of

    parsed = cli.parse(["owner", "set", "team-a", "--max-running", "none", "--weight", "3"])
    assert changes_of(SimpleNamespace(**parsed.ctx.params)) == {"max_running": None, "weight": 3}

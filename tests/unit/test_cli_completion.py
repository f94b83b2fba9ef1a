"""``aidawork --install-completion`` (Typer's) for bash: the installed command writes its
completion script, hooks it into ~/.bashrc, and the shell's completion protocol then
offers the commands and the ``owner`` subcommands. Runs the console script installed in
the venv, with HOME a temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

AIDAWORK = Path(sys.executable).parent / "aidawork"  # the console script of pyproject.toml

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def _env(home: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIDAWORK_", "_AIDAWORK", "COMP_"))}
    return {**keep, "HOME": str(home), "SHELL": "/bin/bash", "PATH": f"{AIDAWORK.parent}:/usr/bin:/bin", **extra}


def _complete(home: Path, words: str, cword: int) -> list[str]:
    """What the completion protocol answers for COMP_WORDS/COMP_CWORD (what the installed
    script's function asks on each Tab)."""
    done = subprocess.run(
        [str(AIDAWORK)],
        env=_env(home, _AIDAWORK_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword)),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    # Run from bash (not exec'd: a command follows), so that the shell is detected as bash.
    done = subprocess.run(
        ["bash", "-c", f"'{AIDAWORK}' --install-completion; code=$?; exit $code"],
        env=_env(home), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "bash completion installed" in done.stdout
    return home


def test_install_completion_writes_the_script_and_hooks_it_into_bashrc(home: Path) -> None:
    script = home / ".bash_completions" / "aidawork.sh"
    assert script.is_file()
    text = script.read_text()
    assert "_AIDAWORK_COMPLETE=complete_bash" in text and "complete -o default -F" in text
    assert f"source '{script}'" in (home / ".bashrc").read_text()


def test_the_completion_protocol_offers_the_commands(home: Path) -> None:
    assert _complete(home, "aidawork sub", 1) == ["submit"]
    offered = _complete(home, "aidawork ", 1)
    for command in ("migrate", "worker", "submit", "status", "tool-result", "prune", "owner"):
        assert command in offered, offered


def test_the_completion_protocol_offers_the_owner_subcommands(home: Path) -> None:
    assert _complete(home, "aidawork owner web", 2) == ["webhook-secret"]
    assert set(_complete(home, "aidawork owner ", 2)) >= {"set", "show", "list", "webhook-secret"}
    assert "--max-running" in _complete(home, "aidawork owner set team-a --max", 4)


def test_the_installed_script_completes_in_bash(home: Path) -> None:
    # What a Tab does: ~/.bashrc sources the script, and bash calls the function it named
    # for aidawork (complete -F) with the command, the word and the one before it.
    line = (
        "source ~/.bashrc; complete -p aidawork; COMP_WORDS=(aidawork owner s); COMP_CWORD=2; "
        "_aidawork_completion aidawork s owner; echo ${COMPREPLY[@]}"
    )
    done = subprocess.run(["bash", "-c", line], env=_env(home), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    registered, offered = done.stdout.splitlines()
    assert registered.startswith("complete ") and registered.endswith(" -F _aidawork_completion aidawork")
    assert offered.split() == ["set", "show"]

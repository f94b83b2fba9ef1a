"""The docs harness (tests/docs/blocks.py) fails what it must: a python block that raises,
a shell command that fails, a JSON run request ``aidawork submit`` would refuse; on
temporary markdown, with no stack (none of these blocks needs one)."""

from __future__ import annotations

import os
import traceback
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import (
    PythonFailed,
    RequestRefused,
    ShellFailed,
    check_run_request,
    console_commands,
    drop_namespace,
    new_namespace,
    parse,
    request_runtime,
    run_python,
    run_shell,
)
from tests.support.env import BROKER_URL, PG_BASE
from tests.support.wait import wait_until

FENCE = "```"


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text.replace("~~~", FENCE))
    return path


@pytest.fixture(scope="module")
def runtime() -> Any:
    from worker.ops.settings import Settings

    return request_runtime(Settings(database_url=f"{PG_BASE}/unused", broker_url=BROKER_URL, dev=True))


def test_a_failing_python_block_fails_naming_its_markdown_line(tmp_path: Path) -> None:
    path = page(tmp_path, "# Page\n\n~~~python\nx = 1\n~~~\n\nText.\n\n~~~python\ny = x + 1\nassert y == 3, y\n~~~\n")
    blocks = parse(path, tmp_path).blocks
    assert [(b.kind, b.line) for b in blocks] == [("python", 3), ("python", 9)]
    namespace = new_namespace("page.md")
    try:
        run_python(blocks[0], namespace)  # passes, and its name is seen by the next block
        with pytest.raises(PythonFailed, match=r"page\.md:9: python block raised AssertionError") as caught:
            run_python(blocks[1], namespace)
    finally:
        drop_namespace(namespace)
    cause = caught.value.__cause__
    assert isinstance(cause, AssertionError)
    frame = traceback.extract_tb(cause.__traceback__)[-1]
    assert (frame.filename, frame.lineno) == (str(path.resolve()), 11)  # the assert's line in page.md
    # The message shows the markdown line that raised, and no frame of the harness.
    assert f'File "{path.resolve()}", line 11' in str(caught.value) and "assert y == 3, y" in str(caught.value)
    assert "blocks.py" not in str(caught.value)


def test_a_failing_shell_command_fails_the_block(tmp_path: Path) -> None:
    path = page(tmp_path, "~~~sh\necho first\nfalse\necho never\n~~~\n\n~~~bash\nfalse | true\n~~~\n\n"
                          "~~~sh\necho \"$NOT_SET_ANYWHERE\"\n~~~\n\n~~~sh\necho ok\n~~~\n")
    failing_exit, failing_pipe, unset_var, passing = parse(path, tmp_path).blocks
    env = {k: v for k, v in os.environ.items() if k != "NOT_SET_ANYWHERE"}
    with pytest.raises(ShellFailed, match=r"page.md:1: exited with 1") as caught:
        run_shell(failing_exit, env, cwd=tmp_path)
    assert "first" in str(caught.value) and "never" not in str(caught.value).split("--- output")[1]
    with pytest.raises(ShellFailed, match="exited with 1"):
        run_shell(failing_pipe, env, cwd=tmp_path)  # pipefail
    with pytest.raises(ShellFailed, match="unbound variable"):
        run_shell(unset_var, env, cwd=tmp_path)  # nounset
    assert run_shell(passing, env, cwd=tmp_path) == "ok\n"


def test_what_a_shell_block_leaves_running_is_killed(tmp_path: Path) -> None:
    """A server a block starts in a session of its own (as ``make demo`` does with its
    workers) does not outlive the block, nor does one that keeps the block running."""
    path = page(tmp_path, "~~~sh\nsetsid sleep 600 >/dev/null 2>&1 </dev/null &\npid=$!\n"
                          # out of the block's process group before the block ends
                          'until [ "$(ps -o sid= -p $pid | tr -d " ")" = "$pid" ]; do sleep 0.05; done\n'
                          "echo $pid > detached.pid\n~~~\n\n"
                          "~~~sh\necho $$ > hanging.pid\nsleep 600\n~~~\n")
    detached, hanging = parse(path, tmp_path).blocks
    run_shell(detached, os.environ, cwd=tmp_path)
    with pytest.raises(ShellFailed, match="still running after 1s, killed"):
        run_shell(hanging, os.environ, cwd=tmp_path, timeout_s=1)
    for name in ("detached.pid", "hanging.pid"):
        pid = int((tmp_path / name).read_text())
        wait_until(partial(gone, pid), timeout_s=10, what=f"process {pid} ({name}) to be killed")


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # killed, not reaped yet


def test_a_console_block_runs_its_dollar_lines_only(tmp_path: Path) -> None:
    path = page(tmp_path, "~~~console\n$ echo one \\\n>   two\nexit 3\n$ test -d .\n~~~\n\n"
                          "~~~console\n$ echo fine\nfine\n$ false\n~~~\n\n~~~console\nsample output only\n~~~\n")
    passing, failing, no_command = parse(path, tmp_path).blocks
    assert console_commands(passing.code) == ["echo one \\\n  two", "test -d ."]
    assert run_shell(passing, os.environ, cwd=tmp_path) == "one two\n"  # `exit 3` is output, not run
    with pytest.raises(ShellFailed, match="exited with 1"):
        run_shell(failing, os.environ, cwd=tmp_path)
    with pytest.raises(ShellFailed, match="no `\\$ ` command line"):
        run_shell(no_command, os.environ, cwd=tmp_path)


def test_an_invalid_json_run_request_fails(tmp_path: Path, runtime: Any) -> None:
    good = ('{"owner": "team-a", "root_id": null, "input": "Add 2 and 3.", "config": {"model": '
            '{"provider": "scripted", "turns": [{"content": "5"}]}, "tools": ["add"]}}')
    path = page(tmp_path, f"~~~json\n{good}\n~~~\n\n~~~json\n{good.replace('add', 'no_such_tool')}\n~~~\n\n"
                          f"~~~json\n{good}\n{good.replace('team-a', 'bad owner')}\n~~~\n\n"
                          '~~~json\n{"owner": "team-a",\n "input": oops}\n~~~\n\n~~~json\n["not", "a request"]\n~~~\n')
    valid, unknown_tool, second_bad, not_json, not_object = parse(path, tmp_path).blocks
    assert check_run_request(valid, runtime) == 1
    with pytest.raises(RequestRefused, match=r"page.md:5: .*unknown tool 'no_such_tool'"):
        check_run_request(unknown_tool, runtime)
    with pytest.raises(RequestRefused, match=r"page.md:9 \(value 2 of 2\): .*owner"):
        check_run_request(second_bad, runtime)
    with pytest.raises(RequestRefused, match=r"page.md:16: not JSON"):  # the line of the error
        check_run_request(not_json, runtime)
    with pytest.raises(RequestRefused, match="must be a JSON object"):
        check_run_request(not_object, runtime)


def test_skip_markers_and_misplaced_ones(tmp_path: Path) -> None:
    path = page(tmp_path, "<!-- docs-test: skip: starts a server -->\n~~~sh\naidawork worker\n~~~\n\n"
                          "<!-- docs-test: skip: a text block is never run -->\n~~~text\nsample\n~~~\n\n"
                          "<!-- docs-test: skip: not right before -->\n\n~~~python\nx = 1\n~~~\n\n"
                          "<!-- docs-test: skip -->\n~~~json\n{}\n~~~\n\n"
                          # a fence in a fence, a marker in it
                          "````markdown\n<!-- docs-test: skip -->\n```python\nraise SystemExit\n```\n````\n"
                          "Prose may name `<!-- docs-test: skip: REASON -->`.\n")
    parsed = parse(path, tmp_path)
    assert [(b.line, b.kind, b.skip) for b in parsed.blocks] == [
        (2, "sh", "starts a server"), (13, "python", None), (18, "json", None), (22, None, None)]
    assert [b.line for b in parsed.ignored_markers] == [7]
    assert [(p.line, p.message.split(":")[0]) for p in parsed.problems] == [
        (11, "docs-test marker not on the line right before a fence"),
        (17, "docs-test marker malformed")]

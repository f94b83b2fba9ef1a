"""The examples of README.md and docs/: finding the fenced blocks and checking each kind.

- ```python (or py): run, in order, per page in one namespace (a module of its own);
- ```sh (or bash, shell): run with bash (``set -euo pipefail``) in the repository root;
- ```console: its ``$ `` lines are commands (run like sh, a trailing ``\\`` continues one
  on the next line); other lines are sample output, not compared;
- ```json: each JSON value in it is a run request, checked as ``aidawork submit FILE``
  checks one (``prepare_execution``: an unknown tool or provider fails), nothing stored;
- any other info string (text, yaml, toml, ini, http, none) is not checked.

``<!-- docs-test: skip: REASON -->`` on the line right before a block's fence: not run,
counted, its reason printed at the end of the run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import traceback
import types
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
KINDS = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh",
         "console": "console", "json": "json"}
SHELL_TIMEOUT_S = 60.0  # a command that never ends (`aidawork worker`, `make demo`) fails, not hangs
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*skip:\s*(?P<reason>\S.*?)\s*-->\s*$")
ANY_MARKER = re.compile(r"^\s*<!--\s*docs-test\b")  # a line of its own (prose may name one)
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: ``line`` is its opening fence's (1-based), ``kind`` what checks it
    (None: not checked)."""

    page: str  # the path from the repository root (or the file's name, outside it)
    path: Path
    line: int
    info: str
    kind: str | None
    code: str
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def first_code_line(self) -> int:
        return self.line + 1


@dataclass(frozen=True)
class Problem:
    """A ``docs-test`` comment that is malformed or not right before a fence."""

    page: str
    line: int
    message: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Page:
    blocks: list[Block] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    ignored_markers: list[Block] = field(default_factory=list)  # a skip marker on an unchecked block


def page_name(path: Path, root: Path = REPO) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return path.name


def parse(path: Path, root: Path = REPO) -> Page:
    """The fenced blocks of one markdown file, and its misplaced markers."""
    name = page_name(path, root)
    lines = path.read_text(encoding="utf-8").splitlines()
    page = Page()
    consumed: set[int] = set()  # marker lines (0-based) used by the fence after them
    inside: set[int] = set()  # the lines of blocks, fences included: no marker there is one
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        info = m["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if (closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence)
                    and not closing["info"].strip()):
                break
            text = lines[j]
            body.append(text[len(indent):] if text.startswith(indent) else text.lstrip())
            j += 1
        word = re.match(r"[{.\s]*([\w+-]*)", info)
        lang = word.group(1).lower() if word else ""
        skip = None
        if i > 0 and (marker := MARKER.match(lines[i - 1])):
            skip = marker["reason"]
            consumed.add(i - 1)
        block = Block(page=name, path=path, line=i + 1, info=lang, kind=KINDS.get(lang),
                      code="\n".join(body) + "\n", skip=skip)
        if block.kind is None and skip is not None:
            page.ignored_markers.append(block)
        else:
            page.blocks.append(block)
        inside.update(range(i, j + 1))
        i = j + 1
    for n, text in enumerate(lines):
        if ANY_MARKER.search(text) and n not in consumed and n not in inside:
            why = ("malformed: write <!-- docs-test: skip: REASON -->" if not MARKER.match(text)
                   else "not on the line right before a fence")
            page.problems.append(Problem(name, n + 1, f"docs-test marker {why}: {text.strip()}"))
    return page


def pages(root: Path = REPO) -> list[Path]:
    """README.md and every page under docs/, in a stable order."""
    found = [root / "README.md"] if (root / "README.md").exists() else []
    return found + sorted((root / "docs").rglob("*.md"))


# --- python ---------------------------------------------------------------------------


def new_namespace(page: str) -> types.ModuleType:
    """A module of its own for a page's python blocks (registered, so that type hints and
    pickling resolve names in it); ``drop_namespace`` removes it."""
    slug = re.sub(r"\W", "_", page)
    module = types.ModuleType(f"docs_example_{slug}")
    module.__file__ = page
    sys.modules[module.__name__] = module
    return module


def drop_namespace(module: types.ModuleType) -> None:
    sys.modules.pop(module.__name__, None)


class PythonFailed(AssertionError):
    pass


def run_python(block: Block, namespace: types.ModuleType) -> None:
    """Run the block in ``namespace``. Compiled under the page's own path, its lines where
    they are in the page: the traceback of ``PythonFailed`` starts at the markdown line
    that raised (the harness's own frames left out)."""
    filename = str(block.path.resolve())
    padded = "\n" * (block.first_code_line - 1) + block.code
    try:
        exec(compile(padded, filename, "exec"), namespace.__dict__)
    except (Exception, SystemExit) as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        shown = "".join(traceback.format_exception(type(exc), exc, tb))
        raise PythonFailed(f"{block.id}: python block raised {type(exc).__name__}\n{shown}") from exc


# --- sh / console ---------------------------------------------------------------------


def console_commands(code: str) -> list[str]:
    """The commands of a console block: its ``$ `` lines, joined with the lines a trailing
    backslash continues them on."""
    commands: list[str] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("$ ") or line == "$"):
            i += 1
            continue
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            nxt = lines[i]
            command += "\n" + (nxt[2:] if nxt.startswith("> ") else nxt)
        commands.append(command)
        i += 1
    return commands


def shell_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the project's .venv/bin first on PATH."""
    env = dict(base)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, str(REPO / ".venv" / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
    return env


class ShellFailed(AssertionError):
    pass


def shell_script(block: Block) -> str:
    if block.kind == "console":
        commands = console_commands(block.code)
        if not commands:
            raise ShellFailed(f"{block.id}: a console block with no `$ ` command line (sample output only: "
                              "use ```text)")
        return "\n".join(commands) + "\n"
    return block.code


TOKEN_VAR = "DOCS_TEST_BLOCK"  # not AIDAWORK_*: the processes a block starts keep it


def run_shell(block: Block, env: Mapping[str, str], *, cwd: Path = REPO,
              timeout_s: float = SHELL_TIMEOUT_S) -> str:
    """Run a sh or console block with bash; its output, or ``ShellFailed`` with the exit
    status and the output's tail. Every process the block started and left running (in
    the background, or in a session of its own, as ``make demo``'s workers) is killed
    after it: each carries the block's token in its environment."""
    script = "set -euo pipefail\n" + shell_script(block)
    token = f"{block.id}#{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        ["bash", "-c", script], cwd=cwd, env={**shell_env(env), TOKEN_VAR: token}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_started_by(token)
        out, _ = proc.communicate()
        raise ShellFailed(
            f"{block.id}: still running after {timeout_s:.0f}s, killed (a command that does not end, "
            f"such as a server: mark the block <!-- docs-test: skip: ... -->)\n{tail(out)}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own group (a command that cleared its environment)
        kill_started_by(token)
    if proc.returncode != 0:
        raise ShellFailed(f"{block.id}: exited with {proc.returncode}\n--- script ---\n{script}"
                          f"--- output (tail) ---\n{tail(out)}")
    return out


def started_by(token: str) -> list[int]:
    """The processes whose environment holds ``TOKEN_VAR=token`` (Linux: /proc)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_started_by(token: str) -> None:
    for pid in started_by(token):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --- json -----------------------------------------------------------------------------


def json_values(text: str) -> Iterator[Any]:
    """Every JSON value of ``text`` (one, or several separated by whitespace)."""
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return
        value, pos = decoder.raw_decode(text, pos)
        yield value


class RequestRefused(AssertionError):
    pass


def check_run_request(block: Block, runtime: Any) -> int:
    """Check every value of a json block as ``aidawork submit FILE`` checks a request
    (``worker.cli.main.cmd_submit`` then ``worker.client.submit``): a JSON object, valid for
    ``prepare_execution`` (fields, owner, config, known tools and providers), a webhook
    URL of a valid shape (the allow list, AIDAWORK_WEBHOOK_URLS, is the deployment's).
    Nothing is stored. Returns how many requests it checked."""
    from runtime.errors import RequestInvalid
    from runtime.prepare import prepare_execution
    from worker.ops.webhooks.policy import WebhookRefused, check_url_shape

    try:
        values = list(json_values(block.code))
    except json.JSONDecodeError as exc:
        line = block.first_code_line + exc.lineno - 1
        raise RequestRefused(f"{block.page}:{line}: not JSON: {exc.msg} (column {exc.colno})") from None
    if not values:
        raise RequestRefused(f"{block.id}: an empty json block")
    for n, value in enumerate(values, 1):
        where = block.id if len(values) == 1 else f"{block.id} (value {n} of {len(values)})"
        if not isinstance(value, dict):
            raise RequestRefused(f"{where}: a run request must be a JSON object, not {type(value).__name__}")
        try:
            parsed, _ = prepare_execution(runtime, value)
            if parsed.webhook is not None:
                check_url_shape(parsed.webhook.url)
        except (RequestInvalid, WebhookRefused) as exc:
            message = getattr(exc, "message", str(exc))
            raise RequestRefused(f"{where}: not a valid run request (aidawork submit refuses it): "
                                 f"{message}") from None
    return len(values)


def request_runtime(settings: Any) -> Any:
    """The checks a run request must pass, as the client process builds them (its
    plugins, its providers, no MCP servers: those need a live connection)."""
    from worker.client.context import runtime_for

    return runtime_for(settings.model_copy(update={"mcp_servers": {}}))

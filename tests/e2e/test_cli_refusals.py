"""``aidawork submit``, ``resolve`` and ``deliver`` given values no store can hold (NaN,
Infinity, 1e400, NUL, unpaired surrogates, nesting past 64 levels or 100000 deep,
integers past 4000 or 4300 digits, a request that is not an object): exit 2, one
``aidawork: error:`` line naming the field, no traceback, and no table changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runtime.canonical import MAX_JSON_DEPTH, NON_FINITE, NUL_CHARACTER, TOO_DEEP, TOO_MANY_DIGITS, UNPAIRED_SURROGATE
from tests.support.env import BROKER_URL, REPO, process_environ
from tests.support.requests import scripted_request
from tests.support.suspensions import READ_ONE, assert_unchanged, snapshot, suspended_run

PARALLEL = 4  # CLI processes at once: each is a fresh interpreter, and the machine is small
ECHO = scripted_request([{"tool_calls": [{"name": "echo", "args": {"x": 1}}]}, {"content": "ok"}], tools=["echo"])
ARGS = "config.model.turns[0].tool_calls[0].args"
VALID = json.dumps(ECHO)


def with_x(raw_json: str) -> str:
    """The echo request with args.x replaced by this JSON text (written by hand: no
    encoder would write NaN, a 5000-digit integer or 100000 brackets for us)."""
    return VALID.replace('"args": {"x": 1}', '"args": {"x": ' + raw_json + "}")


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def run_cli(db_url: str, jobs: dict[str, list[str | bytes]]) -> dict[str, subprocess.CompletedProcess[str]]:
    env = process_environ()
    env.update({"AIDAWORK_DATABASE_URL": db_url, "AIDAWORK_BROKER_URL": BROKER_URL})
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    names = list(jobs)
    for start in range(0, len(names), PARALLEL):
        batch = {
            name: subprocess.Popen(
                [sys.executable, "-m", "worker.cli", *jobs[name]],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in names[start : start + PARALLEL]
        }
        for name, proc in batch.items():
            out, err = proc.communicate(timeout=120)
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def assert_refused(results: dict[str, subprocess.CompletedProcess[str]], expected: dict[str, str]) -> None:
    for name, result in results.items():
        err = result.stderr
        assert result.returncode == 2, f"{name}: exit {result.returncode}, stderr {err!r}"
        assert err.startswith("aidawork: error: ") and err.count("\n") == 1, f"{name}: not one line: {err!r}"
        assert "Traceback" not in err, name
        assert expected[name] in err, f"{name}: {err!r} does not say {expected[name]!r}"
        assert result.stdout == "", f"{name}: printed {result.stdout!r}"


def test_cli_submit_refuses_unstorable_values_naming_the_field_and_stores_nothing(
    ctx, db_url: str, tmp_path: Path
) -> None:
    deep_x = f"{ARGS}.x" + "[0]" * (MAX_JSON_DEPTH - 8)  # args is level 8 of the request
    bodies: dict[str, tuple[bytes, str]] = {
        "255_deep": (with_x(nested(255)).encode(), f"{deep_x}: {TOO_DEEP}"),
        "1000_deep": (with_x(nested(1000)).encode(), TOO_DEEP),
        "100000_deep": (with_x(nested(100_000)).encode(), TOO_DEEP),
        "4001_digits": (with_x("7" * 4001).encode(), f"{ARGS}.x: {TOO_MANY_DIGITS}"),
        "4301_digits": (with_x("7" * 4301).encode(), TOO_MANY_DIGITS),
        "nan": (with_x("NaN").encode(), f"{ARGS}.x: {NON_FINITE}"),
        "1e400": (with_x("1e400").encode(), f"{ARGS}.x: {NON_FINITE}"),
        "nul": (with_x('"a\\u0000"').encode(), f"{ARGS}.x: {NUL_CHARACTER}"),
        "surrogate_key": (with_x('{"\\ud800": 1}').encode(), f"{ARGS}.x: an object key holds {UNPAIRED_SURROGATE}"),
        "a_list": (b"[1, 2]", "must be a JSON object"),
        "a_string": (b'"run this"', "must be a JSON object"),
        "null": (b"null", "must be a JSON object"),
        "not_utf8": (VALID.encode().replace(b'"go"', b'"\xff"'), "is not UTF-8 text"),
    }
    before = snapshot(ctx)
    jobs: dict[str, list[str | bytes]] = {}
    for name, (body, _) in bodies.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(body)
        jobs[name] = ["submit", str(path)]

    results = run_cli(db_url, jobs)

    assert_refused(results, {name: expected for name, (_, expected) in bodies.items()})
    assert_unchanged(ctx, before, "refused CLI submissions")
    valid = tmp_path / "valid.json"
    valid.write_text(VALID)
    accepted = run_cli(db_url, {"valid": ["submit", str(valid)]})["valid"]
    assert accepted.returncode == 0, accepted.stderr  # the same CLI stores the valid request


def test_cli_resolve_and_deliver_refuse_unstorable_values_naming_the_field_and_store_nothing(
    ctx, db_url: str, tmp_path: Path
) -> None:
    awaiting = suspended_run(
        ctx, [{"tool_calls": [{"name": "await_prerequisite", "args": {"key": "approval"}}]}], ["await_prerequisite"]
    )
    reading = suspended_run(ctx, READ_ONE, ["read_files"])
    nul_file = tmp_path / "nul.txt"
    nul_file.write_bytes(b"before\x00after")
    ok_file = tmp_path / "ok.txt"
    ok_file.write_text("fine")
    resolve = ["resolve", str(awaiting), "approval", "--value"]
    cases: dict[str, tuple[list[str | bytes], str]] = {
        "nan": ([*resolve, "NaN"], f"value: {NON_FINITE}"),
        "minus_infinity": ([*resolve, '{"a": -Infinity}'], f"value.a: {NON_FINITE}"),
        "1e400": ([*resolve, "[1e400]"], f"value[0]: {NON_FINITE}"),
        "900_deep": ([*resolve, nested(900)], f"value{'[0]' * MAX_JSON_DEPTH}: {TOO_DEEP}"),
        "60000_deep": ([*resolve, nested(60_000)], f"--value: {TOO_DEEP}"),
        "4001_digits": ([*resolve, "5" * 4001], f"value: {TOO_MANY_DIGITS}"),
        "4400_digits": ([*resolve, "5" * 4400], f"--value: {TOO_MANY_DIGITS}"),
        "nul": ([*resolve, '"yes\\u0000"'], f"value: {NUL_CHARACTER}"),
        "surrogate": ([*resolve, '["\\udc00"]'], f"value[0]: {UNPAIRED_SURROGATE}"),
        "surrogate_key": (["resolve", str(awaiting), b"appr\xffoval", "--value", "true"], f"key: {UNPAIRED_SURROGATE}"),
        "nul_content": (
            ["deliver", str(reading), "call_0_0", "--file", f"notes/a.txt={nul_file}"],
            f'files[0].content: {NUL_CHARACTER}, in the file "notes/a.txt"',
        ),
        "surrogate_path": (
            ["deliver", str(reading), "call_0_0", "--file", b"notes/\xff.txt=" + str(ok_file).encode()],
            f"files[0].path: {UNPAIRED_SURROGATE}",
        ),
    }
    before = snapshot(ctx)

    results = run_cli(db_url, {name: argv for name, (argv, _) in cases.items()})

    assert_refused(results, {name: expected for name, (_, expected) in cases.items()})
    for name, result in results.items():
        if name not in ("60000_deep", "4400_digits"):  # refused by the client: the error is typed
            assert "REQUEST_INVALID" in result.stderr, (name, result.stderr)
    assert_unchanged(ctx, before, "refused CLI deliveries and prerequisites")
    good = run_cli(db_url, {"resolve": [*resolve, '{"ok": true}']})["resolve"]
    assert good.returncode == 0 and "resolved" in good.stdout, good.stderr

"""One error-code catalogue (``schema.wire.errors.ErrorCode``): every code the code
raises, stores or sends is a member of it, every member says what it means, whether
retrying helps, its HTTP status and its CLI exit code, and those agree with what the API
and the CLI do.

The codes are found by reading the source (runtime/, schema/, worker/), not by importing
it, so a code on a path no test reaches is found too:

- a class attribute ``code = ...`` (an error class);
- a code passed to a constructor or function that takes one (``CODE_TAKERS``), or as a
  ``code=`` / ``error_code=`` keyword to any call;
- a module constant whose ALL_CAPS string value ends its name (``TOOL_ERROR = "TOOL_ERROR"``);
- every ``ErrorCode.X`` written anywhere.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schema.wire.errors import AidaworkError, ErrorCode

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "schema", "worker")
CATALOGUE = ROOT / "schema" / "wire" / "errors.py"
CODE_SHAPE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$")

# Each callable that takes an error code, and the position of the code among its
# positional arguments (a ``code=`` or ``error_code=`` keyword is checked in any call).
CODE_TAKERS = {
    "ApiError": 1,  # worker.api.errors: ApiError(status, code, message, field)
    "error_response": 1,  # worker.api.errors: error_response(status, code, message, ...)
    "refuse": 1,  # worker.api.limits: the middleware's refuse(status, code, message, field)
    "Fail": 0,  # runtime.outcomes: Fail(error_code, message), how a round fails the run
    "failed": 0,  # runtime.tools.calls: ToolOutcome.failed(code, message)
    "_fail_run": 2,  # worker.engine.round: _fail_run(ctx, claim, code, message, observation)
    "fail_claimed_run": 3,  # schema.store.runs / worker.store: (run_id, fence, error_code, message)
}
CODE_KEYWORDS = frozenset({"code", "error_code"})

# A member no code refers to, and why it is kept anyway (a reason a reader can check).
UNUSED_ON_PURPOSE: dict[str, str] = {}


@dataclass(frozen=True)
class Found:
    code: str
    where: str  # path:line
    how: str  # what kind of place named it


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _code_in(node: ast.expr) -> str | None:
    """The code an expression names when it is written out: a string, or ``ErrorCode.X``
    (anything else, a variable or ``exc.code``, is checked where it was written out)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ErrorCode":
        return node.attr
    if isinstance(node, ast.JoinedStr):  # a code built at run time: no catalogue can hold it
        return "<f-string>"
    return None


def _class_codes(node: ast.ClassDef, where: str) -> Iterator[Found]:
    for stmt in node.body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        code = _code_in(value) if any(isinstance(t, ast.Name) and t.id == "code" for t in targets) else None
        if code is not None:
            yield Found(code, f"{where}:{stmt.lineno}", f"class {node.name}: code")


def _call_codes(node: ast.Call, where: str) -> Iterator[Found]:
    callee = _callee(node)
    position = CODE_TAKERS.get(callee or "")
    given = [node.args[position]] if position is not None and len(node.args) > position else []
    given += [k.value for k in node.keywords if k.arg in CODE_KEYWORDS]
    for value in given:
        code = _code_in(value)
        if code is not None:
            yield Found(code, f"{where}:{node.lineno}", f"{callee}(...)")


def _constant_codes(tree: ast.AST, where: str) -> Iterator[Found]:
    for stmt in getattr(tree, "body", []):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name, value = stmt.targets[0].id, stmt.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and CODE_SHAPE.match(value.value) and (
            name.endswith(value.value)
        ):
            yield Found(value.value, f"{where}:{stmt.lineno}", f"constant {name}")


def codes_in(tree: ast.AST, where: str) -> Iterator[Found]:
    """Every code written out in one module, with where and how (see the module docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            yield from _class_codes(node, where)
        elif isinstance(node, ast.Call):
            yield from _call_codes(node, where)
        elif (
            isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ErrorCode"
            and not node.attr.startswith("_") and node.attr != "lookup"
        ):
            yield Found(node.attr, f"{where}:{node.lineno}", "ErrorCode.X")
    yield from _constant_codes(tree, where)


def _catalogue_body() -> set[int]:
    """The lines of the ``ErrorCode`` class itself: its members name themselves."""
    tree = ast.parse(CATALOGUE.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ErrorCode")
    return set(range(cls.lineno, (cls.end_lineno or cls.lineno) + 1))


def found_codes() -> list[Found]:
    inside = _catalogue_body()
    found = []
    for path in _sources():
        where = str(path.relative_to(ROOT))
        for item in codes_in(ast.parse(path.read_text(), where), where):
            if path == CATALOGUE and int(item.where.rsplit(":", 1)[1]) in inside:
                continue
            found.append(item)
    return found


def _uncatalogued(found: list[Found]) -> list[str]:
    return [f"{f.where}: {f.how} names {f.code!r}" for f in found if ErrorCode.lookup(f.code) is None]


# --- every code is in the catalogue ---------------------------------------------------


def test_every_code_the_code_raises_stores_or_sends_is_in_the_catalogue() -> None:
    found = found_codes()
    assert len(found) > 60, "the walk finds the codes (if this fails, the walk is broken)"
    assert _uncatalogued(found) == []


@pytest.mark.parametrize(
    "source",
    [
        'raise ApiError(422, "NEW_CODE", "a new refusal", "field")',
        'return error_response(418, "NEW_CODE", "a new refusal")',
        'outcome = Fail("NEW_CODE", "a new way to fail")',
        'outcome = ToolOutcome.failed("NEW_CODE", "a new tool failure")',
        'store.fail_claimed_run(run_id, fence, "NEW_CODE", "a new way to fail")',
        'end_run(conn, run_id, error_code="NEW_CODE")',
        'class NewError(AidaworkError):\n    code = "NEW_CODE"',
        'class NewError(AidaworkError):\n    code = ErrorCode.NEW_CODE',
        'NEW_CODE = "NEW_CODE"',
        'raise ApiError(400, f"HTTP_{status}", "a code built at run time")',
    ],
)
def test_the_walk_catches_a_new_code_in_each_kind_of_place(source: str) -> None:
    found = list(codes_in(ast.parse(source), "new.py"))
    assert _uncatalogued(found), found


def test_every_error_class_of_the_project_has_a_catalogued_code() -> None:
    """The same from the classes themselves (an inherited code included)."""
    classes = _error_classes()
    assert len(classes) > 30
    assert [c.__qualname__ for c in classes if ErrorCode.lookup(c.code) is None] == []


# --- every member is complete, and used -------------------------------------------------


@pytest.mark.parametrize("member", list(ErrorCode), ids=str)
def test_every_member_says_what_it_means_whether_to_retry_its_status_and_its_exit_code(member: ErrorCode) -> None:
    assert member.value == member.name and CODE_SHAPE.match(member.value)
    assert member.meaning.strip() and member.meaning[0].isupper() and member.meaning.endswith("."), member.meaning
    assert isinstance(member.retryable, bool)
    assert 400 <= member.http_status <= 599
    assert member.exit_code in (1, 2)  # what worker.cli.main exits with: 2 bad input, 1 anything else
    assert member == member.value and f"{member}" == member.value  # stored and sent as the string


def test_no_member_is_dead_unless_kept_on_purpose() -> None:
    used = {f.code for f in found_codes()}
    assert sorted(m.value for m in ErrorCode if m.value not in used and m.value not in UNUSED_ON_PURPOSE) == []
    assert sorted(code for code in UNUSED_ON_PURPOSE if code in used or ErrorCode.lookup(code) is None) == []
    assert all(reason.strip() for reason in UNUSED_ON_PURPOSE.values())


# --- the catalogue says what the code does ------------------------------------------------


def _error_classes() -> list[type[AidaworkError]]:
    for package in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            if ".migrations" not in info.name:
                importlib.import_module(info.name)
    found: list[type[AidaworkError]] = []
    pending: list[type[AidaworkError]] = [AidaworkError]
    while pending:
        cls = pending.pop()
        if cls.__module__.split(".")[0] in PACKAGES:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def _cli_input_errors() -> tuple[type[BaseException], ...]:
    """The errors ``worker.cli.main`` turns into exit 2: read from its ``except`` clauses that
    return ``_err(..., EXIT_INPUT)``. ``OwnerLimitsInvalid`` is made an ``OwnerInputError``
    (exit 2) by ``worker.cli.owner`` first."""
    import worker.cli.main
    from schema.wire.owners import OwnerLimitsInvalid

    path = Path(worker.cli.main.__file__)
    caught: list[type[BaseException]] = [OwnerLimitsInvalid]
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ExceptHandler) or node.type is None:
            continue
        returns = [s for s in node.body if isinstance(s, ast.Return) and isinstance(s.value, ast.Call)]
        if not any(isinstance(r.value, ast.Call) and ast.unparse(r.value.args[-1]) == "EXIT_INPUT" for r in returns):
            continue
        names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        caught.extend(getattr(worker.cli.main, ast.unparse(n)) for n in names)
    return tuple(caught)


def test_each_error_class_and_its_member_agree_on_retrying_status_and_exit_code() -> None:
    from worker.api.errors import STATUS_OF

    input_errors = _cli_input_errors()
    disagreements = []
    for cls in _error_classes():
        member = ErrorCode.lookup(cls.code)
        if member is None or "code" not in vars(cls):
            continue  # not catalogued: the test above names it; inherited: its owner is checked
        status = next((s for c, (s, _) in STATUS_OF.items() if issubclass(cls, c)), 503 if cls.retryable else 500)
        expected = (cls.retryable, status, 2 if issubclass(cls, input_errors) else 1)
        actual = (member.retryable, member.http_status, member.exit_code)
        if actual != expected:
            disagreements.append(f"{cls.__qualname__} {member}: catalogue {actual}, code {expected}")
    assert disagreements == []


def test_a_status_the_api_sends_a_code_with_is_its_status_or_named_in_its_meaning() -> None:
    """``ApiError(400, ErrorCode.REQUEST_INVALID, ...)``: a code sent with more than one
    status records its main one and says the others in its meaning."""
    other: list[str] = []
    for path in sorted((ROOT / "worker").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _callee(node) in ("ApiError", "error_response") and len(node.args) > 1:
                status, code = node.args[0], _code_in(node.args[1])
                member = ErrorCode.lookup(code or "")
                if not (isinstance(status, ast.Constant) and isinstance(status.value, int) and member is not None):
                    continue
                if status.value != member.http_status and f"HTTP {status.value}" not in member.meaning:
                    other.append(f"{path.relative_to(ROOT)}:{node.lineno}: {status.value} {member}")
    assert other == []


def test_the_http_guides_status_table_agrees_with_the_catalogue() -> None:
    guide = (ROOT / "docs" / "how-to" / "http-api.md").read_text()
    rows = re.findall(r"^\| (\d{3}) \| ((?:`[A-Z_]+`(?:, )?)+) \|", guide, flags=re.M)
    assert rows, "the HTTP guide's table of statuses and codes"
    disagreements = []
    for status, codes in rows:
        for code in re.findall(r"`([A-Z_]+)`", codes):
            member = ErrorCode.lookup(code)
            if member is None or (member.http_status != int(status) and f"HTTP {status}" not in member.meaning):
                disagreements.append(f"{status} {code}")
    assert disagreements == []


def test_the_api_sends_a_code_outside_the_catalogue_as_internal_error() -> None:
    from worker.api.errors import catalogued

    assert catalogued("ROOT_BUSY") is ErrorCode.ROOT_BUSY
    assert catalogued("OUT_OF_STOCK") is ErrorCode.INTERNAL_ERROR  # a plugin tool's own code

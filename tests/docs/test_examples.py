"""Every checked block of README.md and docs/ is one test, ``README.md:24`` or
``docs/how-to/webhooks.md:42`` (the line of its opening fence): what each kind must do is
in tests/docs/blocks.py. A page's python blocks share one namespace and run in order; one
that fails stops the page's later python blocks (each fails naming it)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.docs.blocks import (
    Block,
    Page,
    PythonFailed,
    RequestRefused,
    ShellFailed,
    check_run_request,
    new_namespace,
    pages,
    parse,
    request_runtime,
    run_python,
    run_shell,
)
from tests.docs.stack import PythonPages, Stack
from tests.support.env import BROKER_URL, PG_BASE

PAGES: list[Page] = [parse(path) for path in pages()]
BLOCKS: list[Block] = [b for page in PAGES for b in page.blocks if b.kind is not None]
# The shell blocks may take as long as blocks.SHELL_TIMEOUT_S; the signal method fails this
# test alone (the thread method would end the whole run).
TIMEOUT = pytest.mark.timeout(120, method="signal")


@pytest.fixture(scope="module")
def runtime() -> Any:
    from worker.ops.settings import Settings

    # The client's checks with the stack's settings; building them opens no connection.
    return request_runtime(Settings(database_url=f"{PG_BASE}/aidawork_docs", broker_url=BROKER_URL, dev=True))


@TIMEOUT
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block(block: Block, request: pytest.FixtureRequest) -> None:
    if block.skip is not None:
        pytest.skip(f"docs-test: skip: {block.skip}")
    failure: str | None = None
    if block.kind == "json":
        try:
            check_run_request(block, request.getfixturevalue("runtime"))
        except RequestRefused as exc:
            failure = str(exc)
    elif block.kind == "python":
        python: PythonPages = request.getfixturevalue("python_stack")
        if block.page in python.failed:
            pytest.fail(f"not run: the page's earlier python block {python.failed[block.page]} failed", pytrace=False)
        namespace = python.namespaces.get(block.page)
        if namespace is None:
            namespace = python.namespaces[block.page] = new_namespace(block.page)
        python.failed[block.page] = block.id  # until it has run to its end
        try:
            run_python(block, namespace)
        except PythonFailed as exc:
            failure = str(exc)
        else:
            del python.failed[block.page]
    else:
        stack: Stack = request.getfixturevalue("docs_stack")
        try:
            run_shell(block, stack.env)
        except ShellFailed as exc:
            failure = str(exc)
    if failure is not None:
        pytest.fail(failure, pytrace=False)  # the message says it all: no harness traceback


def test_markers() -> None:
    """Every ``docs-test`` comment is well formed and right before a fence."""
    problems = [f"{p.id}: {p.message}" for page in PAGES for p in page.problems]
    assert not problems, "\n".join(problems)

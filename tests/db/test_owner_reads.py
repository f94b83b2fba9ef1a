"""Another owner's run or Root costs the API exactly the work of a missing one: the app
(in process, on a real PostgreSQL) runs the same statements for both, each naming the
owner in its WHERE clause, and answers 404 for both."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import anyio
import httpx
from sqlalchemy import event

from tests.support.env import BROKER_URL
from tests.support.store import submit
from worker.api import create_app
from worker.ops.settings import Settings

OWNER_IN_WHERE = re.compile(r"WHERE .*owner = %\(owner\)s", re.DOTALL)
TOKEN_A, TOKEN_B = "owner-a-" + "a" * 16, "owner-b-" + "b" * 16


def requests_for(run_id: uuid.UUID, root_id: uuid.UUID) -> dict[str, tuple[str, str, Any]]:
    delivery = {"tool_call_id": "call_0_0", "files": {"docs/a.md": "# A\n"}}
    return {
        "status": ("GET", f"/v1/runs/{run_id}", None),
        "events": ("GET", f"/v1/runs/{run_id}/events", None),
        "cancel": ("POST", f"/v1/runs/{run_id}/cancel", None),
        "deliver": ("POST", f"/v1/runs/{run_id}/deliveries", delivery),
        "resolve": ("POST", f"/v1/runs/{run_id}/prerequisites", {"key": "k", "value": 1}),
        "root": ("GET", f"/v1/roots/{root_id}/runs", None),
        "rounds": ("GET", f"/v1/runs/{run_id}/rounds", None),
        "stream-token": ("POST", f"/v1/runs/{run_id}/stream-token", None),
    }


def test_another_owners_run_costs_the_same_statements_as_a_missing_one(ctx: Any, db_url: str) -> None:
    theirs = submit(ctx.engine, owner="team-a")
    settings = Settings(
        database_url=db_url,
        broker_url=BROKER_URL,
        api_tokens=json.dumps({TOKEN_A: "team-a", TOKEN_B: "team-b"}),
    )
    app = create_app(settings, lambda: ctx)
    statements: list[str] = []
    event.listen(ctx.engine, "before_cursor_execute", lambda conn, cur, statement, *rest: statements.append(statement))

    def attempt(token: str, method: str, url: str, body: Any) -> tuple[int, str, list[str]]:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                return await http.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"})

        statements.clear()
        response = anyio.run(go)
        return response.status_code, response.json()["error"]["code"], list(statements)

    missing = requests_for(uuid.uuid4(), uuid.uuid4())
    for name, request in requests_for(theirs.run_id, theirs.root_id).items():
        as_b = attempt(TOKEN_B, *request)
        as_missing = attempt(TOKEN_B, *missing[name])
        assert as_b == as_missing, name  # status, code and every statement run
        assert as_b[0] == 404 and as_b[2], name
        # Found or not by the WHERE clause itself, not by a check after the row was loaded.
        assert all(OWNER_IN_WHERE.search(statement) for statement in as_b[2]), (name, as_b[2])
    # The owner itself is served (the requests above were refused for the owner, not the shape).
    served = attempt(TOKEN_A, "POST", f"/v1/runs/{theirs.run_id}/deliveries", {"tool_call_id": "x", "files": {}})
    assert served[:2] == (409, "DELIVERY_REFUSED")

"""The run inspector at ``/ui``: one static page (``static/inspector.html``, vanilla JS,
no build step) shipped as package data. It talks to the JSON API like any client: the
bearer token a person signs in with is kept in the tab's ``sessionStorage`` and sent as
the ``Authorization`` header, never put in a URL; the live event stream uses a
short-lived stream token (``worker.api.stream_tokens``)."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from schema.wire import EventKind

router = APIRouter()

# The page loads no third-party code, so it allows only itself (and inline code: the page
# is one file). No framing: the forms act on runs.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _page() -> str:
    page = (files("worker.api") / "static" / "inspector.html").read_text(encoding="utf-8")
    # The stream's event names, from the one enum, so the page follows every kind there is.
    return page.replace("/*EVENT_KINDS*/[]", json.dumps([kind.value for kind in EventKind]))


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
def inspector() -> HTMLResponse:
    return HTMLResponse(_page(), headers=_HEADERS)

"""For upstream services over HTTP (``aidawork api``): runs, their events and answers, the inspector.
Beside ``worker.engine`` and never importing it; imported only by ``worker.cli``.
May import ``worker.client``, ``worker.ops``, ``runtime`` and ``schema``.

One module per concern:

- ``app``: ``create_app`` builds the FastAPI app (routes, handlers, middleware, access log);
- ``routes``: the endpoints; ``models``: their request and response bodies;
- ``auth``: bearer tokens and their owners; ``deps``: what each route is given;
- ``limits``: how large and how slowly a body may arrive; ``server``: uvicorn and the
  connection-level limits (header deadline, connection cap);
- ``streams``: server-sent event streams; ``errors``: every refusal and the last word on
  a crash.
"""

from worker.api.app import create_app

__all__ = ["create_app"]

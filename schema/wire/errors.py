"""The one error base of the project. It lives in ``schema.wire`` so that the store and
the core (which may import ``schema.wire``, and nothing else of ``schema``) share it.

Every error carries a stable ``code`` (what a client or operator matches on) and says
whether retrying the same thing can help (``retryable``).
"""

from __future__ import annotations


class AidaworkError(Exception):
    """Base of every error this project raises on purpose."""

    code = "AIDAWORK_ERROR"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

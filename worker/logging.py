"""structlog set-up: JSON lines on stderr. Per-task context (run_id, boundary_seq,
claim_fence, task_id) is bound with contextvars, which are per thread, so rounds
running side by side in the threads pool do not mix their fields."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


bind = structlog.contextvars.bind_contextvars
clear = structlog.contextvars.clear_contextvars

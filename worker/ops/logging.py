"""structlog set-up: every line a process writes on stderr is one JSON object.

Our own loggers (structlog) and every stdlib logger (Celery, kombu, uvicorn, Tornado and
Flower, Alembic, Python ``warnings``) end in one stdlib handler whose
``ProcessorFormatter`` renders JSON, so a line from a library looks like ours: ``event``
(the message), ``log_level``, ``logger``, ``timestamp``, and ``exception`` as text when
there is one. An exception nobody caught (in the main thread or any other) is logged as
``exception_uncaught`` instead of Python's plain-text traceback.

Per-task context (run_id, boundary_seq, claim_fence, task_id) is bound with contextvars,
which are per thread, so rounds running side by side in the threads pool do not mix
their fields. One level, ``AIDAWORK_LOG_LEVEL``, applies to every logger of the process.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType

import structlog
from structlog.types import Processor

# The processors a stdlib record and a structlog event share, before rendering.
_SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def _json_handler() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    return handler


CELERY_PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def configure_logging(level: str = "INFO", *, whole_process: bool = True) -> None:
    """Route every logger of this process to one JSON handler on stderr, at ``level``.
    Safe to call again (a later call replaces the handler and the level).

    ``whole_process=False`` is for the client library inside someone else's program: an
    application that configured logging keeps its handlers, its level, its warnings and
    its excepthooks, and our lines are JSON printed to stderr beside them."""
    root = logging.getLogger()
    if not whole_process and root.handlers:
        structlog.configure(
            processors=[  # _SHARED but the logger name, which needs a stdlib logger
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
        return
    for old in list(root.handlers):  # basicConfig or an earlier call
        root.removeHandler(old)
    root.addHandler(_json_handler())
    root.setLevel(level)
    # Celery's per-task lines ("Task ... received", "... succeeded in") say again what
    # round_claimed / round_committed say, bound with the run: two more lines per round
    # unless asked for with DEBUG.
    number = logging.getLevelName(level)
    chatty = number if number <= logging.DEBUG else max(number, logging.WARNING)
    for name in CELERY_PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(chatty)
    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    if not whole_process:
        return
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    structlog.get_logger("aidawork").critical("exception_uncaught", error=kind.__name__, exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    structlog.get_logger("aidawork").critical(
        "exception_uncaught",
        error=args.exc_type.__name__,
        thread=args.thread.name if args.thread is not None else None,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


bind = structlog.contextvars.bind_contextvars
clear = structlog.contextvars.clear_contextvars

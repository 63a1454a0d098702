"""Logging set-up: the one place structlog (and the stdlib ``logging`` under it) is configured.

Services call ``configure_logging(json=True, service="commitlog")`` once at start-up and log JSON lines
to stderr, which is what log collectors on Kubernetes expect; the CLI uses ``json=False`` for readable
``key=value`` lines. Libraries that log through the stdlib (grpc) are routed through the same renderer,
at WARNING and above, so every line on stderr has one format.

A log line that cannot be written (stderr is a file on a full disk, a closed pipe) is dropped and
counted (``lost_log_lines``), never raised: a log call sits in every error path, and an exception
from it would end the thread that made it (a replication thread, a clean-up loop) for good.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TextIO

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

__all__ = ["configure_logging", "get_logger", "lost_log_lines"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


_lost_lock = threading.Lock()
_lost = 0
_last_loss = ""


def _note_lost(error: BaseException | None) -> None:
    global _lost, _last_loss
    with _lost_lock:
        _lost += 1
        _last_loss = f"{type(error).__name__}: {error}" if error is not None else "unknown error"


def lost_log_lines() -> tuple[int, str]:
    """Log lines this process could not write since it started, and why the last one could not."""
    with _lost_lock:
        return _lost, _last_loss


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Our stdlib handler, marked by its class so a second configure_logging replaces it."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        # The stdlib would print a traceback to stderr, which is what just failed.
        _note_lost(sys.exc_info()[1])


class _NamedWriteLogger(structlog.WriteLogger):
    """A WriteLogger that knows the name it was asked for, so lines can carry ``logger``, and that
    drops (and counts) a line it cannot write instead of raising into the caller."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name

    def msg(self, message: str) -> None:
        try:
            super().msg(message)
        except (OSError, ValueError) as e:  # ValueError: the file was closed
            _note_lost(e)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class _NamedWriteLoggerFactory:
    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: object) -> _NamedWriteLogger:
        return _NamedWriteLogger(self._file, str(args[0]) if args else "")


def configure_logging(json: bool = True, level: str = "info", service: str | None = None) -> None:
    """Configure structlog and stdlib logging; calling it again replaces the previous set-up.

    ``json``: JSON lines (services) or key-value console lines without colours (CLI).
    ``level``: lowest level emitted by structlog loggers (debug, info, warning, error, critical);
    stdlib loggers emit WARNING and above (or ``level`` if higher).
    ``service``: added to every line as ``service``.
    """
    numeric = _LEVELS.get(level.lower())
    if numeric is None:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(_LEVELS)}")

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        _add_logger_name,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if service is not None:
        shared.append(_add_service(service))
    renderer: Processor
    if json:
        # Tracebacks as data, without local variables: they can hold message bodies and get large.
        tracebacks = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
        shared += [structlog.processors.StackInfoRenderer(), tracebacks]
        renderer = structlog.processors.JSONRenderer()
    else:
        shared.append(structlog.processors.StackInfoRenderer())
        renderer = structlog.dev.ConsoleRenderer(colors=False)

    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_NamedWriteLoggerFactory(sys.stderr),
        # Not cached: structlog.testing.capture_logs must keep working for loggers made at import time.
        cache_logger_on_first_use=False,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(logging.WARNING, numeric))


def get_logger(name: str, **initial_values: object) -> FilteringBoundLogger:
    """A structlog logger whose lines carry ``logger=name`` (and any initial values).

    configure_logging makes every logger a filtering bound logger; structlog types get_logger as Any."""
    logger: FilteringBoundLogger = structlog.get_logger(name, **initial_values)
    return logger


def _add_logger_name(logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """``logger``: the stdlib record's name for foreign lines, else the name given to get_logger."""
    record = event_dict.get("_record")
    name = record.name if record is not None else getattr(logger, "name", "")
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


def _add_service(service: str) -> Processor:
    def add_service(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("service", service)
        return event_dict

    return add_service

"""The daemon's log: one line per request, its fields quoted so that no value can forge a line;
the warnings a plugin logs while a request runs go to that request's stderr instead. Text lines
(no timestamps under systemd: the journal adds them) or JSON lines (:mod:`pycni.sdk.logs`)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Iterator
from typing import TextIO

from pycni.sdk import logs

log = logging.getLogger("pycni.serve")

CAPTURED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("pycni_serve_stderr", default=None)


def field(text: str, limit: int = 80) -> str:
    """``text`` as one log field: as it is when printable without spaces, else quoted (and cut),
    so no value can forge a line or shift the fields after it."""
    if text and len(text) <= limit and text.isprintable() and " " not in text:
        return text
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class _JournalLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return logs.journal_prefix(record) + super().format(record)


class _Route(logging.Handler):
    """Warnings logged while a request runs go to that request's stderr (as an exec'd plugin's
    would, at its default level); the daemon's own records, and the plugins' records below
    warning when its level lets them through, go to its log (with their attachment)."""

    def __init__(self, stream: TextIO, fmt: str, journal: bool) -> None:
        super().__init__()
        self.stream = stream
        self.plain = logging.Formatter()
        self.addFilter(logs.AttachmentFilter())
        self.daemon: logging.Formatter
        self.other: logging.Formatter
        if fmt == "json":
            self.daemon = self.other = logs.JSONFormatter()
            return
        self.other = logs.TextFormatter(journal=journal)
        if journal:  # the journal timestamps each line itself, and reads the priority
            self.daemon = _JournalLine("pycni serve: %(message)s")
        else:
            self.daemon = logging.Formatter("%(asctime)s.%(msecs)03dZ pycni serve: %(message)s", "%Y-%m-%dT%H:%M:%S")
            self.daemon.converter = time.gmtime

    def emit(self, record: logging.LogRecord) -> None:
        own = record.name.startswith(log.name)
        sink = CAPTURED.get()
        if sink is not None and not own and record.levelno >= logging.WARNING:
            sink.append(self.plain.format(record) + "\n")
            return
        try:
            self.stream.write((self.daemon if own else self.other).format(record) + "\n")
            self.stream.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def logging_to(stream: TextIO, level: int | None = None, fmt: str = "text") -> Iterator[None]:
    """The daemon's log on ``stream`` for the block: its own request lines at info, the rest of
    pycni at warning, unless ``level`` (else ``$PYCNI_LOG_LEVEL``) says otherwise for all."""
    if level is None:
        level = logs.parse_level(os.environ.get(logs.LEVEL_ENV))
    root = logging.getLogger()
    handler = _Route(stream, fmt, logs.under_systemd(stream))
    root.addHandler(handler)
    saved = [(logger, logger.level) for logger in map(logging.getLogger, (*logs.LOGGERS, log.name))]
    for name in logs.LOGGERS:
        logging.getLogger(name).setLevel(level or logging.WARNING)
    log.setLevel(level or logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for logger, old in saved:
            logger.setLevel(old)

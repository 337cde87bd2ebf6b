"""The daemon's log: one line per request, its fields quoted so that no value can forge a line;
what a plugin logs while a request runs goes to that request's stderr instead."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Iterator
from typing import TextIO

log = logging.getLogger("pycni.serve")

CAPTURED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("pycni_serve_stderr", default=None)


def field(text: str, limit: int = 80) -> str:
    """``text`` as one log field: as it is when printable without spaces, else quoted (and cut),
    so no value can forge a line or shift the fields after it."""
    if text and len(text) <= limit and text.isprintable() and " " not in text:
        return text
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class _Route(logging.Handler):
    """Records logged while a request runs go to that request's stderr (as an exec'd plugin's
    ``logging.lastResort`` would print them); the daemon's own go to its log."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self.plain = logging.Formatter()
        self.daemon = logging.Formatter("%(asctime)s.%(msecs)03dZ pycni serve: %(message)s", "%Y-%m-%dT%H:%M:%S")
        self.daemon.converter = time.gmtime

    def emit(self, record: logging.LogRecord) -> None:
        sink = CAPTURED.get()
        if sink is not None and not record.name.startswith(log.name):
            if record.levelno >= logging.WARNING:
                sink.append(self.plain.format(record) + "\n")
            return
        try:
            self.stream.write(self.daemon.format(record) + "\n")
            self.stream.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def logging_to(stream: TextIO) -> Iterator[None]:
    root = logging.getLogger()
    handler = _Route(stream)
    root.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)

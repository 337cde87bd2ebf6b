"""Logging for the CLI, exec'd plugins and ``pycni serve``, on the standard :mod:`logging` module.

- One level: ``--log-level`` (the CLI) or ``$PYCNI_LOG_LEVEL`` (an exec'd plugin, the daemon);
  warning when neither is given, so a success prints nothing. It applies to pycni's own loggers
  (``pycni.*``, ``pycni_plugins.*``); other libraries stay at warning (pyroute2's debug output
  is its own business).
- The attachment a record belongs to: :func:`invocation` (entered by
  :meth:`~.plugin.Plugin.handle`, the one door of every way a plugin runs) holds its network,
  container ID, interface, plugin type and command in a context variable, which
  :func:`pycni.netns.run_in`'s workers inherit; every record made inside carries them.
- Lines on stderr (stdout carries CNI results): text (``time LEVEL logger: message fields``;
  on systemd's journal without the time, which the journal adds, and with the syslog priority
  prefix it reads) or JSON lines (``time``, ``level``, ``logger``, ``message`` and the fields).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from .request import PluginRequest

__all__ = [
    "LEVEL_ENV",
    "LEVELS",
    "FORMATS",
    "LOGGERS",
    "attachment_fields",
    "invocation",
    "parse_level",
    "under_systemd",
    "journal_prefix",
    "AttachmentFilter",
    "TextFormatter",
    "JSONFormatter",
    "configure",
]

#: How an exec'd plugin and the daemon learn the level (the CLI's ``--log-level`` reads it too).
LEVEL_ENV = "PYCNI_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
#: pycni's loggers: the level applies to these (and their children) only.
LOGGERS = ("pycni", "pycni_plugins")

#: The plugin type and request of the invocation running; its fields are read when a record is.
_current: contextvars.ContextVar[tuple[str, PluginRequest] | None] = contextvars.ContextVar(
    "pycni_log_invocation", default=None
)


def attachment_fields() -> Mapping[str, str]:
    """The current invocation's fields (network, container, ifname, plugin, command), or ``{}``."""
    current = _current.get()
    if current is None:
        return {}
    plugin_type, request = current
    fields = {
        "network": request.network_name,
        "container": request.container_id,
        "ifname": request.ifname,
        "plugin": plugin_type,
        "command": request.command,
    }
    return {k: v for k, v in fields.items() if v}


class invocation:
    """Records made within the block (its netns workers' included) carry this invocation's
    attachment; a delegate's block (same attachment, another plugin) replaces only the plugin.
    Entered on every plugin call, so it only remembers the request (a class: ~1 µs)."""

    __slots__ = ("current", "token")

    def __init__(self, plugin_type: str, request: PluginRequest) -> None:
        self.current = (plugin_type, request)

    def __enter__(self) -> None:
        self.token = _current.set(self.current)

    def __exit__(self, *exc: object) -> None:
        _current.reset(self.token)


def parse_level(text: str | None) -> int | None:
    """A level name (any case) or number as a :mod:`logging` level; ``None`` for ``None``/"";
    :class:`ValueError` for anything else."""
    if not text:
        return None
    if text.isdigit():
        return int(text)
    if text.lower() not in LEVELS:
        raise ValueError(f"unknown log level {text!r} (one of {', '.join(LEVELS)})")
    return int(logging.getLevelName(text.upper()))


def under_systemd(stream: TextIO | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` (stderr) is systemd's journal: ``$JOURNAL_STREAM`` names its device
    and inode. (``$INVOCATION_ID`` alone says only that systemd started the process: its
    output may go to a file, where timestamps are wanted; a child whose stderr was
    redirected inherits ``$JOURNAL_STREAM`` too, hence the comparison.)"""
    env = os.environ if env is None else env
    wanted = env.get("JOURNAL_STREAM", "")
    if not wanted:
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):  # a stream without an fd: not the journal
        return False
    return wanted == f"{st.st_dev}:{st.st_ino}"


def _value(text: str) -> str:
    # One field, never a forged one: spaces, quotes and unprintables are quoted.
    if text and text.isprintable() and not any(c in text for c in " \"'="):
        return text
    return json.dumps(text)


def _record_fields(record: logging.LogRecord) -> Mapping[str, str]:
    found: Mapping[str, str] = getattr(record, "cni", None) or {}
    return found


class AttachmentFilter(logging.Filter):
    """Stamps each record with the attachment of the invocation that made it (``record.cni``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "cni"):
            record.cni = attachment_fields()
        return True


#: syslog priorities, as journald reads them from a ``<N>`` prefix (sd-daemon.h).
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def journal_prefix(record: logging.LogRecord) -> str:
    """The ``<N>`` a line for the journal starts with: the record's syslog priority."""
    return f"<{_PRIORITY.get(record.levelno, 6)}>"


class TextFormatter(logging.Formatter):
    """``2026-01-02T03:04:05.678Z DEBUG pycni_plugins.kernel: message network=n container=c …``;
    on the journal ``<7>DEBUG pycni_plugins.kernel: …`` (it adds the time, reads the priority)."""

    def __init__(self, *, journal: bool = False) -> None:
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.levelname} {record.name}: {record.getMessage()}"
        fields = _record_fields(record)
        if fields:
            text += " " + " ".join(f"{k}={_value(v)}" for k, v in fields.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if self.journal:
            return journal_prefix(record) + text
        return f"{_timestamp(record)} {text}"


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    the attachment's fields when there is one, ``exception`` when there is a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_record_fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]  # typeshed's generic over the stream
    """Writes to ``sys.stderr`` as it is at each record (as ``logging.lastResort`` does), not to
    the one it was when configured (a test's captured stream, long closed)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr


_installed: list[logging.Handler] = []


def configure(
    level: int | None = None,
    *,
    fmt: str = "text",
    stream: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> logging.Handler:
    """Send pycni's records at ``level`` (else ``$PYCNI_LOG_LEVEL``, else warning) and everyone's
    warnings to ``stream`` (stderr) as ``fmt`` lines; replaces what an earlier call installed.
    Returns the handler (``pycni serve`` routes through its own, with the same formatters)."""
    env = os.environ if env is None else env
    chosen, bad = level, ""
    if chosen is None:
        try:
            chosen = parse_level(env.get(LEVEL_ENV)) or logging.WARNING
        except ValueError as e:
            chosen, bad = logging.WARNING, str(e)
    handler = logging.StreamHandler(stream) if stream is not None else _Stderr()
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter(journal=under_systemd(stream, env)))
    handler.addFilter(AttachmentFilter())
    root = logging.getLogger()
    for old in _installed:
        root.removeHandler(old)
    _installed[:] = [handler]
    root.addHandler(handler)
    for name in LOGGERS:
        logging.getLogger(name).setLevel(chosen)
    if bad:
        logging.getLogger("pycni").warning("$%s: %s; using warning", LEVEL_ENV, bad)
    return handler

"""Failpoints: named places where a fault can be injected, for the reliability suite.

``failpoint("bridge.veth-created")`` does nothing unless ``PYCNI_FAILPOINTS`` names it, e.g.
``PYCNI_FAILPOINTS=bridge.veth-created=kill`` (SIGKILL this process, as a crash would) or
``...=raise`` (raise a CNI error, as a failing kernel call would). Several entries are
separated by ``,``; ``name=kill@3`` fires on the third hit. The check is one dict lookup when
the variable is unset, so failpoints stay in production code at no cost.
"""

from __future__ import annotations

import os
import signal
import threading

from .errors import CNIError, ErrorCode

__all__ = ["failpoint", "reload"]

_actions: dict[str, tuple[str, int]] = {}
_hits: dict[str, int] = {}
_lock = threading.Lock()


def reload() -> None:
    """Re-read ``PYCNI_FAILPOINTS`` (tests change it at run time)."""
    _actions.clear()
    _hits.clear()
    for entry in filter(None, (e.strip() for e in os.environ.get("PYCNI_FAILPOINTS", "").split(","))):
        name, _, action = entry.partition("=")
        action, _, nth = (action or "kill").partition("@")
        _actions[name] = (action, int(nth or 1))


def failpoint(name: str) -> None:
    if not _actions or name not in _actions:
        return
    action, nth = _actions[name]
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != nth:
            return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise CNIError(f"injected fault at {name}", code=ErrorCode.INTERNAL)


reload()

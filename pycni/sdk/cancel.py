"""Cancelling a plugin call whose caller has gone: the waits a plugin may block in check it.

An exec'd plugin dies with its caller, so it needs none of this: without a :func:`scope` a wait
is the plain blocking call. ``pycni serve`` runs each request in a scope that says why the
request should stop (its caller hung up, its deadline passed) and is told when the request
blocks, so a worker blocked on one network's lock is free for other networks meanwhile. A
cancelled wait raises :class:`Cancelled` before the plugin holds the lock, so an ADD fails the
way any failed ADD does and undoes what it made.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import time
from collections.abc import Callable, Iterator

import attrs

from ..errors import CNIError, ErrorCode

__all__ = ["Cancelled", "Scope", "scope", "flock"]

_POLL_MIN = 0.001
_POLL_MAX = 0.05


class Cancelled(CNIError):
    """The call stopped before its next step: the caller has gone or its deadline passed."""

    default_code = ErrorCode.TRY_AGAIN_LATER


@attrs.frozen
class Scope:
    """``cancelled()`` says why the call should stop (else None); ``blocked``/``unblocked`` are
    called around each wait that would block."""

    cancelled: Callable[[], str | None]
    blocked: Callable[[], None] = lambda: None
    unblocked: Callable[[], None] = lambda: None


_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("pycni_cancel_scope", default=None)


@contextlib.contextmanager
def scope(current: Scope) -> Iterator[None]:
    """Run the body with ``current`` as the scope its waits check."""
    token = _SCOPE.set(current)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def flock(fd: int, what: str) -> None:
    """``flock(fd, LOCK_EX)``, which in a scope gives up with :class:`Cancelled` (``what`` names
    the lock in its message) once the scope says so."""
    current = _SCOPE.get()
    if current is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    current.blocked()
    try:
        pause = _POLL_MIN
        while True:
            why = current.cancelled()
            if why is not None:
                raise Cancelled(f"gave up waiting for {what}: {why}")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
    finally:
        current.unblocked()

"""``/proc/sys`` access for the calling thread's network namespace.

``/proc/sys/net`` resolves against the namespace of the thread that opens it, so host-side
callers use these directly and container-side code calls them inside
:func:`pycni.netns.run_in`. Paths are ``/``-separated below ``/proc/sys`` (an interface name
may contain dots, so the dotted sysctl form would be ambiguous).
"""

from __future__ import annotations

import os
from logging import DEBUG

from . import changes

__all__ = ["read", "write", "ensure"]

_ROOT = "/proc/sys/"


def _path(name: str) -> str:
    if name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"invalid sysctl path {name!r}")
    return _ROOT + name


def read(name: str) -> str:
    with open(_path(name)) as f:
        return f.read().strip()


def write(name: str, value: str | int) -> None:
    fd = os.open(_path(name), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)
    if changes.log.isEnabledFor(DEBUG):
        changes.sysctl(name, value)


def ensure(name: str, value: str | int) -> bool:
    """Write ``value`` unless it is already set (a peer may race us: both writes are equal).

    Returns whether a write happened.
    """
    if read(name) == str(value):
        return False
    write(name, value)
    return True

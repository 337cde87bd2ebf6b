"""``/proc/sys`` access for the calling thread's network namespace.

``/proc/sys/net`` resolves against the namespace of the thread that opens it, so host-side
callers use these directly and container-side code calls them inside
:func:`pycni.netns.run_in`. Paths are ``/``-separated below ``/proc/sys`` (an interface name
may contain dots, so the dotted sysctl form would be ambiguous).

Why ``net/ipv4/…`` and ``net/ipv6/…`` are opened below a kept directory: every namespace that
has looked at ``/proc/sys/net`` leaves its own ``ipv4``/``ipv6`` dentries under the one shared
``net`` dentry, all with the same name, so the kernel's lookup of ``ipv4`` walks one of them per
such namespace (``proc_sys_compare`` rejects the others). With 2000 container namespaces a read
of ``/proc/sys/net/ipv4/ip_forward`` took 250 µs instead of 6, with 5000 the host side of a
bridge ADD spent ~50 ms in its four accesses (docs/scale-and-dataplane.md). Below an open
``/proc/sys/net/ipv4`` of the same namespace the lookup stays at ~2 µs. So a thread that keeps
its netlink socket between calls (:func:`.links.keeps_sockets`: the main thread, ``pycni
serve``'s workers) also keeps these two directories of its current namespace, replaced when it
moves to another, closed when it ends; any other thread opens by full path and keeps nothing.
A kept directory of a namespace that died fails its lookups (``ENOENT``: its tables are
unregistered), so a reused namespace inode number never reaches it: the access is retried by
full path.
"""

from __future__ import annotations

import os
import threading
from logging import DEBUG

from pycni._fs import read_all

from . import changes
from .links import keeps_sockets, namespace_key

__all__ = ["read", "write", "ensure"]

_ROOT = "/proc/sys/"
_SPLIT = ("net/ipv4/", "net/ipv6/")  # the per-namespace directories below the shared ``net``


class _Dirs:
    """One namespace's kept directories (opened on first use); closed with the object."""

    def __init__(self, key: tuple[int, int, int]) -> None:
        self.key = key
        self.fds: dict[str, int] = {}

    def fd(self, top: str) -> int:
        if top not in self.fds:
            self.fds[top] = os.open(_ROOT + top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self.fds[top]

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            os.close(fd)

    def __del__(self) -> None:  # the thread ended: its thread-local goes, and with it these
        if self.key[0] == os.getpid():  # a forked child leaves the parent's alone
            self.close()


class _Kept(threading.local):
    dirs: _Dirs | None = None


_local = _Kept()


def _path(name: str) -> str:
    if name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"invalid sysctl path {name!r}")
    return _ROOT + name


def _kept_dirs() -> _Dirs:
    key = namespace_key()
    dirs = _local.dirs
    if dirs is None or dirs.key != key:
        if dirs is not None:
            dirs.close()
        dirs = _local.dirs = _Dirs(key)
    return dirs


def _open(name: str, flags: int) -> int:
    path = _path(name)
    top = next((d for d in _SPLIT if name.startswith(d)), None)
    if top is None or not keeps_sockets():
        return os.open(path, flags | os.O_CLOEXEC)
    dirs = _kept_dirs()
    try:
        return os.open(name[len(top) :], flags | os.O_CLOEXEC, dir_fd=dirs.fd(top))
    except FileNotFoundError:
        if _alive(dirs.fd(top)):
            raise  # the entry is missing, not the directory
        dirs.close()  # a dead namespace's directories under a reused inode number
    return os.open(path, flags | os.O_CLOEXEC)


def _alive(dir_fd: int) -> bool:
    """Whether a kept ``net/ipv4`` or ``net/ipv6`` still resolves (``conf`` is in both)."""
    try:
        os.stat("conf", dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def read(name: str) -> str:
    fd = _open(name, os.O_RDONLY)
    try:
        return read_all(fd, 4096).decode().strip()
    finally:
        os.close(fd)


def write(name: str, value: str | int) -> None:
    fd = _open(name, os.O_WRONLY)
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

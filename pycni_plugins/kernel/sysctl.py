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
``/proc/sys/net/ipv4`` of the same namespace the lookup stays at ~2 µs, so the directory is
opened once per namespace (the last :data:`_KEPT` namespaces) and every access is an
``openat`` below it. A kept directory of a namespace that died fails its lookups (``ENOENT``,
its tables are unregistered), and the access is retried by full path.
"""

from __future__ import annotations

import collections
import os
import threading

from .links import namespace_key

__all__ = ["read", "write", "ensure"]

_ROOT = "/proc/sys/"
_SPLIT = ("net/ipv4/", "net/ipv6/")  # the per-namespace directories below the shared ``net``
_KEPT = 16  # namespaces whose directories stay open (the host's is used at every ADD)
_lock = threading.Lock()
_dirs: collections.OrderedDict[tuple[tuple[int, int, int], str], int] = collections.OrderedDict()


def _path(name: str) -> str:
    if name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"invalid sysctl path {name!r}")
    return _ROOT + name


def _dir_fd(key: tuple[tuple[int, int, int], str]) -> int:
    """The kept directory ``key[1]`` of the namespace ``key[0]``, opened if needed."""
    with _lock:
        fd = _dirs.get(key)
        if fd is not None:
            _dirs.move_to_end(key)
            return fd
    fd = os.open(_ROOT + key[1], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the one slow lookup
    with _lock:
        if key in _dirs:  # another thread of the same namespace was quicker
            os.close(fd)
            return _dirs[key]
        _dirs[key] = fd
        while len(_dirs) > _KEPT * len(_SPLIT):
            os.close(_dirs.popitem(last=False)[1])
        return fd


def _forget(key: tuple[tuple[int, int, int], str]) -> None:
    with _lock:
        fd = _dirs.pop(key, None)
        if fd is not None:
            os.close(fd)


def _open(name: str, flags: int) -> int:
    path = _path(name)
    top = next((d for d in _SPLIT if name.startswith(d)), None)
    if top is None:
        return os.open(path, flags | os.O_CLOEXEC)
    key = (namespace_key(), top)
    rest = name[len(top) :]
    try:
        # Under the lock: an eviction must not close (and a reuse renumber) the directory meanwhile.
        with _lock:
            fd = _dirs.get(key)
            if fd is not None:
                return os.open(rest, flags | os.O_CLOEXEC, dir_fd=fd)
        dir_fd = _dir_fd(key)
        with _lock:
            if _dirs.get(key) == dir_fd:
                return os.open(rest, flags | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        _forget(key)  # maybe a dead namespace's directory under a reused inode number
    return os.open(path, flags | os.O_CLOEXEC)


def read(name: str) -> str:
    fd = _open(name, os.O_RDONLY)
    try:
        with os.fdopen(fd, closefd=False) as f:
            return f.read().strip()
    finally:
        os.close(fd)


def write(name: str, value: str | int) -> None:
    fd = _open(name, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def ensure(name: str, value: str | int) -> bool:
    """Write ``value`` unless it is already set (a peer may race us: both writes are equal).

    Returns whether a write happened.
    """
    if read(name) == str(value):
        return False
    write(name, value)
    return True

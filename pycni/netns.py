"""Network namespaces: the one place pycni enters one (``setns(2)``).

Entering is per thread, so a namespace is entered either by the calling thread for a block
(:func:`entered`) or by a short-lived worker thread (:func:`run_in`) that dies afterwards and so
can never be left in the wrong namespace. A missing namespace path is an error: nothing here
creates one by accident (``O_CREAT`` is never used on a netns path).

:func:`create`/:func:`remove` and :class:`Throwaway` make named namespaces for the demo, tests
and benchmarks; they import pyroute2 lazily.

:func:`bound` makes a namespace *path* stand for an already open fd within the current context
(copied into :func:`run_in`'s workers): ``pycni serve`` acts in exactly the namespace its caller
opened, while the plugin still sees, and reports, the path it was given.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import fcntl
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from .errors import CNIError, ErrorCode

__all__ = [
    "NetnsError",
    "entered",
    "call_in",
    "visiting",
    "run_in",
    "open_netns",
    "is_netns",
    "is_netns_fd",
    "bound",
    "identity",
    "own_identity",
    "create",
    "can_create",
    "remove",
    "Throwaway",
    "RUN_DIR",
]

CLONE_NEWNET = 0x40000000
_NS_GET_NSTYPE = 0xB703  # linux/nsfs.h: _IO(0xb7, 0x3)
RUN_DIR = "/run/netns"
_SELF = "/proc/thread-self/ns/net"
T = TypeVar("T")

_libc: ctypes.CDLL | None = None
# path -> an open namespace fd, or the errno opening the path failed with (see bound()).
_bound: contextvars.ContextVar[Mapping[str, int]] = contextvars.ContextVar("pycni_netns", default=MappingProxyType({}))


class NetnsError(CNIError, OSError):
    """A namespace could not be opened or entered (``errno`` says why; ENOENT = gone).

    A :class:`~pycni.errors.CNIError` (code 999, the text an uncaught ``OSError`` gave) so that
    it stays inside the one error tree wherever it surfaces (e.g. a runtime's bad
    ``host_netns``), and an ``OSError`` with ``errno``/``strerror`` for the callers that branch
    on why.
    """

    def __init__(self, err: int, strerror: str) -> None:
        CNIError.__init__(self, f"[Errno {err}] {strerror}", code=ErrorCode.INTERNAL)
        OSError.__init__(self, err, strerror)


def _setns(fd: int, what: str) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        reason = "not a network namespace" if err == errno.EINVAL else os.strerror(err)
        raise NetnsError(err, f"cannot enter network namespace {what}: {reason}")


def open_netns(path: str | int) -> int:
    """Open ``path`` (never creating it; an int is duplicated) and check that it is a network
    namespace; the caller closes the fd. Opened non-blocking: a FIFO planted as the netns path
    would otherwise block the open forever (with the container's lock held). Anything but a
    network namespace, such as the empty file a namespace was bind-mounted on before a reboot,
    is ``EINVAL``."""
    if isinstance(path, str):
        target = _bound.get().get(path)
        if target is not None:
            if target < 0:
                raise NetnsError(-target, f"failed to open netns {path!r}: {os.strerror(-target)}")
            path = target  # the namespace the caller opened for this path (see bound())
    try:
        fd = os.dup(path) if isinstance(path, int) else os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise NetnsError(e.errno or errno.EIO, f"failed to open netns {path!r}: {e.strerror}") from None
    if not is_netns_fd(fd):
        os.close(fd)
        raise NetnsError(errno.EINVAL, f"failed to open netns {path!r}: not a network namespace")
    return fd


def is_netns_fd(fd: int) -> bool:
    """Whether the open ``fd`` is a network namespace (``NS_GET_NSTYPE``; any other file: no)."""
    try:
        return fcntl.ioctl(fd, _NS_GET_NSTYPE) == CLONE_NEWNET
    except OSError:  # not an nsfs file
        return False


def is_netns(path: str) -> bool:
    """Whether ``path`` names a live network namespace (not just an existing file: where ``/run``
    is no tmpfs, the empty files namespaces were bind-mounted on outlive a reboot)."""
    if not path:
        return False
    try:
        os.close(open_netns(path))
    except NetnsError:
        return False
    return True


@contextlib.contextmanager
def bound(path: str, fd: int | None, error: int = 0) -> Iterator[None]:
    """Within the block (and the :func:`run_in` workers it starts), opening ``path`` gives a
    duplicate of ``fd`` — or, with ``fd`` None, fails with ``error`` as opening the path did."""
    if fd is None and not error:
        raise ValueError("bound() needs an fd or an errno")
    token = _bound.set({**_bound.get(), path: fd if fd is not None else -error})
    try:
        yield
    finally:
        _bound.reset(token)


def identity(path: str) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of the namespace ``path`` names (through :func:`bound` if bound)."""
    target = _bound.get().get(path)
    if target is None:
        st = os.stat(path)
    elif target >= 0:
        st = os.fstat(target)
    else:
        raise NetnsError(-target, os.strerror(-target))
    return st.st_dev, st.st_ino


def own_identity() -> tuple[int, int]:
    """``(st_dev, st_ino)`` of the calling thread's network namespace: ``fstat`` of the fd an
    enclosing :func:`entered` holds (every ``setns`` pycni makes goes through it), else a
    ``stat`` of ``/proc/thread-self/ns/net``."""
    fd: int | None = getattr(_inside, "fd", None)
    st = os.stat(_SELF) if fd is None else os.fstat(fd)
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def entered(path: str | int | None) -> Iterator[None]:
    """Run the block with the *calling thread* in ``path``'s namespace (``None``: no change).

    Blocks on one thread must nest strictly (leave an inner block before its outer one, as
    ``with`` does): an inner block returns through the outer block's fd, which the outer block
    closes when it ends."""
    if path is None:
        yield
        return
    target = open_netns(path)
    # Inside another entered() on this thread the way back is that block's namespace, whose fd
    # it holds open until it has left: no need to open /proc/thread-self/ns/net again.
    outer: int | None = getattr(_inside, "fd", None)
    saved = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC) if outer is None else outer
    try:
        _setns(target, repr(path))
        _inside.fd = target
        try:
            yield
        finally:
            _inside.fd = outer
            # Failing to get back would leave this thread in a foreign namespace: never ignore it.
            _setns(saved, "(original)")
    finally:
        os.close(target)
        if outer is None:
            os.close(saved)


def call_in(path: str | int | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` with the *calling thread* in ``path``'s namespace for its duration (:func:`entered`).

    No thread to start and wait for: ~0.01 ms where :func:`run_in` costs ~0.05 ms on an idle
    host and a scheduler round trip or more on a loaded one. Only for work whose sockets are
    opened and closed within ``fn``: what a thread keeps per namespace (its netlink socket, its
    sysctl directories) asks :func:`visiting` first and keeps nothing of a namespace visited.
    """
    with entered(path):
        _visits.depth = getattr(_visits, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _visits.depth -= 1


_visits = threading.local()
#: ``fd``: the namespace the innermost :func:`entered` block of this thread put it in (its open fd).
_inside = threading.local()


def visiting() -> bool:
    """Whether the calling thread is inside :func:`call_in`: in a namespace only for a while,
    where nothing may be kept for later."""
    return getattr(_visits, "depth", 0) > 0


def run_in(path: str | int | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` in a fresh thread that has entered ``path``; return or raise what it did.

    Sockets (pyroute2, libnftables) created inside ``fn`` stay bound to that namespace. The
    thread exits afterwards, so it needs no way back. ``None`` runs ``fn`` here.
    """
    if path is None:
        return fn(*args, **kwargs)
    fd = open_netns(path)
    returned: list[T] = []
    raised: list[BaseException] = []

    def body() -> None:
        try:
            _setns(fd, repr(path))
            returned.append(fn(*args, **kwargs))
        except BaseException as e:
            raised.append(e)

    try:
        context = contextvars.copy_context()
        worker = threading.Thread(target=context.run, args=(body,), name=f"netns:{path}", daemon=True)
        worker.start()
        worker.join()
    finally:
        os.close(fd)
    if raised:
        raise raised[0]
    return returned[0]


def _path(name: str) -> str:
    return name if "/" in name else f"{RUN_DIR}/{name}"


#: What making a named namespace takes: unshare(CLONE_NEWNET) and the bind mount under /run/netns.
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21


def can_create() -> bool:
    """Whether this process has what :func:`create` needs (CAP_SYS_ADMIN and CAP_NET_ADMIN in
    its effective set: root, unless its capabilities were dropped)."""
    try:
        with open("/proc/self/status") as f:
            effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return all(effective >> cap & 1 for cap in (_CAP_NET_ADMIN, _CAP_SYS_ADMIN))


def create(name: str) -> str:
    """Create a named namespace (as ``ip netns add``); returns its path."""
    from pyroute2 import netns as _pnetns

    path = _path(name)
    if os.path.exists(path):
        raise NetnsError(errno.EEXIST, f"network namespace {name!r} already exists")
    _pnetns.create(path)
    return path


def remove(name: str) -> None:
    """Unmount and unlink a named namespace; a missing one is fine."""
    path = _path(name)
    if not os.path.exists(path):
        return
    from pyroute2 import netns as _pnetns

    _pnetns.remove(path)


class Throwaway:
    """A named namespace that exists for the ``with`` block (removed even on failure).

    ``lo`` is brought up so the namespace behaves like a host.
    """

    def __init__(self, prefix: str = "pycni", name: str | None = None) -> None:
        self.name = name or f"{prefix}-{secrets.token_hex(4)}"
        self.path = _path(self.name)

    def __enter__(self) -> Throwaway:
        create(self.name)
        try:
            run_in(self.path, _lo_up)
        except BaseException:
            remove(self.name)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        remove(self.name)

    def __repr__(self) -> str:
        return f"Throwaway({self.path!r})"


def _lo_up() -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")

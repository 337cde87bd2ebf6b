"""Small JSON records under pycni's state dir (the request's ``state_dir``: the runtime's
``state_dir`` in-process, ``$PYCNI_STATE_DIR`` exec'd, default ``/run/pycni``).

``/run`` is a tmpfs on a systemd host, which fits: the records describe kernel state (nftables
elements, veths) that a reboot wipes too. Where ``/run`` survives a reboot, the records outlive
what they describe; the epoch check in :mod:`.nft` and ``pycni gc --reconcile`` deal with that.
Directories are 0700 and files 0600; the state dir itself and every path below it are opened
with ``O_NOFOLLOW`` (below it, relative to a directory fd), so a symlink planted there is
refused (``IO_FAILURE``) rather than followed.

Writes are atomic (:func:`pycni._fs.write_atomic`): a reader, or a crash of the writing
process, sees a record's old content or its new one, never a part. They are not durable (no
fsync; the directories' entries are, made once with :func:`pycni._fs.make_dirs`): only a power
cut or a kernel crash loses what is not synced yet, and either wipes the kernel state the
records describe, so a durable record would only outlive what it describes (on a disk-backed
state dir each fsync costs ~0.1-0.2 ms, 16 per ADD of the default chain). A record such a
reboot left empty or torn (not JSON) reads as none, as after a lost state dir (nft's DEL
searches for the elements of a torn record, and a torn epoch is claimed anew); the next write
of the record, or its attachment's DEL, replaces or removes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal, overload

from pycni._fs import check_private_dir, kept_dirs, make_dirs, read_all, write_atomic
from pycni._json import dumps_compact_ascii
from pycni.errors import CNIError, ErrorCode

__all__ = ["Records"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _check_name(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"invalid record name {name!r}")
    return name


class Records:
    """The records of one kind (``sub``, a directory below the state dir ``root``)."""

    def __init__(self, sub: str, root: str) -> None:
        if not root:
            raise ValueError("a state dir is required")
        self.sub = _check_name(sub)
        self.root = root

    @overload
    def _dir(self, create: Literal[True]) -> contextlib.AbstractContextManager[int]: ...
    @overload
    def _dir(self, create: Literal[False]) -> contextlib.AbstractContextManager[int | None]: ...
    def _dir(self, create: bool) -> contextlib.AbstractContextManager[int | None]:
        """The open directory fd; ``None`` (only without ``create``) when it does not exist."""
        # Kept open between calls (an lstat of the state dir and an fstatat of this kind's dir
        # instead of making, opening and checking both): see pycni._fs.KeptDirs for when not.
        return kept_dirs.use((self.root, self.sub), lambda: self._opened(create))

    def _opened(self, create: bool) -> tuple[int, int] | None:
        """The state dir and this kind's dir opened the slow way; ``None`` (only without
        ``create``) when either does not exist."""
        root = self.root
        try:
            top = _open_or_make(root, create, lambda: make_dirs(root))
        except FileNotFoundError:
            if create:
                raise
            return None
        except OSError as e:  # a symlink (O_NOFOLLOW) or a file where the directory should be
            raise _refused(root, e) from None
        try:
            fd = self._open_kind(top, create)
        except BaseException:
            os.close(top)
            raise
        if fd is None:
            os.close(top)
            return None
        return top, fd

    def _open_kind(self, top: int, create: bool) -> int | None:
        path = f"{self.root}/{self.sub}"
        try:
            fd = _open_or_make(self.sub, create, lambda: make_dirs(self.sub, dir_fd=top), dir_fd=top)
        except FileNotFoundError:
            if create:
                raise
            return None
        except OSError as e:
            raise _refused(path, e) from None
        try:
            check_private_dir(fd, f"state dir {path}")
        except PermissionError as e:
            os.close(fd)
            raise _refused(path, e) from None
        return fd

    def load(self, name: str, torn: Any = None) -> Any | None:
        """The record's data; ``None`` when there is none, ``torn`` when it is there but is not
        JSON (see the module docstring)."""
        with self._dir(create=False) as d:
            if d is None:
                return None
            try:
                fd = os.open(_check_name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
            except FileNotFoundError:
                return None
            try:
                data = read_all(fd)
            finally:
                os.close(fd)
        try:
            return json.loads(data)
        except ValueError:
            return torn

    def store(self, name: str, data: Any) -> None:
        with self._dir(create=True) as d:
            write_atomic(d, _check_name(name), _payload(data), durable=False)

    def create(self, name: str, data: Any) -> bool:
        """Write the record only if there is none (atomically: the first of racing writers
        wins); False when it already existed."""
        with self._dir(create=True) as d:
            return write_atomic(d, _check_name(name), _payload(data), exclusive=True, durable=False)

    def remove(self, name: str) -> bool:
        with self._dir(create=False) as d:
            if d is None:
                return False
            try:
                os.unlink(_check_name(name), dir_fd=d)
            except FileNotFoundError:
                return False
            return True

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this kind's lock (``<sub>/.lock``, an exclusive ``flock``; made with the dir),
        which serialises what must not interleave between processes (a DEL and a heal)."""
        with self._dir(create=True) as d:
            fd = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def names(self) -> list[str]:
        with self._dir(create=False) as d:
            if d is None:
                return []
            # A listing of its own: a kept fd's offset is shared with every thread using it.
            listed = os.open(".", _DIR_FLAGS, dir_fd=d)
        try:
            return sorted(n for n in os.listdir(listed) if not n.startswith("."))
        finally:
            os.close(listed)


def _open_or_make(path: str, create: bool, make: Callable[[], None], dir_fd: int | None = None) -> int:
    """Open the directory; made first only when it is missing and ``create`` (no mkdir, and
    no makedirs' stats, for one that exists)."""
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # a racing maker
        make()
    return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)


def _refused(path: str, e: OSError) -> CNIError:
    reason = "it is a symlink" if e.errno == errno.ELOOP or os.path.islink(path) else e.strerror
    return CNIError(f"refusing state dir {path}: {reason}", code=ErrorCode.IO_FAILURE)


def _payload(data: Any) -> bytes:
    return dumps_compact_ascii(data).encode()

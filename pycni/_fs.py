"""The file rules the runtime and the plugins share: the ownership rule for pycni's private
directories (results cache, plugin state records), the rule for a path root runs or trusts
(installed plugins, later the daemon's socket), the one atomic write, and the directory fds a
process keeps open for those directories between calls.

Both sides trust a directory for the same reasons: what is in it decides what DEL and GC remove,
so a directory that another uid owns, or that anyone else may read or write, could hold planted
entries. And both write a file the same way: a reader sees the old content or the new, never a
part, and so does a crash of the process; after a power cut too where the write is durable
(the results cache, installed plugins; not the plugins' state records, see
:mod:`pycni_plugins.kernel.state`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar, cast, overload

__all__ = [
    "KeptDirs",
    "check_private_dir",
    "kept_dirs",
    "make_dirs",
    "read_all",
    "unsafe_ancestor",
    "write_atomic",
]

_Fd = TypeVar("_Fd", bound="int | None", covariant=True)

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Temp files are named by pid (kept here: os.getpid is a syscall each time) and a number;
#: next() on the count is atomic, so no two threads get one number.
_temp_pid = os.getpid()
_temp_numbers = itertools.count()


def check_private_dir(fd: int, what: str) -> None:
    """Raise ``PermissionError`` unless the open directory ``fd`` is owned by this process's
    effective uid with no group/other permission bits (0700 or less)."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(
            errno.EPERM,
            f"{what} must be private to uid {os.geteuid()} (owned by it, mode 0700), "
            f"but is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}",
        )


def unsafe_ancestor(path: str) -> str | None:
    """Why another uid could replace what is at ``path`` (``None``: none could), as sshd's
    StrictModes judges: ``path`` (when it exists) and every ancestor must be owned by root or
    this process's effective uid, and none writable by group or others — but an ancestor that
    is sticky (as /tmp), whose entries only their owners may rename. Symlinks are resolved
    first, so their targets are judged."""
    euid = os.geteuid()
    target = current = os.path.realpath(path)
    while True:
        try:
            st = os.stat(current)
        except FileNotFoundError:
            pass  # to be made, by us
        else:
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid not in (0, euid):
                return f"{current} is owned by uid {st.st_uid}, neither root nor {euid}"
            if mode & 0o022 and (current == target or not mode & stat.S_ISVTX):
                return f"{current} is writable by group or others (mode {mode:04o})"
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def write_atomic(
    dir_fd: int, name: str, data: bytes, *, mode: int = 0o600, exclusive: bool = False, durable: bool = True
) -> bool:
    """Put ``data`` at ``name`` in the open directory ``dir_fd`` in one step, durably unless
    told otherwise.

    The bytes go to a fresh temp file (exactly ``mode``), are fsync'd, and the file is renamed
    over ``name`` (or, ``exclusive``, hard-linked to it: the first of racing writers wins and
    the others get False); then the directory is fsync'd. On any failure the temp file is
    removed and ``name`` keeps its old content; the ``OSError`` is the caller's to translate.
    Not ``durable``, both fsyncs are left out: readers and a crash of the process still see the
    old content or the new, but after a power cut the file may be missing, empty or torn — for
    files describing what the reboot wipes anyway (each fsync costs ~0.1-0.2 ms on a disk).
    """
    tmp, fd = _temp_file(dir_fd, mode)
    renamed = False
    try:
        try:
            os.fchmod(fd, mode)  # what the umask took off os.open's mode
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            try:
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except FileExistsError:
                return False
        else:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            renamed = True
        if durable:
            os.fsync(dir_fd)
        return True
    finally:
        if not renamed:  # a rename took the temp name with it
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)


def _temp_file(dir_fd: int, mode: int) -> tuple[str, int]:
    """A new temp file in ``dir_fd``, named by pid and a per-process number (not derived from the
    record's name: a 255-byte name must fit; no getrandom per write). O_EXCL refuses a name
    already there (left by a killed process, made by one with this pid in another pid namespace,
    or planted in a shared directory, which could plant the next numbers too): then random names."""
    tmp = f".{_temp_pid}.{next(_temp_numbers)}.tmp"
    while True:
        try:
            return tmp, os.open(tmp, _TEMP_FLAGS, mode, dir_fd=dir_fd)
        except FileExistsError:
            tmp = f".{secrets.token_hex(8)}.tmp"


def read_all(fd: int, chunk_size: int = 65536) -> bytes:
    """Everything left in the open file: a small file in one or two reads, without the file
    object (and its fstat, ioctl and lseek) that ``os.fdopen(fd).read()`` costs. A ``/proc/sys``
    read allocates and zeroes a kernel buffer of the size asked: read those a page at a time."""
    data = b""
    while chunk := os.read(fd, chunk_size):
        data += chunk
    return data


def make_dirs(path: str, mode: int = 0o700, *, dir_fd: int | None = None) -> None:
    """``os.makedirs`` (missing ancestors made with the default mode, ``path`` with ``mode``;
    ``FileExistsError`` when ``path`` exists), each new entry made durable in its parent: a
    record written durably into a directory is only as durable as the directory's own entry.
    With ``dir_fd``, ``path`` is one name in that directory."""
    if dir_fd is not None:
        os.mkdir(path, mode, dir_fd=dir_fd)
        os.fsync(dir_fd)
        return
    parent = os.path.dirname(path.rstrip("/"))
    try:
        os.mkdir(path, mode)
    except FileNotFoundError:
        if not parent or parent == path:
            raise
        with contextlib.suppress(FileExistsError):  # a racing maker
            make_dirs(parent, 0o777)
        os.mkdir(path, mode)
    pfd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(pfd)
    finally:
        os.close(pfd)


class _Kept:
    __slots__ = ("dropped", "fds", "ids", "users")

    def __init__(self, fds: tuple[int, ...]) -> None:
        self.fds, self.users, self.dropped = fds, 1, False
        self.ids = tuple((st.st_dev, st.st_ino) for st in map(os.fstat, fds))

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


class KeptDirs:
    """Directory fds kept open between calls, so that a process writing many records does not
    make, open and check the same directories for each one.

    An entry is a chain of directories: ``path`` and then names, each in the one before. It is
    used only while every link still names the very directory opened for it, as one ``lstat``
    of ``path`` and one ``fstatat`` of each name (relative to the kept fd before it) show:
    same (device, inode) — a kept fd holds its inode, so a directory removed and re-created
    under us cannot come back with that number — and the last still private to this uid.
    Otherwise (gone, replaced, renamed away, a symlink now, opened up) the entry is dropped
    and ``opener`` runs, as on first use, with its checks and errors. At most ``limit``
    entries; one dropped while in use is closed by its last user.
    """

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, ...], _Kept] = OrderedDict()

    @overload
    def use(self, chain: tuple[str, ...], opener: Callable[[], tuple[int, ...]]) -> _Use[int]: ...
    @overload
    def use(self, chain: tuple[str, ...], opener: Callable[[], tuple[int, ...] | None]) -> _Use[int | None]: ...
    def use(self, chain: tuple[str, ...], opener: Callable[[], tuple[int, ...] | None]) -> _Use[int | None]:
        """A context manager giving the fd of the chain's last directory. ``opener`` opens and
        checks the chain the slow way and returns one fd per link (they become ours), or
        ``None`` (given as is) when it does not exist; what it raises passes through."""
        return _Use(self, chain, opener)

    def _take(self, chain: tuple[str, ...]) -> _Kept | None:
        with self._lock:
            entry = self._kept.get(chain)
            if entry is None:
                return None
            entry.users += 1
            self._kept.move_to_end(chain)
        if _current(chain, entry):
            return entry
        self._release(entry, drop=chain)
        return None

    def _keep(self, chain: tuple[str, ...], fds: tuple[int, ...]) -> _Kept:
        try:
            entry = _Kept(fds)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        with self._lock:
            self._drop(chain)
            self._kept[chain] = entry
            while len(self._kept) > self.limit:
                self._drop(next(iter(self._kept)))
        return entry

    def clear(self) -> None:
        """Forget every entry, closing each fd now or when its last user is done: for a process
        done with its state dirs (the bench closes them after a cell, before it counts fds)."""
        with self._lock:
            for chain in list(self._kept):
                self._drop(chain)

    def _drop(self, chain: tuple[str, ...]) -> None:
        """Forget the entry (the caller holds the lock); closed now unless in use."""
        entry = self._kept.pop(chain, None)
        if entry is not None:
            entry.dropped = True
            if not entry.users:
                entry.close()

    def _release(self, entry: _Kept, drop: tuple[str, ...] | None = None) -> None:
        with self._lock:
            entry.users -= 1
            if drop is not None and self._kept.get(drop) is entry:
                self._drop(drop)
            elif entry.dropped and not entry.users:
                entry.close()

    def _forget_in_child(self) -> None:
        # A fork copies the fds too, but not the thread that may have held the lock.
        self._lock = threading.Lock()


def _current(chain: tuple[str, ...], entry: _Kept) -> bool:
    try:
        st = os.lstat(chain[0])
        if (st.st_dev, st.st_ino) != entry.ids[0]:
            return False
        for name, parent, ident in zip(chain[1:], entry.fds, entry.ids[1:], strict=False):
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if (st.st_dev, st.st_ino) != ident:
                return False
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not stat.S_IMODE(st.st_mode) & 0o077


class _Use(Generic[_Fd]):
    """One use of a kept chain (a plain class: cheaper than a generator context manager)."""

    __slots__ = ("chain", "entry", "kept", "opener")

    def __init__(self, kept: KeptDirs, chain: tuple[str, ...], opener: Callable[[], tuple[int, ...] | None]) -> None:
        self.kept, self.chain, self.opener = kept, chain, opener
        self.entry: _Kept | None = None

    def __enter__(self) -> _Fd:
        entry = self.kept._take(self.chain)
        if entry is None:
            fds = self.opener()
            if fds is None:
                return cast(_Fd, None)
            entry = self.kept._keep(self.chain, fds)
        self.entry = entry
        return cast(_Fd, entry.fds[-1])

    def __exit__(self, *exc: object) -> None:
        if self.entry is not None:
            self.kept._release(self.entry)


#: The process's kept directories (plugin state records, results cache).
kept_dirs = KeptDirs()


def _after_fork_in_child() -> None:
    global _temp_pid
    _temp_pid = os.getpid()
    kept_dirs._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)

"""The lease cache: each network directory's leases kept in memory, exact through inotify.

A long-lived process (the in-process backend) keeps, per network directory, the trimmed
content of every lease file in memory, so ADD's duplicate check, DEL and CHECK cost O(files
changed since this process last looked) instead of reading every lease. inotify keeps it
exact: a writer that follows the protocol (the Go plugin, pycni in any process) changes the
directory only while it holds the flock, the kernel queues the event for each create, unlink,
rename or write inside that very syscall, so everything a writer did before releasing the lock
is in our queue by the time we hold it. Names, not inode numbers, are what get re-read, so a
file deleted and recreated under the same name (ext4 reuses the inode) is never mistaken for
the old one. A lost watch (directory removed, filesystem unmounted, watch evicted) drops the
entry, a queue overflow marks every entry for a full re-read, and whenever no watch can be
had the operation reads the whole directory as before. Hits are re-read before they are acted
on, so even a writer that ignores the lock can only make us miss a lease it is changing right
now (as the full read always could), never delete or refuse because of a stale entry.

The cache starts with the second store a process opens: an exec'd plugin (one operation per
process) never creates an inotify instance, a per-user resource (fs.inotify.max_user_instances).
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import time
from typing import TYPE_CHECKING

from .store import is_state_file

if TYPE_CHECKING:
    from .disk import DiskStore

__all__ = ["Leases", "Watcher", "get_watcher", "store_opened"]

_IN_MODIFY = 0x00000002
_IN_ATTRIB = 0x00000004
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_WATCH_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_ONLYDIR
_EVENT = struct.Struct("=iIII")  # struct inotify_event: wd, mask, cookie, len, then len bytes of NUL-padded name
_MAX_DIRS = 64  # network directories cached per process, least recently used dropped first (one watch each)
_MAX_DIRTY = 4096  # changed names remembered per directory before a full re-read is cheaper
_RETRY_AFTER = 30.0  # seconds before trying inotify_init1 again after it failed (EMFILE, seccomp, ...)
_FS_ENCODING = sys.getfilesystemencoding()  # how os.scandir decodes names
_CACHE_LEASES = True  # False: every operation reads the whole directory (for tests and benchmarks)


class Leases:
    """One network directory's lease files: name → trimmed content, and content → names.

    ``content``/``holders`` change only with ``lock`` held, which callers take while holding the
    directory's flock; ``dirty``/``rescan``/``alive`` belong to the watcher (its mutex).
    One entry per lease file.
    """

    def __init__(self, key: tuple[int, int], wd: int) -> None:
        self.key = key
        self.wd = wd
        self.lock = threading.Lock()
        self.content: dict[str, bytes] = {}
        self.holders: dict[bytes, set[str]] = {}
        self.dirty: set[str] = set()
        self.rescan = True
        self.alive = True

    def set(self, name: str, data: bytes | None) -> None:
        old = self.content.pop(name, None)
        if old is not None:
            names = self.holders[old]
            names.discard(name)
            if not names:
                del self.holders[old]
        if data is not None:
            self.content[name] = data
            self.holders.setdefault(data, set()).add(name)

    def load(self, store: DiskStore) -> None:
        self.content.clear()
        self.holders.clear()
        for name, data in store.lease_files():
            self.set(name, data)

    def verified(self, store: DiskStore, data: bytes) -> list[str]:
        """The files cached as holding ``data``, each re-read now; one that no longer does is corrected."""
        found = []
        for name in list(self.holders.get(data, ())):
            now = store.lease(name)
            if now == data:
                found.append(name)
            else:
                self.set(name, now)
        return found


class Watcher:
    """This process's inotify instance, with one watch per cached network directory."""

    def __init__(self) -> None:
        import ctypes  # only long-lived processes get here

        libc = ctypes.CDLL(None, use_errno=True)
        init, self._add, self._rm = libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch
        init.argtypes = (ctypes.c_int,)
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._rm.argtypes = (ctypes.c_int, ctypes.c_int)
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self.fd = fd
        self.pid = os.getpid()
        self.mutex = threading.Lock()
        self.dirs: dict[tuple[int, int], Leases] = {}  # by the directory's (st_dev, st_ino), least recent first
        self.by_wd: dict[int, Leases] = {}

    def entry(self, store: DiskStore) -> Leases | None:
        """The cache of the directory ``store`` has open (its flock held), with every event queued so far
        recorded in it; None if the directory cannot be watched.

        A cached (st_dev, st_ino) is still the same directory: the watch pins the inode, and when
        the directory goes away the watch's IN_IGNORED is queued before the inode number can be
        reused, so the drain below has dropped the entry of a directory that was replaced.
        """
        st = os.fstat(store.fd)
        key = (st.st_dev, st.st_ino)
        with self.mutex:
            self._drain()
            entry = self.dirs.pop(key, None)
            if entry is None:
                # Watch the open directory itself (its path may no longer lead to it), through this
                # thread's fd table: /proc/self is the thread-group leader's, which may differ.
                wd = self._add(self.fd, f"/proc/thread-self/fd/{store.fd}".encode(), _WATCH_MASK)
                if wd < 0:  # ENOSPC (fs.inotify.max_user_watches), no /proc, ...
                    return None
                stale = self.by_wd.get(wd)
                if stale is not None:  # cannot happen (see above); never let two entries share a watch
                    self._drop(stale)
                entry = self.by_wd[wd] = Leases(key, wd)
            self.dirs[key] = entry  # most recently used last
            while len(self.dirs) > _MAX_DIRS:
                oldest = next(iter(self.dirs.values()))
                self._drop(oldest)
                self._rm(self.fd, oldest.wd)
        return entry

    def refresh(self, entry: Leases, store: DiskStore) -> bool:
        """Bring ``entry`` up to date (its lock and the directory's flock held); False if it was dropped meanwhile."""
        with self.mutex:
            if not entry.alive:
                return False
            rescan, dirty = entry.rescan, entry.dirty
            entry.rescan, entry.dirty = False, set()
        try:
            if rescan:
                entry.load(store)
            else:
                for name in dirty:
                    entry.set(name, store.lease(name))
        except BaseException:
            with self.mutex:
                entry.rescan = True
            raise
        return True

    def _drop(self, entry: Leases) -> None:
        entry.alive = False
        if self.dirs.get(entry.key) is entry:
            del self.dirs[entry.key]
        if self.by_wd.get(entry.wd) is entry:
            del self.by_wd[entry.wd]

    def _drain(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:  # cannot happen; if it does, trust nothing
                self._overflow()
                return
            self.dispatch(buf)

    def _overflow(self) -> None:
        for entry in self.dirs.values():
            entry.rescan = True
            entry.dirty.clear()

    def dispatch(self, buf: bytes) -> None:
        """Record a batch of events read from the queue."""
        offset = 0
        while offset + _EVENT.size <= len(buf):
            wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
            start = offset + _EVENT.size
            offset = start + length
            if mask & _IN_Q_OVERFLOW:
                self._overflow()
                continue
            entry = self.by_wd.get(wd)
            if entry is None:
                continue
            if mask & _IN_IGNORED:
                self._drop(entry)
                continue
            name = buf[start:offset].rstrip(b"\0").decode(_FS_ENCODING, "surrogateescape")
            if entry.rescan or not name or is_state_file(name):  # no name: an event on the directory itself
                continue
            entry.dirty.add(name)
            if len(entry.dirty) > _MAX_DIRTY:
                entry.rescan = True
                entry.dirty.clear()


_watcher: Watcher | None = None
_watcher_failed_at = float("-inf")
_watcher_lock = threading.Lock()
_stores_opened = 0


def store_opened() -> None:
    """Count a network directory opened by this process (see "starts with the second store")."""
    global _stores_opened
    _stores_opened += 1


def get_watcher() -> Watcher | None:
    """This process's watcher, created on first need; None while the cache is off or unavailable."""
    global _watcher, _watcher_failed_at
    if not _CACHE_LEASES or _stores_opened < 2:
        return None
    watcher = _watcher
    if watcher is not None and watcher.pid == os.getpid():
        return watcher
    with _watcher_lock:
        watcher = _watcher
        if watcher is not None and watcher.pid != os.getpid():
            # Inherited through a fork that skipped the at-fork hook: never read the parent's queue
            # (each event is delivered once). The fd number is left alone; the child may reuse it.
            watcher = _watcher = None
        if watcher is None:
            if time.monotonic() - _watcher_failed_at < _RETRY_AFTER:
                return None
            try:
                watcher = _watcher = Watcher()
            except (OSError, AttributeError, ImportError):  # no inotify (limits, seccomp, not Linux, no ctypes)
                _watcher_failed_at = time.monotonic()
                return None
    return watcher


def _forget_watcher_in_child() -> None:
    """After fork: the child must not read the queue it shares with the parent, nor use its locks."""
    global _watcher, _watcher_lock
    watcher, _watcher = _watcher, None
    _watcher_lock = threading.Lock()
    if watcher is not None:
        try:
            os.close(watcher.fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watcher_in_child)

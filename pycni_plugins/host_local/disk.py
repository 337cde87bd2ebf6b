"""The disk store: ``<dataDir>/<network>/`` in the reference's format, so Go and pycni can share
a data dir both ways.

One file per IP named by the canonical IP, holding ``<containerID>\\r\\n<ifname>``;
``last_reserved_ip.<set index>``; an empty ``lock`` file taken with ``flock``. Files are opened
relative to the network directory's fd and never through a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from pycni._fs import read_all
from pycni.errors import CNIError
from pycni.sdk import cancel
from pycni.types import IPAddress

from . import lease_cache
from ._errors import os_fail, refuse_symlink
from .config import parse_ip
from .lease_cache import Leases
from .store import LAST_RESERVED, LOCK, is_state_file, owner_key, release_order, stale_leases

__all__ = ["DiskStore"]

# Files in the network dir are always opened with O_NOFOLLOW (os.open adds O_CLOEXEC itself).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a planted FIFO must not hang us
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class DiskStore:
    """``<dataDir>/<network>``, reached without following a symlink planted in ``dataDir``.

    Each instance opens its own ``lock`` file description, so ``flock`` excludes other threads
    of this process as well as other processes (Go or pycni).
    """

    def __init__(self, data_dir: str, network: str) -> None:
        lease_cache.store_opened()
        self._leases: Leases | None = None  # the lease cache as synced under the current lock hold
        self.path = os.path.join(data_dir, network)
        try:  # both there (the common case): one open, the same flags as the two below
            self.fd = os.open(self.path, _DIR_FLAGS | os.O_NOFOLLOW)
        except OSError:
            self.fd = self._open_slowly(data_dir, network)
        try:
            self._lock_fd = os.open(LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o750, dir_fd=self.fd)
        except OSError as e:
            os.close(self.fd)
            raise os_fail("open", os.path.join(self.path, LOCK), e) from None

    def _open_slowly(self, data_dir: str, network: str) -> int:
        """The network dir, each missing directory made, each failure told apart."""
        try:
            parent = os.open(data_dir, _DIR_FLAGS)
        except FileNotFoundError:
            try:
                os.makedirs(data_dir, 0o755, exist_ok=True)
                parent = os.open(data_dir, _DIR_FLAGS)
            except OSError as e:
                raise os_fail("mkdir", data_dir, e) from None
        except OSError as e:
            raise os_fail("open", data_dir, e) from None
        try:
            try:
                return os.open(network, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
            except FileNotFoundError:  # made only when missing: no failed mkdir per call
                with contextlib.suppress(FileExistsError):
                    os.mkdir(network, 0o755, dir_fd=parent)
                return os.open(network, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
        except OSError as e:
            if e.errno == errno.ENOTDIR and os.path.islink(self.path):  # what O_DIRECTORY says of a symlink
                raise refuse_symlink(self.path) from None
            raise os_fail("open", self.path, e) from None
        finally:
            os.close(parent)

    def __enter__(self) -> DiskStore:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._lock_fd)
        os.close(self.fd)

    @contextmanager
    def locked(self) -> Iterator[DiskStore]:
        cancel.flock(self._lock_fd, f"the lock of {self.path}")
        try:
            yield self
        finally:
            self._leases = None
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _read(self, name: str, limit: int | None = None) -> bytes | None:
        """The file's bytes (whole, or None when larger than ``limit``); None when unreadable.

        A lease is read whole: a cap would make a long owner unrecognisable, so its DEL would
        "succeed" without releasing it."""
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self.fd)
        except OSError:
            return None
        try:
            if limit is not None:
                data = os.read(fd, limit + 1)
                return data if len(data) <= limit else None
            return read_all(fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _write(self, name: str, data: bytes, flags: int) -> None:
        """Write a file in the directory; ``FileExistsError`` (O_EXCL) passes through, other failures are CNI errors."""
        path = os.path.join(self.path, name)
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW, 0o600, dir_fd=self.fd)
        except FileExistsError:
            raise
        except OSError as e:
            raise os_fail("open", path, e) from None
        try:
            _write_all(fd, data)
        except OSError as e:
            os.unlink(name, dir_fd=self.fd)
            raise os_fail("write", path, e) from None
        finally:
            os.close(fd)

    def reserve(self, ip: str, owner: bytes, range_id: int) -> bool:
        """Create the lease file exclusively; False when the IP is taken. Records ``last_reserved_ip``."""
        try:
            self._write(ip, owner, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        try:
            self._write(f"{LAST_RESERVED}{range_id}", ip.encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except CNIError:
            os.unlink(ip, dir_fd=self.fd)  # unlike Go, leave no lease behind a failed reservation
            raise
        return True

    def last_reserved(self, range_id: int) -> IPAddress | None:
        data = self._read(f"{LAST_RESERVED}{range_id}", 64)
        return parse_ip(data.decode("ascii", "replace")) if data else None

    def lease(self, name: str) -> bytes | None:
        """Lease file ``name``'s trimmed content; None if it is missing, not a regular file or unreadable."""
        if is_state_file(name):
            return None
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        data = self._read(name)
        return None if data is None else data.strip()

    def lease_files(self) -> Iterator[tuple[str, bytes]]:
        """Every lease file with its trimmed content, read from disk.

        The Go plugin reads every file in the directory; pycni skips ``lock``,
        ``last_reserved_ip.*`` and anything that is not a regular file (symlinks included).
        """
        with os.scandir(self.fd) as entries:
            for entry in entries:
                name = entry.name
                if is_state_file(name) or not entry.is_file(follow_symlinks=False):
                    continue
                data = self._read(name)
                if data is not None:
                    yield name, data.strip()

    def find(self, container_id: str, ifname: str) -> tuple[list[str], list[str]]:
        """Names of files holding ``id\\r\\nifname`` and of those holding just the legacy bare ``id``.

        From the lease cache when this process has one for the directory (each hit re-read
        just now), else from reading every lease file. The caller holds the lock.
        """
        key, owner = owner_key(container_id, ifname)
        watcher = lease_cache.get_watcher()
        leases = watcher.entry(self) if watcher is not None else None
        if watcher is not None and leases is not None:
            with leases.lock:
                if watcher.refresh(leases, self):
                    self._leases = leases
                    return sorted(leases.verified(self, key)), sorted(leases.verified(self, owner))
        self._leases = None
        current: list[str] = []
        legacy: list[str] = []
        for name, data in self.lease_files():
            if data == key:
                current.append(name)
            elif data == owner:
                legacy.append(name)
        return sorted(current), sorted(legacy)

    def known_taken(self, name: str) -> bool:
        """Whether the cache synced by ``find`` under this lock hold lists ``name`` as a lease file.

        A hint that lets allocation skip leases without an open(2); O_EXCL still decides.
        """
        leases = self._leases
        return leases is not None and name in leases.content

    def unreserve(self, ip: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(ip, dir_fd=self.fd)

    def release(self, container_id: str, ifname: str, passes: int) -> None:
        """Release the attachment's leases as ``passes`` (>= 1) consecutive Go ``ReleaseByID`` calls
        would; errors are ignored like Go's. ``find`` has just read every candidate under the lock
        we hold, so only files whose content matches right now are unlinked."""
        for name in release_order(*self.find(container_id, ifname), passes):
            try:
                os.unlink(name, dir_fd=self.fd)
            except OSError:
                pass

    def collect(self, valid: set[tuple[str, str]], *, dry_run: bool) -> list[tuple[str, str]]:
        """GC (the caller holds the lock): unlink the lease files of attachments not in ``valid``;
        the lease cache learns of the unlinks through inotify, as of any other writer's."""
        doomed = list(stale_leases(self.lease_files(), valid))
        if not dry_run:
            for name, _ in doomed:
                try:
                    os.unlink(name, dir_fd=self.fd)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise os_fail("remove", os.path.join(self.path, name), e) from None
        return doomed

"""The results cache (libcni's ``cniCacheV1``) and the runtime's cross-process locks.

Files live at ``<root>/results/<network>-<containerID>-<ifname>`` in libcni's format (base64
``config``), so pycni and Go runtimes can share ``/var/lib/cni``; legacy raw-result files are
read too. Unlike libcni, writes are atomic (temp file, fsync, rename) so a crash never leaves a
truncated file; the directory is 0700 and files 0600; nothing is opened through a symlink
planted inside the cache.

Locks (``<root>/locks/``) use open-file-description byte-range locks, so they work between
threads and processes alike and need one file per network, not one per container:
operations on one container serialise; GC of a network excludes ADD/DEL on it.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from . import _json
from ._fs import check_private_dir, kept_dirs, make_dirs, read_all, write_atomic
from .errors import CacheError, ErrorCode, InvalidArgumentError
from .sdk.validate import NAME_PATTERN, validate_attachment_key

__all__ = ["ResultsCache", "CachedAttachment", "DEFAULT_CACHE_DIR", "CACHE_KIND"]

log = logging.getLogger("pycni.cache")
_local_locks: dict[tuple[str, str, int], threading.Lock] = {}


def _unwritable(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    return "read-only" in str(e).lower() or "permission denied" in str(e).lower()


def _ours(fd: int) -> bool:
    """Whether this uid owns the open entry: another uid's entry is never acted on."""
    return os.fstat(fd).st_uid == os.geteuid()


DEFAULT_CACHE_DIR = "/var/lib/cni"
#: Seconds an operation waits for a lock before giving up with "try again later" (code 11): a
#: lock is only held that long by a stuck operation, e.g. an exec'd plugin that never ends.
LOCK_TIMEOUT = 300.0
CACHE_KIND = "cniCacheV1"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


_CACHED_INFO = _json.GoFields(
    "kind", "containerId", "config", "ifName", "networkName", "netns", "cniArgs", "capabilityArgs", "result"
)


@attrs.frozen
class CachedAttachment:
    """One cache entry (libcni's ``NetworkAttachment``): an attachment (the three fields of
    :class:`pycni.sdk.Attachment`), its ADD's parameters, the config and the result."""

    container_id: str
    network: str
    ifname: str
    config: bytes = b""
    netns: str = ""
    cni_args: tuple[tuple[str, str], ...] = ()
    capability_args: Mapping[str, Any] = attrs.field(factory=dict)
    result: Mapping[str, Any] | None = None

    def to_bytes(self) -> bytes:
        """Compact JSON in Go's field order; maps sorted and HTML-escaped as encoding/json does."""
        parts = [
            f'"kind":"{CACHE_KIND}"',
            f'"containerId":{_json.dumps_compact(self.container_id)}',
            f'"config":"{base64.b64encode(self.config).decode()}"',
            f'"ifName":{_json.dumps_compact(self.ifname)}',
            f'"networkName":{_json.dumps_compact(self.network)}',
        ]
        if self.netns:
            parts.append(f'"netns":{_json.dumps_compact(self.netns)}')
        if self.cni_args:
            parts.append(f'"cniArgs":{_json.dumps_compact([list(p) for p in self.cni_args])}')
        if self.capability_args:
            parts.append(f'"capabilityArgs":{_json.dumps_compact(self.capability_args, sort_keys=True)}')
        if self.result:
            parts.append(f'"result":{_json.dumps_compact(self.result, sort_keys=True)}')
        return _json.go_escape("{" + ",".join(parts) + "}").encode()

    @classmethod
    def from_json(cls, data: Any) -> CachedAttachment:
        """Decode a ``cniCacheV1`` object (libcni's ``cachedInfo`` struct); else raise :class:`CacheError`."""
        if isinstance(data, dict):
            data = _CACHED_INFO.pick(data)
        if not isinstance(data, dict) or data.get("kind") != CACHE_KIND:
            kind = data.get("kind") if isinstance(data, dict) else None
            raise CacheError(f"cached network config has wrong kind: {kind}")

        def text(key: str) -> str:
            value = data.get(key, "")
            if not isinstance(value, str):
                raise CacheError(f"cache entry field {key!r} must be a string")
            return value

        try:
            config = base64.b64decode(text("config"), validate=True)
        except ValueError:
            raise CacheError("cache entry field 'config' is not base64") from None
        args = data.get("cniArgs") or []
        if not isinstance(args, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in args
        ):
            raise CacheError("cache entry field 'cniArgs' must be a list of [key, value] pairs")
        caps = data.get("capabilityArgs") or {}
        result = data.get("result")
        if not isinstance(caps, dict) or not (result is None or isinstance(result, dict)):
            raise CacheError("cache entry fields 'capabilityArgs' and 'result' must be objects")
        return cls(
            container_id=text("containerId"),
            network=text("networkName"),
            ifname=text("ifName"),
            config=config,
            netns=text("netns"),
            cni_args=tuple((k, v) for k, v in args),
            capability_args=caps,
            result=result,
        )


def _unusable(path: str, e: OSError) -> CacheError:
    reason = "is a symlink" if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror
    return CacheError(f"cannot use cache dir {path}: {reason}")


def _check_key(network: str, container_id: str, ifname: str) -> None:
    if not network or not container_id or not ifname:
        raise InvalidArgumentError(
            f"cache file path requires network name ({network!r}), container ID ({container_id!r}), "
            f"and interface name ({ifname!r})"
        )
    if not NAME_PATTERN.fullmatch(network):
        raise InvalidArgumentError("invalid characters found in network name", network, code=7)
    validate_attachment_key(network, container_id, ifname)


def _check_network(network: str) -> None:
    if not NAME_PATTERN.fullmatch(network):
        raise InvalidArgumentError("invalid characters found in network name", network, code=7)


def _container_offset(container_id: str) -> int:
    """The container's byte in ``containers.lock`` (byte 0 is never one: 1 + 40 bits of its hash)."""
    return 1 + int.from_bytes(hashlib.sha256(container_id.encode()).digest()[:5], "big")


def _lock_range(kind: int, offset: int) -> bytes:
    """A ``struct flock`` for the one byte at ``offset`` (``F_OFD_*`` locks need ``l_pid`` 0)."""
    return struct.pack("@hhqqi4x", kind, os.SEEK_SET, offset, 1, 0)


class ResultsCache:
    """The cache under ``root`` (libcni default ``/var/lib/cni``)."""

    def __init__(self, root: str = DEFAULT_CACHE_DIR, *, lock_timeout: float | None = LOCK_TIMEOUT) -> None:
        self.root = root
        self.lock_timeout = lock_timeout
        self.results_dir = os.path.join(root, "results")
        self.locks_dir = os.path.join(root, "locks")

    def file_name(self, network: str, container_id: str, ifname: str) -> str:
        _check_key(network, container_id, ifname)
        return f"{network}-{container_id}-{ifname}"

    def path(self, network: str, container_id: str, ifname: str) -> str:
        return os.path.join(self.results_dir, self.file_name(network, container_id, ifname))

    # -- directories -------------------------------------------------------------------

    def _dir(self, path: str, *, create: bool) -> contextlib.AbstractContextManager[int]:
        """A cache subdirectory (0700), opened without following a symlink planted in its place;
        refused unless it is private to this uid, as the plugins' state dir is: its entries
        decide what DEL and GC act on. ``FileNotFoundError`` when missing and not ``create``.

        Kept open between calls (one lstat instead of an open and a check):
        see :class:`pycni._fs.KeptDirs` for when it is not."""
        return kept_dirs.use((path,), lambda: self._opened(path, create=create))

    def _opened(self, path: str, *, create: bool) -> tuple[int]:
        try:
            fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            fd = None
        except OSError as e:
            raise _unusable(path, e) from None
        if fd is None:
            try:
                with contextlib.suppress(FileExistsError):
                    make_dirs(self.root)
                make_dirs(path)  # durably: an entry written durably in it must survive a power cut
            except FileExistsError:
                pass
            except OSError as e:
                raise CacheError(f"failed to create cache dir {path}: {e.strerror}") from None
            try:
                fd = os.open(path, _DIR_FLAGS)
            except OSError as e:
                raise _unusable(path, e) from None
        try:
            check_private_dir(fd, f"cache dir {path}")
        except PermissionError as e:
            os.close(fd)
            raise CacheError(f"refusing cache dir {path}: {e.strerror}", code=ErrorCode.IO_FAILURE) from None
        return (fd,)

    def ensure_writable(self) -> None:
        """Fail now, with a clear error, if entries could not be written later."""
        with self._dir(self.results_dir, create=True) as dfd:
            # access() also fails (EROFS) on a read-only mount: statvfs only words the error.
            if os.access(self.results_dir, os.W_OK | os.X_OK):
                return
            if os.statvfs(dfd).f_flag & os.ST_RDONLY:
                raise CacheError(f"cache dir {self.results_dir} is on a read-only filesystem")
            raise CacheError(f"cache dir {self.results_dir} is not writable")

    # -- entries -------------------------------------------------------------------------

    def write(self, entry: CachedAttachment) -> None:
        """Atomically replace the entry's file (temp file, fsync, rename, fsync dir)."""
        name = self.file_name(entry.network, entry.container_id, entry.ifname)
        data = entry.to_bytes()
        with self._dir(self.results_dir, create=True) as dfd:
            try:
                write_atomic(dfd, name, data)
            except OSError as e:
                raise CacheError(
                    f"failed to write cache file {os.path.join(self.results_dir, name)}: {e.strerror}"
                ) from None

    def read_bytes(self, network: str, container_id: str, ifname: str) -> bytes | None:
        """The raw file, or ``None`` when there is none; a symlink is refused, not followed."""
        name = self.file_name(network, container_id, ifname)
        try:
            with self._dir(self.results_dir, create=False) as dfd:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            reason = "is a symlink" if e.errno == errno.ELOOP else e.strerror
            raise CacheError(f"failed to read cache file {os.path.join(self.results_dir, name)}: {reason}") from None
        try:
            if not _ours(fd):
                raise CacheError(
                    f"refusing cache file {os.path.join(self.results_dir, name)}: not owned by uid {os.geteuid()}"
                )
            return read_all(fd)
        finally:
            os.close(fd)

    def read(self, network: str, container_id: str, ifname: str) -> CachedAttachment | None:
        """Decode an entry; a legacy file (just the result JSON) becomes an entry with only a result.

        Raises :class:`CacheError` when the file exists but cannot be decoded.
        """
        data = self.read_bytes(network, container_id, ifname)
        if data is None:
            return None
        try:
            # libcni keeps an entry's result as a map[string]interface{}: a repeated key, its last value.
            decoded = _json.loads(data, go_maps=True)
        except _json.JSONDecodeFailure as e:
            raise CacheError(f"failed to decode cached result for {network}/{container_id}/{ifname}: {e}") from None
        if isinstance(decoded, dict) and "kind" in _CACHED_INFO.pick(decoded):
            # libcni would try a foreign-kind file as a legacy result; legacy results never had a
            # "kind", so such a file is someone else's and must not become a prevResult.
            return CachedAttachment.from_json(decoded)
        if not isinstance(decoded, dict):
            raise CacheError(f"cached result for {network}/{container_id}/{ifname} is not a JSON object")
        # A legacy file is decoded straight into the result's structs.
        result = _json.loads(data)
        return CachedAttachment(container_id=container_id, network=network, ifname=ifname, result=result)

    def delete(self, network: str, container_id: str, ifname: str) -> None:
        name = self.file_name(network, container_id, ifname)
        try:
            with self._dir(self.results_dir, create=False) as dfd:
                os.unlink(name, dir_fd=dfd)
        except (FileNotFoundError, CacheError):
            pass  # no cache dir, an untrusted one (nothing of ours in it), or no entry
        except OSError as e:
            raise CacheError(f"failed to delete cache file {name}: {e.strerror}") from None

    def attachments(self, container_id: str | None = None) -> list[CachedAttachment]:
        """Every readable ``cniCacheV1`` entry this uid owns (sorted by file name); unreadable
        ones are skipped. A cache dir that cannot be trusted raises :class:`CacheError`."""
        try:
            with self._dir(self.results_dir, create=False) as kept:
                # A listing of its own: a kept fd's offset is shared with every thread using it.
                dfd = os.open(".", _DIR_FLAGS, dir_fd=kept)
        except FileNotFoundError:
            return []
        found = []
        try:
            for name in sorted(os.listdir(dfd)):
                if name.startswith("."):
                    continue
                if container_id and not (name.find(f"-{container_id}-") > 0 and not name.endswith(f"-{container_id}-")):
                    continue
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                    with os.fdopen(fd, "rb") as f:
                        if not _ours(fd):
                            continue
                        entry = CachedAttachment.from_json(_json.loads(f.read()))
                except (OSError, _json.JSONDecodeFailure, CacheError):
                    continue
                if not entry.ifname or not entry.network:
                    continue
                if container_id and entry.container_id != container_id:
                    continue
                found.append(entry)
        finally:
            os.close(dfd)
        return found

    # -- locks ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def container_lock(self, container_id: str) -> Iterator[int | None]:
        """Exclusive per container, across threads and processes (all its attachments).

        Yields the lock's fd: a process that inherits it holds the lock too (the runtime hands it
        to exec'd plugins, so a plugin that outlives a killed runtime still excludes the next
        operation on that container until it is done).
        """
        with self._range_lock("containers", _container_offset(container_id), exclusive=True) as fd:
            yield fd

    @contextlib.contextmanager
    def network_lock(self, network: str, *, exclusive: bool) -> Iterator[int | None]:
        """Shared for ADD/CHECK/DEL on ``network``, exclusive for its GC (yields the fd, as above)."""
        _check_network(network)
        with self._range_lock(f"net-{network}", 0, exclusive=exclusive) as fd:
            yield fd

    @contextlib.contextmanager
    def attachment_locks(self, network: str, container_id: str) -> Iterator[tuple[int | None, ...]]:
        """``network_lock(network, exclusive=False)`` then ``container_lock(container_id)``, as
        one ADD/CHECK/DEL takes them (yields both fds), with both lock files opened in one visit
        to the locks dir."""
        _check_network(network)
        with self._range_locks(
            ((f"net-{network}", 0, False), ("containers", _container_offset(container_id), True))
        ) as fds:
            yield fds

    @staticmethod
    def _open_lock(dfd: int, name: str) -> int:
        return os.open(f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)

    def _acquire(self, fd: int, lock: bytes, name: str) -> None:
        if self.lock_timeout is None:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, lock)
            return
        deadline = time.monotonic() + self.lock_timeout
        pause = 0.001
        while True:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
                return
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                raise CacheError(
                    f"timed out after {self.lock_timeout:g}s waiting for lock {name}",
                    "another operation holds it (maybe an exec'd plugin still running after its runtime died)",
                    code=ErrorCode.TRY_AGAIN_LATER,
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    @contextlib.contextmanager
    def _range_lock(self, name: str, offset: int, *, exclusive: bool) -> Iterator[int | None]:
        with self._range_locks(((name, offset, exclusive),)) as (fd,):
            yield fd

    @contextlib.contextmanager
    def _range_locks(self, specs: tuple[tuple[str, int, bool], ...]) -> Iterator[tuple[int | None, ...]]:
        """Each ``(lock file, byte, exclusive)`` locked in order, the files opened in one visit to
        the locks dir; yields their fds."""
        fds: list[int] = []
        name = specs[0][0]
        try:
            try:
                with self._dir(self.locks_dir, create=True) as dfd:
                    for name, _, _ in specs:
                        fds.append(self._open_lock(dfd, name))
            except (OSError, CacheError) as e:
                if not _unwritable(e):
                    raise CacheError(f"failed to open lock {self.locks_dir}/{name}.lock: {e}") from None
                # A read-only cache must not stop DEL from cleaning the kernel: lock within this
                # process only (ADD refuses such a cache before running anything anyway).
                log.warning("cache %s is not writable (%s); locking within this process only", self.root, e)
                with contextlib.ExitStack() as local:
                    for name, offset, _ in specs:
                        local.enter_context(_local_locks.setdefault((self.root, name, offset), threading.Lock()))
                    yield (None,) * len(specs)
                return
            for fd, (name, offset, exclusive) in zip(fds, specs):
                self._acquire(fd, _lock_range(fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK, offset), name)
            yield tuple(fds)
        finally:
            for fd in reversed(fds):
                os.close(fd)

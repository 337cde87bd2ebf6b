"""The file rules the runtime and the plugins share: the ownership rule for pycni's private
directories (results cache, plugin state records), the rule for a path root runs or trusts
(installed plugins, later the daemon's socket) and the one atomic write.

Both sides trust a directory for the same reasons: what is in it decides what DEL and GC remove,
so a directory that another uid owns, or that anyone else may read or write, could hold planted
entries. And both write a file the same way: a reader (or a crash) sees the old content or the
new, never a part.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

__all__ = ["check_private_dir", "unsafe_ancestor", "write_atomic"]

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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


def write_atomic(dir_fd: int, name: str, data: bytes, *, mode: int = 0o600, exclusive: bool = False) -> bool:
    """Put ``data`` at ``name`` in the open directory ``dir_fd`` in one step, durably.

    The bytes go to a fresh temp file (exactly ``mode``), are fsync'd, and the file is renamed
    over ``name`` (or, ``exclusive``, hard-linked to it: the first of racing writers wins and
    the others get False); then the directory is fsync'd. On any failure the temp file is
    removed and ``name`` keeps its old content; the ``OSError`` is the caller's to translate.
    """
    tmp = f".{secrets.token_hex(8)}.tmp"  # not derived from name: a 255-byte name must fit
    fd = os.open(tmp, _TEMP_FLAGS, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)  # what the umask took off os.open's mode
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
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
        os.fsync(dir_fd)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)  # gone already after a rename

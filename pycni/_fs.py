"""The ownership rule for pycni's private directories (results cache, plugin state records).

Shared by the runtime and the plugins so both trust a directory for the same reasons: what is in
it decides what DEL and GC remove, so a directory that another uid owns, or that anyone else may
read or write, could hold planted entries.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["check_private_dir"]


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

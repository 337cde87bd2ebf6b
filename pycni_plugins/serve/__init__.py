"""``pycni serve``: the built-in plugins in one long-running process, for the shims that
``pycni plugins install`` writes (:mod:`.shim`), so an exec'd plugin costs a few milliseconds of
start-up instead of ~150 (:mod:`.daemon`).
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_SOCKET", "socket_path"]

DEFAULT_SOCKET = "/run/pycni/pycni.sock"


def socket_path(explicit: str | None = None) -> str:
    """The daemon's socket: ``explicit``, else ``$PYCNI_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return explicit or os.environ.get("PYCNI_SOCKET") or DEFAULT_SOCKET

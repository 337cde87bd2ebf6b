"""The system's libnftables (``libnftables.so.1``) through ctypes: the calls pycni makes.

The one import point for nftables in pycni and its plugins. It replaces Debian's
``python3-nftables`` (a ctypes module over the same library, not on PyPI; the PyPI copies are
unsound: one drops a stray top-level ``__init__.py``, the other a bare ``nftables.py`` that shadows
the distribution's package), so a plain ``pip install`` works wherever libnftables is installed.
The library loads on the first :class:`Nftables`; when it is missing, :class:`LibnftablesMissing`
(CNI code 50, plugin not available) names the package to install.
"""

from __future__ import annotations

import ctypes
import json
import threading
from typing import Any

from .errors import CNIError, ErrorCode

__all__ = ["SONAME", "LibnftablesMissing", "Nftables"]

SONAME = "libnftables.so.1"

# libnftables' output flags (nftables/libnftables.h, enum nft_output_flags).
_STATELESS = 1 << 2
_HANDLE = 1 << 3
_JSON = 1 << 4

_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


class LibnftablesMissing(CNIError):
    """libnftables itself is not installed (or cannot be loaded)."""

    default_code = ErrorCode.PLUGIN_NOT_AVAILABLE


def _library() -> ctypes.CDLL:
    """The system's libnftables, loaded once per process."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _open(SONAME)
        return _lib


def _open(soname: str) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(soname)
    except OSError as e:
        raise LibnftablesMissing(
            f"{soname} not found: install libnftables (Debian/Ubuntu: apt install libnftables1)", str(e)
        ) from e
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.restype = None
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_output_get_flags.restype = ctypes.c_uint
    lib.nft_ctx_output_get_flags.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_output_set_flags.restype = None
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    for buffering in (lib.nft_ctx_buffer_output, lib.nft_ctx_buffer_error):
        buffering.restype = ctypes.c_int
        buffering.argtypes = [ctypes.c_void_p]
    for getter in (lib.nft_ctx_get_output_buffer, lib.nft_ctx_get_error_buffer):
        getter.restype = ctypes.c_char_p
        getter.argtypes = [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


class Nftables:
    """One libnftables context (its netlink socket is bound to the namespace it was made in),
    output and errors buffered; the same calls and results as ``python3-nftables``'s class."""

    def __init__(self) -> None:
        self._lib = _library()
        ctx = self._lib.nft_ctx_new(0)  # NFT_CTX_DEFAULT
        if not ctx:
            raise CNIError("libnftables: cannot create a context", code=ErrorCode.INTERNAL)
        self._ctx = ctx
        self._lib.nft_ctx_buffer_output(ctx)
        self._lib.nft_ctx_buffer_error(ctx)

    def __del__(self) -> None:
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx:
            self._lib.nft_ctx_free(ctx)

    def _set_flag(self, flag: int, on: bool) -> bool:
        """Turn output ``flag`` on or off; whether it was on."""
        flags = int(self._lib.nft_ctx_output_get_flags(self._ctx))
        self._lib.nft_ctx_output_set_flags(self._ctx, flags | flag if on else flags & ~flag)
        return bool(flags & flag)

    def set_json_output(self, on: bool) -> bool:
        """JSON output on or off; the previous setting."""
        return self._set_flag(_JSON, on)

    def set_handle_output(self, on: bool) -> bool:
        """Rule handles in the output on or off; the previous setting."""
        return self._set_flag(_HANDLE, on)

    def set_stateless_output(self, on: bool) -> bool:
        """Stateless output (no counter values, no set elements' state) on or off; the previous setting."""
        return self._set_flag(_STATELESS, on)

    def cmd(self, text: str) -> tuple[int, str, str]:
        """Run nft commands (``nft -f`` syntax, one transaction): (rc, stdout, stderr)."""
        rc = int(self._lib.nft_run_cmd_from_buffer(self._ctx, text.encode()))
        out = self._lib.nft_ctx_get_output_buffer(self._ctx) or b""
        err = self._lib.nft_ctx_get_error_buffer(self._ctx) or b""
        return rc, out.decode(), err.decode()

    def json_cmd(self, root: dict[str, Any]) -> tuple[int, Any, str]:
        """Run libnftables JSON commands (one transaction): (rc, the decoded output, stderr).

        The output is ``""`` when the commands printed nothing, as ``python3-nftables`` has it.
        """
        was = self.set_json_output(True)
        try:
            rc, out, err = self.cmd(json.dumps(root))
        finally:
            if not was:
                self.set_json_output(False)
        return rc, (json.loads(out) if out else ""), err

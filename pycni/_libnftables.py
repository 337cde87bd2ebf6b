"""The libnftables bindings behind one import point.

The binding is ``nftables``, the ctypes module nftables itself ships (Debian's
``python3-nftables``; on PyPI its copy ``oxl-libnftables``, a dependency, so a plain ``pip
install`` works wherever the system's ``libnftables.so.1`` is installed). This module adds what
the binding lacks: a missing library is :class:`LibnftablesMissing` (CNI code 50, plugin not
available) naming the package to install, not a ctypes ``OSError`` and a warning at teardown.
"""

from __future__ import annotations

import nftables as _binding

from .errors import CNIError, ErrorCode

__all__ = ["SONAME", "LibnftablesMissing", "Nftables"]

SONAME = "libnftables.so.1"


class LibnftablesMissing(CNIError):
    """libnftables itself is not installed (or cannot be loaded)."""

    default_code = ErrorCode.PLUGIN_NOT_AVAILABLE


class Nftables(_binding.Nftables):  # type: ignore[misc]  # the binding is untyped
    """One libnftables context (its netlink socket is bound to the namespace it was made in)."""

    def __init__(self) -> None:
        try:
            super().__init__(sofile=SONAME)
        except OSError as e:
            raise LibnftablesMissing(
                f"{SONAME} not found: install libnftables (Debian/Ubuntu: apt install libnftables1)", str(e)
            ) from e

    def __del__(self) -> None:
        # The binding frees a context its failed __init__ never made, with an "ignored" warning.
        if hasattr(self, "nft_ctx_free"):
            super().__del__()

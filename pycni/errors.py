"""pycni's one error hierarchy, rooted in :class:`CNIError` (code, msg, details).

Every failure pycni reports is a ``CNIError``; its ``code`` is the CNI spec's error code where
one applies, and ``to_json()`` gives the spec's error result. Subclasses say *where* it failed::

    CNIError
    ├── ConfigError            network configuration unreadable or invalid (code 6/7)
    │   ├── NoConfigsFoundError   the config dir holds no network at all
    │   └── NetworkNotFoundError  no network of that name
    ├── InvalidArgumentError   container ID, ifname, CNI_ARGS... refused before use (code 3/4/7)
    ├── VersionError           version unparsable or unsupported for the operation (code 1)
    ├── ResultError            a plugin result (or cached result) that cannot be decoded (code 6)
    ├── PluginError            a plugin reported or caused a failure (its own code)
    │   ├── PluginNotFoundError   no executable of that type on CNI_PATH
    │   └── PluginTimeoutError    the plugin did not finish in time and was killed
    ├── CacheError             the results cache cannot be read or written (code 5)
    └── MultiError             several independent failures (GC, best-effort DEL, validate)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any

from ._json import kind as _kind

__all__ = [
    "ErrorCode",
    "CNIError",
    "ConfigError",
    "NoConfigsFoundError",
    "NetworkNotFoundError",
    "InvalidArgumentError",
    "VersionError",
    "ResultError",
    "PluginError",
    "PluginNotFoundError",
    "PluginTimeoutError",
    "CacheError",
    "MultiError",
]


class ErrorCode(enum.IntEnum):
    """Well-known CNI error codes (SPEC §"Error"); 100+ are plugin-specific."""

    UNKNOWN = 0
    INCOMPATIBLE_CNI_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENVIRONMENT_VARIABLES = 4
    IO_FAILURE = 5
    DECODING_FAILURE = 6
    INVALID_NETWORK_CONFIG = 7
    INVALID_NETNS = 8
    TRY_AGAIN_LATER = 11
    PLUGIN_NOT_AVAILABLE = 50
    LIMITED_CONNECTIVITY = 51
    INTERNAL = 999


class CNIError(Exception):
    """A CNI error: ``code``, short ``msg`` and optional ``details``.

    ``context`` (e.g. ``plugin type="bridge" failed (add)``) prefixes ``str()`` without changing
    the error result, so a plugin's own code/msg/details survive wrapping.
    """

    default_code: int = ErrorCode.UNKNOWN
    #: On an ADD error the runtime rolled back: the failures of that rollback's DELs (also in
    #: the notes), so a caller can tell a clean rollback from one that left state behind.
    rollback_errors: Sequence[CNIError] = ()

    def __init__(
        self,
        msg: str,
        details: str = "",
        *,
        code: int | None = None,
        context: str = "",
        plugin: str | None = None,
    ) -> None:
        self.code = int(self.default_code if code is None else code)
        self.msg = msg
        self.details = details
        self.context = context
        self.plugin = plugin
        super().__init__(str(self))

    def __str__(self) -> str:
        text = self.msg + (f"; {self.details}" if self.details else "")
        return f"{self.context}: {text}" if self.context else text

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, msg={self.msg!r}, details={self.details!r})"

    def with_context(self, context: str) -> CNIError:
        """Return this error with ``context`` prepended (the original object is left alone)."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.context = f"{context}: {self.context}" if self.context else context
        new.args = (str(new),)
        return new

    def to_json(self, cni_version: str | None = None) -> dict[str, Any]:
        """The spec's error result (``details`` omitted when empty, as Go plugins print it)."""
        out: dict[str, Any] = {}
        if cni_version:
            out["cniVersion"] = cni_version
        out["code"] = self.code
        out["msg"] = f"{self.context}: {self.msg}" if self.context else self.msg
        if self.details:
            out["details"] = self.details
        return out

    @classmethod
    def from_json(cls, data: Any) -> CNIError:
        """Decode an error result; anything malformed raises :class:`ResultError`."""
        if not isinstance(data, dict):
            raise ResultError(f"error result must be a JSON object, not {_kind(data)}")
        code = data.get("code", 0)
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code < 2**32:
            raise ResultError(f"error result field 'code' must be an unsigned integer, got {code!r}")
        msg = data.get("msg", "")
        details = data.get("details", "")
        for key, value in (("msg", msg), ("details", details)):
            if not isinstance(value, str):
                raise ResultError(f"error result field {key!r} must be a string, got {_kind(value)}")
        return cls(msg, details, code=code)


class ConfigError(CNIError):
    """A network configuration that cannot be used; ``path`` names the file when there is one."""

    default_code = ErrorCode.INVALID_NETWORK_CONFIG

    def __init__(self, msg: str, details: str = "", *, path: str | None = None, **kw: Any) -> None:
        self.path = path
        if path:
            kw.setdefault("context", path)
        super().__init__(msg, details, **kw)


class NoConfigsFoundError(ConfigError):
    """The config dir holds no network configuration (libcni ``NoConfigsFoundError``)."""


class NetworkNotFoundError(ConfigError):
    """No network configuration has the requested name (libcni ``NotFoundError``)."""


class InvalidArgumentError(CNIError):
    """A runtime argument (container ID, ifname, network name, CNI_ARGS, path) was refused."""

    default_code = ErrorCode.INVALID_ENVIRONMENT_VARIABLES


class VersionError(CNIError):
    """A version that cannot be parsed, or that does not allow the requested operation."""

    default_code = ErrorCode.INCOMPATIBLE_CNI_VERSION


class ResultError(CNIError):
    """Plugin output or a cached result that is not a valid CNI result."""

    default_code = ErrorCode.DECODING_FAILURE


class PluginError(CNIError):
    """A failure reported by a plugin, or of running it.

    ``stderr`` is what the plugin wrote there; ``exit_status`` is its exit code, or the negative
    signal number when a signal ended it (``None`` for in-process plugins).
    """

    def __init__(
        self,
        msg: str,
        details: str = "",
        *,
        stderr: str = "",
        exit_status: int | None = None,
        **kw: Any,
    ) -> None:
        self.stderr = stderr
        self.exit_status = exit_status
        super().__init__(msg, details, **kw)


class PluginNotFoundError(PluginError):
    """No plugin of the type a network configuration names: not built in (in-process) or no
    regular file of that name in any CNI_PATH directory (exec). The configuration cannot be
    run on this host, hence "invalid network config"."""

    default_code = ErrorCode.INVALID_NETWORK_CONFIG


class PluginTimeoutError(PluginError):
    """The plugin ran past its timeout; its whole process group was killed."""

    default_code = ErrorCode.TRY_AGAIN_LATER


class CacheError(CNIError):
    """The results cache cannot be read or written."""

    default_code = ErrorCode.IO_FAILURE


class MultiError(CNIError):
    """Several failures of one operation (GC, best-effort DEL, validation); see ``errors``."""

    def __init__(self, errors: Iterable[CNIError], msg: str = "", **kw: Any) -> None:
        self.errors = list(errors)
        first = self.errors[0] if self.errors else None
        kw.setdefault("code", first.code if first is not None else ErrorCode.UNKNOWN)
        super().__init__(msg or "\n".join(str(e) for e in self.errors), **kw)

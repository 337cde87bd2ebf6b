"""How a plugin runs: exec'd as a binary, or in-process from the built-in registry.

A backend is one call, ``run(plugin_type, request)``, returning the decoded ADD output (for GC
a built-in plugin's :class:`~pycni.sdk.GCReport` as JSON when it made one; otherwise ``None``),
with :meth:`find` for libcni's look-up-first ordering and :meth:`version_info`.
The request JSON and semantics are identical whichever runs it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Protocol

from attrs import evolve

from . import _json
from .errors import CNIError, InvalidArgumentError, PluginError, PluginNotFoundError
from .sdk import Plugin, PluginRequest, builtin_plugin, environ, internal_errors
from .sdk.invoke import VersionInfo, exec_plugin, exec_version, find_plugin

__all__ = [
    "Backend",
    "ExecBackend",
    "InProcessBackend",
    "AutoBackend",
    "select_backend",
    "validate_timeout",
    "BACKEND_NAMES",
]

BACKEND_NAMES = ("exec", "inprocess", "auto")
BUILTIN_LOCATION = "<built-in>"


def validate_timeout(timeout: float | None) -> float | None:
    """``None`` (no limit) or a finite number of seconds > 0: NaN would disable the deadline
    and a negative one kill every plugin at once."""
    if timeout is not None and not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise InvalidArgumentError(f"invalid plugin timeout {timeout!r}: must be a finite number of seconds > 0")
    return timeout


class Backend(Protocol):
    name: str

    def find(self, plugin_type: str, paths: Sequence[str]) -> str: ...

    def run(self, plugin_type: str, request: PluginRequest) -> dict[str, Any] | None: ...

    def version_info(self, plugin_type: str, paths: Sequence[str]) -> VersionInfo: ...

    def is_builtin(self, plugin_type: str) -> bool: ...

    def validate(self, plugin_type: str, request: PluginRequest) -> None: ...


class ExecBackend:
    """Exec ``<CNI_PATH dir>/<type>`` per call (libcni's behaviour)."""

    name = "exec"

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = validate_timeout(timeout)

    def find(self, plugin_type: str, paths: Sequence[str]) -> str:
        return find_plugin(plugin_type, paths)

    def run(self, plugin_type: str, request: PluginRequest) -> dict[str, Any] | None:
        # The caller's environment: inside `pycni serve` (a chain's inner plugins), the shim's.
        return exec_plugin(plugin_type, request, timeout=self.timeout, env=environ())

    def version_info(self, plugin_type: str, paths: Sequence[str]) -> VersionInfo:
        return exec_version(plugin_type, paths, timeout=self.timeout)

    def is_builtin(self, plugin_type: str) -> bool:
        return False

    def validate(self, plugin_type: str, request: PluginRequest) -> None:
        """An exec'd plugin has no way to check a config without acting on it."""


class InProcessBackend:
    """Call the built-in plugin of that type directly; no exec, no JSON on a pipe.

    The request still goes through a JSON encode/decode so a plugin sees exactly the bytes an
    exec'd one would (and cannot alias the runtime's objects).
    """

    name = "inprocess"

    def _plugin(self, plugin_type: str) -> Plugin:
        plugin = builtin_plugin(plugin_type) if plugin_type else None
        if plugin is None:
            raise PluginNotFoundError(f'plugin type "{plugin_type}" is not built in', plugin=plugin_type)
        return plugin

    def find(self, plugin_type: str, paths: Sequence[str]) -> str:
        self._plugin(plugin_type)
        return BUILTIN_LOCATION

    def run(self, plugin_type: str, request: PluginRequest) -> dict[str, Any] | None:
        plugin = self._plugin(plugin_type)
        config = _json.loads(request.stdin())
        try:
            with internal_errors(plugin_type):
                out = plugin.handle(evolve(request, config=config))
        except CNIError as e:
            raise PluginError(e.msg, e.details, code=e.code, plugin=plugin_type) from e
        if request.command != "ADD":
            return out  # GC: the plugin's GCReport as JSON, if it made one; the others: None
        return _json.loads(_json.dumps_compact(out)) if out is not None else {}

    def version_info(self, plugin_type: str, paths: Sequence[str]) -> VersionInfo:
        info = self._plugin(plugin_type).version_info()
        return VersionInfo(info["cniVersion"], tuple(info["supportedVersions"]))

    def is_builtin(self, plugin_type: str) -> bool:
        return bool(plugin_type) and builtin_plugin(plugin_type) is not None

    def validate(self, plugin_type: str, request: PluginRequest) -> None:
        try:
            with internal_errors(plugin_type):
                self._plugin(plugin_type).validate(request)
        except CNIError as e:
            raise PluginError(e.msg, e.details, code=e.code, plugin=plugin_type) from e


class AutoBackend:
    """In-process where a built-in plugin of the type exists, else exec."""

    name = "auto"

    def __init__(self, timeout: float | None = None) -> None:
        self._exec = ExecBackend(timeout)
        self._inprocess = InProcessBackend()

    def _pick(self, plugin_type: str) -> Backend:
        return self._inprocess if plugin_type and builtin_plugin(plugin_type) is not None else self._exec

    def find(self, plugin_type: str, paths: Sequence[str]) -> str:
        try:
            return self._pick(plugin_type).find(plugin_type, paths)
        except PluginNotFoundError as e:
            if not plugin_type or not paths or "/" in plugin_type:
                raise
            where = " ".join(d for d in paths if d)
            raise PluginNotFoundError(
                f'plugin type "{plugin_type}" is neither built in nor found in path [{where}]', plugin=plugin_type
            ) from e

    def run(self, plugin_type: str, request: PluginRequest) -> dict[str, Any] | None:
        return self._pick(plugin_type).run(plugin_type, request)

    def version_info(self, plugin_type: str, paths: Sequence[str]) -> VersionInfo:
        return self._pick(plugin_type).version_info(plugin_type, paths)

    def is_builtin(self, plugin_type: str) -> bool:
        return self._inprocess.is_builtin(plugin_type)

    def validate(self, plugin_type: str, request: PluginRequest) -> None:
        self._pick(plugin_type).validate(plugin_type, request)


def select_backend(name: str | None = None, *, timeout: float | None = None) -> Backend:
    """``exec | inprocess | auto`` (default: ``$PYCNI_BACKEND`` or ``auto``)."""
    choice = (name or os.environ.get("PYCNI_BACKEND") or "auto").lower()
    if choice == "exec":
        return ExecBackend(timeout)
    if choice == "inprocess":
        return InProcessBackend()
    if choice == "auto":
        return AutoBackend(timeout)
    raise InvalidArgumentError(f"unknown backend {choice!r}: choose one of {', '.join(BACKEND_NAMES)}")

"""The plugin contract: what a plugin implements, how built-in ones are found, delegation.

A plugin gets the same :class:`~.request.PluginRequest` whether the runtime called it in-process
or it was exec'd as a binary (:mod:`.skel` decodes env + stdin into one), so both paths are one
code path inside the plugin. In-process plugins are found through the ``pycni.plugins`` entry
point group, keyed by CNI type.

A plugin reads its environment through :func:`environ`: the process's, or — inside
:func:`environment`, as ``pycni serve`` runs each request — the one its caller had.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import attrs

from .. import version as _version
from ..errors import CNIError, ErrorCode, PluginError, PluginNotFoundError
from ..types._common import str_tuple
from .invoke import exec_plugin
from .logs import invocation
from .request import PluginRequest

__all__ = [
    "COMMANDS",
    "ENTRY_POINT_GROUP",
    "GCReport",
    "Plugin",
    "builtin_plugins",
    "builtin_plugin",
    "delegate",
    "environ",
    "environment",
    "internal_errors",
    "preset_registry",
]

COMMANDS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
ENTRY_POINT_GROUP = "pycni.plugins"

log = logging.getLogger("pycni.plugin")

_environ: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "pycni_plugin_environ", default=None
)


def environ() -> Mapping[str, str]:
    """The environment of the current plugin invocation (``os.environ`` unless :func:`environment`)."""
    return _environ.get() or os.environ


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """Plugins called within the block (and their :func:`pycni.netns.run_in` workers) see ``env``."""
    token = _environ.set(env)
    try:
        yield
    finally:
        _environ.reset(token)


@contextlib.contextmanager
def internal_errors(plugin_type: str) -> Iterator[None]:
    """A plugin's unexpected exception (not a :class:`~pycni.errors.CNIError`) inside the block
    becomes the error Go's skel makes of any plain error: code 999 with the exception's text.

    The one wrapper of every way a built-in plugin runs (in-process, exec'd, in ``pycni serve``,
    as a delegate), so a crash answers the same JSON on each; the traceback goes to the log
    (an exec'd plugin's stderr).
    """
    try:
        yield
    except CNIError:
        raise
    except Exception as e:
        log.exception("plugin %s crashed", plugin_type or "?")
        raise PluginError(str(e) or type(e).__name__, code=ErrorCode.INTERNAL, plugin=plugin_type) from e


@attrs.frozen
class GCReport:
    """What a built-in plugin's ``gc`` collected (or, dry run, would collect): a pycni extension
    the in-process runtime passes on; an exec'd plugin prints nothing for GC, as the spec says."""

    removed: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)

    def to_json(self) -> dict[str, list[str]]:
        return {"removed": list(self.removed)}

    @classmethod
    def from_json(cls, data: Any) -> GCReport:
        """A delegate's GC output (:func:`delegate`): its report, or an empty one (an exec'd
        delegate prints nothing)."""
        removed = data.get("removed", ()) if isinstance(data, Mapping) else ()
        return cls(tuple(str(item) for item in removed))


class Plugin:
    """Base class of in-process plugins.

    ``add`` returns the result as a JSON object at the request's ``cniVersion``; ``gc`` may
    return a :class:`GCReport`; the other commands return ``None``. Failures are raised as
    :class:`~pycni.errors.CNIError`.

    Every plugin must implement ``add`` (the spec's one command with a result): the base class's
    fails with code 999. The other commands succeed by doing nothing unless overridden: a DEL
    with nothing to delete, a CHECK with nothing to check, a GC with nothing to collect, and a
    STATUS of a plugin always ready all succeed per the spec.
    """

    #: The CNI ``type`` this plugin answers to.
    type: str = ""
    supported_versions: tuple[str, ...] = _version.SUPPORTED

    def add(self, request: PluginRequest) -> dict[str, Any]:
        raise CNIError(f"plugin {self.type or type(self).__name__!r} does not implement ADD", code=ErrorCode.INTERNAL)

    def check(self, request: PluginRequest) -> None:
        return None

    def delete(self, request: PluginRequest) -> None:
        return None

    def gc(self, request: PluginRequest) -> GCReport | None:
        return None

    def status(self, request: PluginRequest) -> None:
        return None

    def validate(self, request: PluginRequest) -> None:
        """Refuse a config (and its runtimeConfig/args) that ADD would refuse, changing nothing.

        The runtime calls this for every built-in plugin of a chain before the first ADD runs,
        so a bad value in the third plugin fails before the first has touched the kernel.
        """
        return None

    def version_info(self) -> dict[str, Any]:
        return {"cniVersion": _version.CURRENT, "supportedVersions": list(self.supported_versions)}

    def handle(self, request: PluginRequest) -> dict[str, Any] | None:
        """Dispatch ``request.command`` after the version gates every CNI plugin applies.

        Returns the command's JSON output: ADD's result, VERSION's info, GC's report (if any);
        ``None`` for the others. What is logged meanwhile carries the attachment
        (:func:`.logs.invocation`)."""
        with invocation(self.type, request):
            return self._dispatch(request)

    def _dispatch(self, request: PluginRequest) -> dict[str, Any] | None:
        cmd = request.command
        if cmd == "VERSION":
            return self.version_info()
        if cmd not in COMMANDS:
            raise CNIError(f"unknown CNI_COMMAND: {cmd}", code=ErrorCode.INVALID_ENVIRONMENT_VARIABLES)
        version = request.cni_version
        if version not in self.supported_versions and not (version == "" and "0.1.0" in self.supported_versions):
            raise CNIError(
                "incompatible CNI versions",
                f'config is "{version}", plugin supports {list(self.supported_versions)}',
                code=ErrorCode.INCOMPATIBLE_CNI_VERSION,
            )
        if cmd in ("ADD", "CHECK", "DEL") and request.netns and _is_own_netns(request.netns):
            # Checked before anything changes: the caller's own namespace as the container's
            # would put "eth0", its address and a default route on the host (Go's skel only
            # notices afterwards). CNI_NETNS_OVERRIDE=1 is skel's documented escape hatch.
            raise CNIError(
                "plugin's netns and netns from CNI_NETNS should not be the same", code=ErrorCode.INVALID_NETNS
            )
        if cmd == "ADD":
            return self.add(request)
        if cmd == "DEL":
            self.delete(request)
            return None
        if cmd == "CHECK":
            if not _version.supports_check(version):
                raise CNIError("config version does not allow CHECK", code=ErrorCode.INCOMPATIBLE_CNI_VERSION)
            self.check(request)
            return None
        if cmd == "GC":
            if not _version.supports_gc(version):
                raise CNIError("config version does not allow GC", code=ErrorCode.INCOMPATIBLE_CNI_VERSION)
            report = self.gc(request)
            return None if report is None else report.to_json()
        if not _version.supports_status(version):
            raise CNIError("config version does not allow STATUS", code=ErrorCode.INCOMPATIBLE_CNI_VERSION)
        self.status(request)
        return None


def _is_own_netns(path: str) -> bool:
    if environ().get("CNI_NETNS_OVERRIDE") == "1":
        return False
    from .. import netns  # the plugins have it loaded; the runtime need not

    try:
        return netns.identity(path) == netns.own_identity()
    except OSError:
        return False


@cache
def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    found: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


#: The registry as an installed shim knows it (type -> ``module:Class``, resolved at install time):
#: set, it replaces the entry-point scan, which reads every installed distribution's metadata.
_preset: dict[str, str] = {}


def preset_registry(targets: Mapping[str, str]) -> None:
    """Use ``targets`` (CNI type -> ``module:Class``) as the built-in registry from now on: an
    installed plugin's fallback (a chain's inner plugins, a bridge's host-local) finds them
    without scanning the installed distributions."""
    _preset.clear()
    _preset.update(targets)
    _load.cache_clear()


def _registry() -> Mapping[str, Any]:
    return _preset or _entry_points()


def builtin_plugin(plugin_type: str) -> Plugin | None:
    """The in-process plugin for a CNI type (loaded on first use), or ``None``."""
    return _load(plugin_type) if plugin_type in _registry() else None


@cache  # keyed by registry names only: a caller's arbitrary type strings are never kept
def _load(plugin_type: str) -> Plugin | None:
    target = _preset.get(plugin_type)
    try:
        if target is None:
            cls = _entry_points()[plugin_type].load()
        else:
            import importlib

            module, _, name = target.partition(":")
            cls = getattr(importlib.import_module(module), name)
        plugin: Plugin = cls()  # untyped either way: the group's contract is a Plugin class
    except ImportError:
        return None
    return plugin


def builtin_plugins() -> dict[str, Plugin]:
    """Every in-process plugin that loads, by CNI type."""
    loaded = {name: builtin_plugin(name) for name in sorted(_registry())}
    return {name: plugin for name, plugin in loaded.items() if plugin is not None}


def delegate(
    request: PluginRequest, plugin_type: str, command: str | None = None, *, timeout: float | None = None
) -> dict[str, Any] | None:
    """Run a delegated plugin (e.g. IPAM) with the same config and env, as libcni's ``DelegateAdd``.

    A built-in plugin of that type runs in-process; otherwise the binary is exec'd from the
    request's ``CNI_PATH``. ADD returns the delegate's result object.
    """
    if not plugin_type:
        raise PluginNotFoundError("no plugin name provided", code=ErrorCode.INTERNAL)
    sub = attrs.evolve(request, command=command or request.command)
    plugin = builtin_plugin(plugin_type)
    if plugin is not None:
        with internal_errors(plugin_type):
            return plugin.handle(sub)
    try:
        return exec_plugin(plugin_type, sub, timeout=timeout, env=environ())
    except PluginNotFoundError as e:
        # Inside a plugin a missing delegate is the plugin's own failure (999), as in Go.
        raise PluginNotFoundError(e.msg, e.details, code=ErrorCode.INTERNAL, plugin=plugin_type) from e

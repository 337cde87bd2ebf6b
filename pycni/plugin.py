"""The plugin interface: what an in-process plugin receives and implements.

A plugin gets the same :class:`PluginRequest` whether the runtime called it in-process or it was
exec'd as a binary (``pycni_plugins.skel`` decodes env + stdin into one), so both paths are one
code path inside the plugin. In-process plugins are found through the ``pycni.plugins`` entry
point group, keyed by CNI type.

A plugin reads its environment through :func:`environ`: the process's, or — inside
:func:`environment`, as ``pycni serve`` runs each request — the one its caller had.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Any

import attrs

from . import _json
from . import version as _version
from .errors import CNIError, ErrorCode, InvalidArgumentError, PluginError, PluginNotFoundError

__all__ = [
    "COMMANDS",
    "PluginRequest",
    "Plugin",
    "parse_cni_args",
    "load_args",
    "builtin_plugins",
    "builtin_plugin",
    "delegate",
    "environ",
    "environment",
    "validate_container_id",
    "validate_ifname",
    "validate_attachment_key",
    "PARENT_PID_ENV",
]

COMMANDS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
ENTRY_POINT_GROUP = "pycni.plugins"
#: Set by pycni for every plugin it execs: the PID of the process that exec'd it, so an installed
#: pycni plugin can tell at start-up that its runtime died before it got going.
PARENT_PID_ENV = "PYCNI_PARENT_PID"
_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_NAME_MAX = 255  # bytes in one file name (ext4, tmpfs, xfs, btrfs)


def validate_container_id(container_id: str) -> None:
    """libcni's rule (missing: code 3; anything but ``[A-Za-z0-9][A-Za-z0-9_.-]*``: code 4)."""
    if not container_id:
        raise InvalidArgumentError("missing containerID", code=ErrorCode.UNKNOWN_CONTAINER)
    if not _ID_PATTERN.fullmatch(container_id):
        raise InvalidArgumentError("invalid characters in containerID", container_id)


def validate_ifname(ifname: str) -> None:
    """Linux interface name rules (IFNAMSIZ): 1..15 bytes, not ``.``/``..``, no ``/ :`` or spaces."""
    if not ifname:
        raise InvalidArgumentError("interface name is empty")
    if len(ifname.encode("utf-8", "surrogatepass")) > 15:
        raise InvalidArgumentError("interface name is too long", "interface name should be less than 16 characters")
    if ifname in (".", ".."):
        raise InvalidArgumentError("interface name is . or ..")
    if any(c in "/:" or c.isspace() or c == "\x00" for c in ifname):
        raise InvalidArgumentError("interface name contains / or : or whitespace characters")


def validate_attachment_key(network: str, container_id: str, ifname: str) -> None:
    """Container ID and ifname valid, and ``<network>-<containerID>-<ifname>`` (the cache file
    name; the longest name derived from an attachment) fits in one file name: otherwise an ADD
    would fail at its cache write after the plugins have run, and an ID too long for a file name
    is too long for every record keyed by it. Code 4, before anything changes."""
    validate_container_id(container_id)
    validate_ifname(ifname)
    if len(f"{network}-{container_id}-{ifname}".encode()) > _NAME_MAX:
        raise InvalidArgumentError(
            "containerID is too long",
            f"<network>-<containerID>-<ifname> must fit in {_NAME_MAX} bytes (a file name); "
            f"the containerID has {len(container_id)}",
        )


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


def parse_cni_args(text: str) -> list[tuple[str, str]]:
    """Split ``K=V;K2=V2`` strictly (each pair exactly one ``=``, both sides non-empty)."""
    if not text:
        return []
    pairs = []
    for item in text.split(";"):
        parts = item.split("=")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise InvalidArgumentError(f'invalid CNI_ARGS pair "{item}"')
        pairs.append((parts[0], parts[1]))
    return pairs


def load_args(text: str, known: Iterable[str]) -> dict[str, str]:
    """Plugin-side ``CNI_ARGS`` as Go's ``types.LoadArgs`` reads them into a plugin's struct.

    Each pair must split into exactly two parts on ``=`` (an empty value is allowed); keys outside
    ``known`` are an error unless ``IgnoreUnknown`` is ``1``/``true``. Returns the known keys.
    Errors are plugin-internal (code 999) with Go's texts.
    """
    found: dict[str, str] = {}
    unknown: list[str] = []
    ignore_unknown = False
    wanted = set(known)
    for pair in text.split(";") if text else ():
        parts = pair.split("=")
        if len(parts) != 2:
            raise CNIError(f"ARGS: invalid pair {_json.go_quote(pair)}", code=ErrorCode.INTERNAL)
        key, value = parts
        if key == "IgnoreUnknown":
            if value.lower() not in ("1", "true", "0", "false"):
                raise CNIError(
                    f"ARGS: error parsing value of pair {_json.go_quote(pair)}: "
                    f"boolean unmarshal error: invalid input {value.lower()}",
                    code=ErrorCode.INTERNAL,
                )
            ignore_unknown = value.lower() in ("1", "true")
        elif key in wanted:
            found[key] = value
        else:
            unknown.append(pair)
    if unknown and not ignore_unknown:
        raise CNIError(f"ARGS: unknown args [{' '.join(map(_json.go_quote, unknown))}]", code=ErrorCode.INTERNAL)
    return found


@attrs.frozen
class PluginRequest:
    """One plugin invocation: the six ``CNI_*`` parameters and the decoded stdin ``config``."""

    command: str
    config: Mapping[str, Any]
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: str = ""
    path: tuple[str, ...] = ()

    @property
    def cni_version(self) -> str:
        value = _json.go_field(self.config, "cniVersion")
        return value if isinstance(value, str) else ""

    @property
    def network_name(self) -> str:
        value = _json.go_field(self.config, "name")
        return value if isinstance(value, str) else ""

    @property
    def prev_result(self) -> Mapping[str, Any] | None:
        value = _json.go_field(self.config, "prevResult")
        return value if isinstance(value, Mapping) else None

    @property
    def runtime_config(self) -> Mapping[str, Any]:
        value = _json.go_field(self.config, "runtimeConfig")
        return value if isinstance(value, Mapping) else {}

    def load_args(self, *known: str) -> dict[str, str]:
        """The ``known`` keys of ``CNI_ARGS``, with Go's ``LoadArgs`` rules (see :func:`load_args`)."""
        return load_args(self.args, known)

    def stdin(self) -> bytes:
        return json.dumps(self.config, separators=(",", ":")).encode()

    def env(self) -> dict[str, str]:
        return {
            "CNI_COMMAND": self.command,
            "CNI_CONTAINERID": self.container_id,
            "CNI_NETNS": self.netns,
            "CNI_IFNAME": self.ifname,
            "CNI_ARGS": self.args,
            "CNI_PATH": ":".join(self.path),
        }


class Plugin:
    """Base class of in-process plugins. Commands a plugin does not implement succeed.

    ``add`` returns the result as a JSON object at the request's ``cniVersion``; ``gc`` may
    return a report of what it removed; the other commands return ``None``. Failures are raised
    as :class:`~pycni.errors.CNIError`.
    """

    #: The CNI ``type`` this plugin answers to.
    type: str = ""
    supported_versions: tuple[str, ...] = _version.SUPPORTED

    def add(self, request: PluginRequest) -> dict[str, Any]:
        raise NotImplementedError

    def check(self, request: PluginRequest) -> None:
        return None

    def delete(self, request: PluginRequest) -> None:
        return None

    def gc(self, request: PluginRequest) -> dict[str, Any] | None:
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
        """Dispatch ``request.command`` after the version gates every CNI plugin applies."""
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
            return self.gc(request)
        if not _version.supports_status(version):
            raise CNIError("config version does not allow STATUS", code=ErrorCode.INCOMPATIBLE_CNI_VERSION)
        self.status(request)
        return None


def _is_own_netns(path: str) -> bool:
    if environ().get("CNI_NETNS_OVERRIDE") == "1":
        return False
    from . import netns  # the plugins have it loaded; the runtime need not

    try:
        return netns.identity(path) == netns.identity("/proc/thread-self/ns/net")
    except OSError:
        return False


@cache
def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    found: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


@cache
def builtin_plugin(plugin_type: str) -> Plugin | None:
    """The in-process plugin for a CNI type (loaded on first use), or ``None``."""
    ep = _entry_points().get(plugin_type)
    if ep is None:
        return None
    try:
        plugin: Plugin = ep.load()()  # entry points are untyped: the group's contract is a Plugin class
    except ImportError:
        return None
    return plugin


def builtin_plugins() -> dict[str, Plugin]:
    """Every in-process plugin that loads, by CNI type."""
    loaded = {name: builtin_plugin(name) for name in sorted(_entry_points())}
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
        try:
            return plugin.handle(sub)
        except CNIError:
            raise
        except Exception as e:  # a bug in a delegate must still come back as a CNI error
            raise PluginError(str(e) or type(e).__name__, code=ErrorCode.INTERNAL, plugin=plugin_type) from e
    from .invoke import exec_plugin

    try:
        return exec_plugin(plugin_type, sub, timeout=timeout, env=environ())
    except PluginNotFoundError as e:
        # Inside a plugin a missing delegate is the plugin's own failure (999), as in Go.
        raise PluginNotFoundError(e.msg, e.details, code=ErrorCode.INTERNAL, plugin=plugin_type) from e

"""Network configuration files: libcni's ``conf.go``, with every failure naming the file.

A *network configuration list* (``.conflist``) holds the network ``name``, the ``cniVersion``
the runtime uses with every plugin, and the ``plugins`` chain. Single-plugin ``.conf``/``.json``
files are the deprecated form and are up-converted to a one-plugin list. Unknown keys are kept
exactly (integers stay integers) because plugins read them.

Loading checks what libcni checks, no more: a plugin config is decoded as Go decodes it into
``types.PluginConf`` (keys matched exactly, else case-insensitively; a wrongly typed known field
is an error), while network names and plugin types are validated where they are used (ADD,
CHECK, DEL, GC take the network lock, which refuses bad names; looking a plugin up refuses a type
with a path separator), so a bad name elsewhere in the directory does not hide a good network.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from . import _json
from . import version as _version
from .errors import ConfigError, NetworkNotFoundError, NoConfigsFoundError

__all__ = [
    "NetworkConfig",
    "NetworkConfigList",
    "DEFAULT_CONF_DIR",
    "conf_files",
    "conf_from_bytes",
    "conf_from_file",
    "conflist_from_bytes",
    "conflist_from_file",
    "conflist_from_conf",
    "load_conf",
    "load_conflist",
    "list_networks",
]

#: libcni's and go-cni's default network config directory.
DEFAULT_CONF_DIR = "/etc/cni/net.d"
CONFLIST_EXTS = (".conflist",)
CONF_EXTS = (".conf", ".json")


@attrs.frozen
class NetworkConfig:
    """One plugin's configuration object (``raw``), as found in the file."""

    raw: Mapping[str, Any]
    source: str = ""

    data: bytes = b""
    """The file's bytes for a single-plugin config (libcni keeps them exactly); else empty."""

    _fields: Mapping[str, Any] | None = attrs.field(default=None, init=False, eq=False, repr=False)
    # ``raw`` decoded into PluginConf's fields once (a runtime reads type, name and
    # capabilities of every plugin at every call; ``raw`` is never changed).

    def _field(self, name: str) -> Any:
        fields = self._fields
        if fields is None:
            fields = _PLUGIN_CONF.pick(self.raw)
            object.__setattr__(self, "_fields", fields)
        return fields.get(name)

    @property
    def type(self) -> str:
        return self._field("type") or ""

    @property
    def name(self) -> str:
        return self._field("name") or ""

    @property
    def cni_version(self) -> str:
        return self._field("cniVersion") or ""

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Enabled capability names, in file order (only ``true`` entries count; a Go map: exact keys)."""
        caps = self._field("capabilities")
        if not isinstance(caps, Mapping):
            return ()
        return tuple(k for k, v in caps.items() if v is True)

    @property
    def bytes(self) -> bytes:
        return self.data or _json.dumps_compact(self.raw).encode()


@attrs.frozen
class NetworkConfigList:
    """A network: its name, the selected ``cni_version`` and the plugin chain.

    ``bytes`` are the original file bytes (what libcni caches); drop-in plugins are not in them.
    """

    name: str
    cni_version: str
    plugins: tuple[NetworkConfig, ...]
    disable_check: bool = False
    disable_gc: bool = False
    load_only_inlined_plugins: bool = False
    cni_versions: tuple[str, ...] | None = None
    bytes: bytes = b""
    source: str = ""


def _decode(data: bytes | str, what: str, source: str | None) -> dict[str, Any]:
    try:
        raw = _json.loads(data)
    except _json.JSONDecodeFailure as e:
        raise ConfigError(f"error parsing {what}: {e}", path=source, code=6) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"error parsing {what}: expected a JSON object", path=source, code=6)
    return raw


def _bool_field(raw: Mapping[str, Any], key: str, source: str | None) -> bool:
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ConfigError(f"error parsing configuration list: invalid value {value!r} for {key}", path=source)
    raise ConfigError(f"error parsing configuration list: invalid type for {key}", path=source)


# The Go structs a plugin config is decoded into (libcni's pkg/types): field -> Go type.
_STRUCTS: dict[str, dict[str, str]] = {
    "PluginConf": {
        "cniVersion": "string",
        "name": "string",
        "type": "string",
        "capabilities": "map[string]bool",
        "ipam": "types.IPAM",
        "dns": "types.DNS",
        "prevResult": "map[string]interface {}",
        "cni.dev/valid-attachments": "[]types.GCAttachment",
    },
    "types.IPAM": {"type": "string"},
    "types.DNS": {"nameservers": "[]string", "domain": "string", "search": "[]string", "options": "[]string"},
    "types.GCAttachment": {"containerID": "string", "ifname": "string"},
}
_FIELDS = {name: _json.GoFields(*fields) for name, fields in _STRUCTS.items()}
_PLUGIN_CONF = _FIELDS["PluginConf"]


def _check(value: Any, go_type: str, field: str) -> None:
    """Raise :class:`~pycni._json.GoValueError` where Go's decoder reports a type error (``null``
    never is one), naming ``field`` as Go does (an element's error names its slice or map)."""
    try:
        if go_type.startswith("[]"):
            for item in _json.go_array(value, go_type):
                _check(item, go_type[2:], field)
        elif go_type in _STRUCTS:
            types = _STRUCTS[go_type]
            for name, item in _FIELDS[go_type].pairs(_json.go_object(value, go_type)):
                _check(item, types[name], f"{field}.{name}")
        elif go_type == "map[string]bool":
            for item in _json.go_object(value, go_type).values():
                _check(item, "bool", field)
        elif go_type.startswith("map["):
            _json.go_object(value, go_type)
        elif go_type == "string":
            _json.go_string(value)
        else:
            _json.go_bool(value, go_type)
    except _json.GoValueError as e:
        e.field = e.field or field
        raise


def _plugin(raw: dict[str, Any], source: str | None, data: bytes = b"") -> NetworkConfig:
    """libcni's ``NetworkPluginConfFromBytes``: decode into ``types.PluginConf``, require a type."""
    try:
        _check(raw, "PluginConf", "PluginConf")
    except _json.GoValueError as e:
        raise ConfigError(f"error parsing configuration: {e.go_message()}", path=source) from None
    conf = NetworkConfig(raw=raw, source=source or "", data=data)
    if not conf.type:
        raise ConfigError("error parsing configuration: missing 'type'", path=source)
    return conf


def conf_from_bytes(data: bytes | str, source: str | None = None) -> NetworkConfig:
    """Parse one plugin configuration (a ``.conf``); it must name its ``type``. Its bytes are kept."""
    raw = _decode(data, "configuration", source)
    return _plugin(raw, source, data.encode() if isinstance(data, str) else bytes(data))


def conf_from_file(path: str) -> NetworkConfig:
    return conf_from_bytes(_read(path), source=path)


def conflist_from_conf(conf: NetworkConfig) -> NetworkConfigList:
    """Up-convert a single plugin config: ``{"name", "cniVersion", "plugins": [conf]}``."""
    listing = {"name": conf.name, "cniVersion": conf.cni_version, "plugins": [conf.raw]}
    return conflist_from_bytes(_json.dumps_compact(listing).encode(), source=conf.source or None, drop_ins=False)


def conflist_from_bytes(data: bytes | str, source: str | None = None, *, drop_ins: bool = False) -> NetworkConfigList:
    """Parse a network configuration list; ``drop_ins`` also appends ``<dir>/<name>/*.conf``."""
    raw = _decode(data, "configuration list", source)
    prefix = "error parsing configuration list:"
    if "name" not in raw:
        raise ConfigError(f"{prefix} no name", path=source)
    name = raw["name"]
    if not isinstance(name, str):
        raise ConfigError(f"{prefix} invalid name type {type(name).__name__}", path=source)
    cni_version = _version.select_version(raw.get("cniVersion"), raw.get("cniVersions"), path=source)
    versions = raw.get("cniVersions")
    disable_check = _bool_field(raw, "disableCheck", source)
    disable_gc = _bool_field(raw, "disableGC", source)
    inlined_only = _bool_field(raw, "loadOnlyInlinedPlugins", source)

    plugins: list[NetworkConfig] = []
    if "plugins" in raw:
        entries = raw["plugins"]
        if not isinstance(entries, list):
            raise ConfigError(f"{prefix} invalid 'plugins' type {type(entries).__name__}", path=source)
        if not entries:
            raise ConfigError(f"{prefix} no plugins in list", path=source)
        for i, entry in enumerate(entries):
            try:
                if not isinstance(entry, dict):
                    raise ConfigError("error parsing configuration: expected a JSON object")
                plugins.append(_plugin(entry, None))
            except ConfigError as e:
                raise ConfigError(f"failed to parse plugin config {i}: {e.msg}", path=source) from None
        plugins = [attrs.evolve(p, source=source or "") for p in plugins]
    elif inlined_only:
        raise ConfigError("`loadOnlyInlinedPlugins` is true, and no 'plugins' key", path=source)

    # libcni joins the name to the directory unchecked; a name that is not one path component
    # cannot be used anyway (it fails validation on use), so it gets no drop-ins here.
    if drop_ins and not inlined_only and source and name and _one_component(name):
        plugins.extend(_drop_ins(os.path.join(os.path.dirname(source), name)))
    if not plugins:
        raise ConfigError("no plugin configs found", path=source)
    return NetworkConfigList(
        name=name,
        cni_version=cni_version,
        plugins=tuple(plugins),
        disable_check=disable_check,
        disable_gc=disable_gc,
        load_only_inlined_plugins=inlined_only,
        cni_versions=tuple(versions) if isinstance(versions, list) else None,
        bytes=data.encode() if isinstance(data, str) else bytes(data),
        source=source or "",
    )


def _one_component(name: str) -> bool:
    return "/" not in name and "\x00" not in name and name not in (".", "..")


def _drop_ins(directory: str) -> list[NetworkConfig]:
    return [conf_from_file(path) for path in conf_files(directory, (".conf",))]


def conflist_from_file(path: str) -> NetworkConfigList:
    return conflist_from_bytes(_read(path), source=path, drop_ins=True)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"error reading {path}: {e.strerror}", path=path, code=5) from None


def conf_files(directory: str, extensions: Iterable[str]) -> list[str]:
    """Regular (non-directory) files in ``directory`` with one of ``extensions``, sorted by name."""
    exts = tuple(extensions)
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ConfigError(f"error reading config dir {directory}: {e.strerror}", path=directory, code=5) from None
    return [e.path for e in entries if not e.is_dir(follow_symlinks=False) and _ext(e.name) in exts]


def _ext(name: str) -> str:
    """Go's ``filepath.Ext``: from the last dot, so ``.conf`` itself has the extension ``.conf``."""
    dot = name.rfind(".")
    return name[dot:] if dot >= 0 else ""


def load_conf(directory: str, name: str) -> NetworkConfig:
    """The first single-plugin config (``.conf``/``.json``, lexical order) named ``name``."""
    files = conf_files(directory, CONF_EXTS)
    if not files:
        raise NoConfigsFoundError(f"no net configurations found in {directory}", path=directory)
    for path in files:
        conf = conf_from_file(path)
        if conf.name == name:
            return conf
    raise NetworkNotFoundError(f'no net configuration with name "{name}" in {directory}', path=directory)


def load_conflist(directory: str, name: str) -> NetworkConfigList:
    """libcni's ``LoadNetworkConf``: conflists in lexical order first, then single confs.

    As in libcni, a file that fails to parse aborts the search even if it is another network's.
    """
    lists = conf_files(directory, CONFLIST_EXTS)
    for path in lists:
        conflist = conflist_from_file(path)
        if conflist.name == name:
            return conflist
    try:
        return conflist_from_conf(load_conf(directory, name))
    except NoConfigsFoundError:
        if lists:
            raise NetworkNotFoundError(
                f'no net configuration with name "{name}" in {directory}', path=directory
            ) from None
        raise


def list_networks(directory: str, *, errors: list[ConfigError] | None = None) -> list[NetworkConfigList]:
    """Every network in ``directory`` in load order (first file of a name wins), for inspection.

    A file that fails to parse raises, unless ``errors`` is given: then it is appended there and
    the listing goes on with the other files.
    """
    seen: dict[str, NetworkConfigList] = {}
    lists = conf_files(directory, CONFLIST_EXTS)
    for path in lists + conf_files(directory, CONF_EXTS):
        try:
            conflist = conflist_from_file(path) if path in lists else conflist_from_conf(conf_from_file(path))
        except ConfigError as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        seen.setdefault(conflist.name, conflist)
    return list(seen.values())

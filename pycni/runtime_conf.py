"""The runtime's per-call parameters (:class:`RuntimeConf`) and the one place that builds what a
plugin is given from them: its stdin config and ``CNI_*`` parameters.

libcni's ``buildOneConfig``: ``name`` and ``cniVersion`` come from the list (overwriting the
plugin's), ``prevResult`` is injected when there is one, and ``runtimeConfig`` is the plugin's
enabled capabilities intersected with the caller's capability args (replacing any in the file).
GC adds the valid attachments under both the spec key and libcni's legacy key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .config import NetworkConfig
from .errors import InvalidArgumentError
from .sdk import GCAttachment, PluginRequest

__all__ = [
    "RuntimeConf",
    "build_config",
    "build_request",
    "format_cni_args",
    "VALID_ATTACHMENTS_KEY",
    "LEGACY_ATTACHMENTS_KEY",
]

VALID_ATTACHMENTS_KEY = "cni.dev/valid-attachments"
LEGACY_ATTACHMENTS_KEY = "cni.dev/attachments"


def _arg_pairs(pairs: Iterable[Iterable[str]]) -> tuple[tuple[str, str], ...]:
    return tuple((key, value) for key, value in pairs)


@attrs.frozen
class RuntimeConf:
    """Per-attachment runtime parameters (libcni ``RuntimeConf``).

    ``args`` become ``CNI_ARGS`` (``k=v`` joined by ``;``); ``capability_args`` feed
    ``runtimeConfig`` for plugins that enable the capability.
    """

    container_id: str
    netns: str = ""
    ifname: str = "eth0"
    args: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_arg_pairs)
    capability_args: Mapping[str, Any] = attrs.field(factory=dict)


def format_cni_args(args: Iterable[Sequence[str]]) -> str:
    """``k=v`` pairs joined by ``;``; a ``;`` or ``=`` inside would corrupt the string, so refuse it."""
    parts = []
    for key, value in args:
        if not key or any(c in key for c in ";=\x00") or any(c in value for c in ";\x00"):
            raise InvalidArgumentError(f'invalid CNI_ARGS pair "{key}={value}"')
        parts.append(f"{key}={value}")
    return ";".join(parts)


def build_config(
    plugin: NetworkConfig,
    *,
    name: str,
    cni_version: str,
    prev_result: Mapping[str, Any] | None = None,
    capability_args: Mapping[str, Any] | None = None,
    valid_attachments: Sequence[GCAttachment] | None = None,
    gc: bool = False,
    strip_capabilities: bool = False,
) -> dict[str, Any]:
    """The stdin object for one plugin call (the plugin's own config is not modified)."""
    config = dict(plugin.raw)
    config["name"] = name
    config["cniVersion"] = cni_version
    if strip_capabilities:
        config.pop("capabilities", None)
    if gc:
        if valid_attachments is not None:
            listed = [a.to_json() for a in valid_attachments]
            config[VALID_ATTACHMENTS_KEY] = listed
            config[LEGACY_ATTACHMENTS_KEY] = listed
        return config
    if prev_result is not None:
        config["prevResult"] = prev_result
    if capability_args:
        runtime_config = {cap: capability_args[cap] for cap in plugin.capabilities if cap in capability_args}
        if runtime_config:
            config["runtimeConfig"] = runtime_config
    return config


def build_request(
    command: str, config: Mapping[str, Any], rt: RuntimeConf | None, path: Sequence[str], state_dir: str
) -> PluginRequest:
    """Pair a stdin config with the ``CNI_*`` parameters (empty for GC and STATUS) and the
    plugins' state dir."""
    if rt is None:
        return PluginRequest(command=command, config=config, path=tuple(path), state_dir=state_dir)
    return PluginRequest(
        command=command,
        config=config,
        container_id=rt.container_id,
        netns=rt.netns,
        ifname=rt.ifname,
        args=format_cni_args(rt.args),
        path=tuple(path),
        state_dir=state_dir,
    )

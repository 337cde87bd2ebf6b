"""What a plugin is given: the six ``CNI_*`` parameters and its decoded stdin config."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from .. import _json
from .args import load_args

__all__ = ["PluginRequest"]


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
        """The ``known`` keys of ``CNI_ARGS``, with Go's ``LoadArgs`` rules (see :func:`.load_args`)."""
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

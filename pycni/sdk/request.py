"""What a plugin is given: the six ``CNI_*`` parameters and its decoded stdin config."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from .. import _json
from .args import load_args

__all__ = ["PluginRequest", "DEFAULT_STATE_DIR", "STATE_DIR_ENV", "default_state_dir"]

DEFAULT_STATE_DIR = "/run/pycni"
#: How an exec'd plugin (and the daemon, from the forwarded env) learns the state dir.
STATE_DIR_ENV = "PYCNI_STATE_DIR"


def default_state_dir(env: Mapping[str, str] | None = None) -> str:
    """The plugins' state dir when none is given: ``$PYCNI_STATE_DIR`` of ``env`` (default
    ``os.environ``), else :data:`DEFAULT_STATE_DIR`. The one place the variable is read."""
    return (os.environ if env is None else env).get(STATE_DIR_ENV) or DEFAULT_STATE_DIR


@attrs.frozen
class PluginRequest:
    """One plugin invocation: the six ``CNI_*`` parameters, the decoded stdin ``config`` and
    the directory of the plugins' own records (``state_dir``; exec'd: ``$PYCNI_STATE_DIR``)."""

    command: str
    config: Mapping[str, Any]
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: str = ""
    path: tuple[str, ...] = ()
    state_dir: str = attrs.field(factory=default_state_dir)
    _netconf: _json.GoReader | None = attrs.field(default=None, init=False, eq=False, repr=False)
    # The NetConf fields below are read many times per call; ``config`` is never changed, so
    # one reader (one pass over its keys) serves them all.

    def _get(self, name: str) -> Any:
        reader = self._netconf
        if reader is None:
            reader = _json.GoReader(self.config)
            object.__setattr__(self, "_netconf", reader)
        return reader.get(name)

    @property
    def cni_version(self) -> str:
        value = self._get("cniVersion")
        return value if isinstance(value, str) else ""

    @property
    def network_name(self) -> str:
        value = self._get("name")
        return value if isinstance(value, str) else ""

    @property
    def prev_result(self) -> Mapping[str, Any] | None:
        value = self._get("prevResult")
        return value if isinstance(value, Mapping) else None

    @property
    def runtime_config(self) -> Mapping[str, Any]:
        value = self._get("runtimeConfig")
        return value if isinstance(value, Mapping) else {}

    def load_args(self, *known: str) -> dict[str, str]:
        """The ``known`` keys of ``CNI_ARGS``, with Go's ``LoadArgs`` rules (see :func:`.load_args`)."""
        return load_args(self.args, known)

    def stdin(self) -> bytes:
        return _json.dumps_compact_ascii(self.config).encode()

    def env(self) -> dict[str, str]:
        return {
            "CNI_COMMAND": self.command,
            "CNI_CONTAINERID": self.container_id,
            "CNI_NETNS": self.netns,
            "CNI_IFNAME": self.ifname,
            "CNI_ARGS": self.args,
            "CNI_PATH": ":".join(self.path),
            STATE_DIR_ENV: self.state_dir,
        }

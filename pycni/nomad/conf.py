"""Which network configuration the configurator loads into the client (Nomad's ``cniConfParser``).

A ``bridge`` group uses the generated conflist; a ``cni/<name>`` group uses the config named
``<name>`` in the client's CNI config dir, found as Nomad's ``loadCNIConf`` finds it: files
``*.conf``, ``*.conflist``, ``*.json`` in lexical order, the first whose ``name`` matches wins,
and any file that fails to parse before the match aborts the search.
"""

from __future__ import annotations

from typing import Any

import attrs

from .. import _json
from .. import config as _config
from ..errors import ConfigError
from .errors import ConfLoadError
from .models import Allocation

__all__ = ["ConfSource", "load_cni_conf", "network_mode"]


@attrs.frozen
class ConfSource:
    """A conflist (``list_bytes``) or a single-plugin conf (``conf_bytes``) and its network ``name``."""

    name: str
    list_bytes: bytes = b""
    conf_bytes: bytes = b""

    @classmethod
    def from_conflist(cls, data: bytes) -> ConfSource:
        """A conflist given as bytes (e.g. :func:`~pycni.nomad.conflist.bridge_conflist`)."""
        try:
            raw = _json.loads(data)
        except _json.JSONDecodeFailure as e:
            raise ConfLoadError(f"error parsing configuration list: {e}") from None
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str):
            raise ConfLoadError("error parsing configuration list: no name")
        return cls(name=name, list_bytes=bytes(data))

    def option(self, api: Any) -> Any:
        """The client load option: ``api.with_conf_list_bytes`` or ``api.with_conf``."""
        if self.list_bytes:
            return api.with_conf_list_bytes(self.list_bytes)
        if self.conf_bytes:
            return api.with_conf(self.conf_bytes)
        raise ConfLoadError("no CNI network config found")


def load_cni_conf(conf_dir: str, name: str) -> ConfSource:
    """The network config named ``name`` in ``conf_dir``; errors carry Nomad's messages."""
    try:
        files = _config.conf_files(conf_dir, (".conf", ".conflist", ".json"))
    except ConfigError as e:
        raise ConfLoadError(f"failed to load CNI config: failed to detect CNI config file: {e.msg}") from None
    if not files:
        raise ConfLoadError(f"failed to load CNI config: no CNI network config found in {conf_dir}")
    for path in sorted(files):
        try:
            if path.endswith(".conflist"):
                conflist = _config.conflist_from_file(path)
                if conflist.name == name:
                    return ConfSource(name=name, list_bytes=conflist.bytes)
            else:
                conf = _config.conf_from_file(path)
                if conf.name == name:
                    return ConfSource(name=name, conf_bytes=conf.bytes)
        except ConfigError as e:
            kind = "config list file" if path.endswith(".conflist") else "config file"
            raise ConfLoadError(f"failed to load CNI config: failed to load CNI {kind} {path}: {e.msg}") from None
    raise ConfLoadError(f'failed to load CNI config: CNI network config not found for name "{name}"')


def network_mode(alloc: Allocation) -> tuple[str, str]:
    """Which configurator Nomad picks (``newNetworkConfigurator``), from the group's *first* network.

    ``("bridge", "")``, ``("cni", <name>)`` for ``cni/<name>``, or ``("host", "")`` (no network
    block, ``host``, anything else: nothing to configure). The mode is lowercased, so the name is
    too, and is then matched case-sensitively against config names.
    """
    networks = alloc.group.networks
    mode = networks[0].mode.lower() if networks else ""
    if mode == "bridge":
        return "bridge", ""
    if mode.startswith("cni/"):
        return "cni", mode[4:]
    return "host", ""

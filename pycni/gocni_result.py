"""go-cni's ``Result``: the per-interface view an orchestrator consumes.

Built from the per-network CNI results exactly as go-cni's ``createResult`` does: the default
interface (prefix + "0") is always present; IPs land on the interface their index names (or the
default one); a later interface of the same name replaces the earlier entry; DNS gets one entry
per network, even an empty one; an out-of-range interface index is an invalid-result error.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .errors import ResultError

if TYPE_CHECKING:
    from .types import IPConfig

__all__ = ["GoCNIIPConfig", "InterfaceConfig", "GoCNIResult"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@attrs.frozen
class GoCNIIPConfig:
    """go-cni's ``IPConfig`` (``IP``, ``Gateway``): not the CNI result's
    :class:`pycni.types.IPConfig` but a view of it, the bare address (no prefix length, no
    interface index: the interface is the map key), built by :meth:`from_result`."""

    ip: IPAddress
    gateway: IPAddress | None = None

    @classmethod
    def from_result(cls, ipc: IPConfig) -> GoCNIIPConfig:
        return cls(ipc.address.ip, ipc.gateway)

    def to_go_json(self) -> dict[str, str]:
        return {"IP": str(self.ip), "Gateway": "" if self.gateway is None else str(self.gateway)}


@attrs.frozen
class InterfaceConfig:
    ip_configs: tuple[GoCNIIPConfig, ...] = ()
    mac: str = ""
    sandbox: str = ""
    pci_id: str = ""
    socket_path: str = ""


@attrs.frozen
class GoCNIResult:
    """``interfaces`` name → config; ``dns`` one entry per network; ``routes`` concatenated.

    ``raw`` keeps the per-network results (converted to the 1.x model) in network order. An
    interface is ``None`` only when decoded from Go's JSON with a nil entry (``null``).
    """

    interfaces: Mapping[str, InterfaceConfig | None]
    dns: tuple[Any, ...] = ()
    routes: tuple[Any, ...] = ()
    raw: tuple[Any, ...] = ()

    @classmethod
    def from_results(cls, results: Iterable[Any], *, default_ifname: str = "eth0") -> GoCNIResult:
        """go-cni ``createResult`` over per-network results (any version; converted to 1.1.0)."""
        from .types import Result, convert

        interfaces: dict[str, InterfaceConfig] = {default_ifname: InterfaceConfig()}
        dns: list[Any] = []
        routes: list[Any] = []
        raw: list[Any] = []
        for res in results:
            current = res if isinstance(res, Result) else convert(res, "1.1.0")
            raw.append(current)
            for iface in current.interfaces:
                interfaces[iface.name] = InterfaceConfig(
                    mac=iface.mac, sandbox=iface.sandbox, pci_id=iface.pci_id, socket_path=iface.socket_path
                )
            for ipc in current.ips:
                if ipc.interface is not None:
                    if not 0 <= ipc.interface < len(current.interfaces):
                        raise ResultError(f"invalid result: invalid interface config: interface index {ipc.interface}")
                    name = current.interfaces[ipc.interface].name
                else:
                    name = default_ifname
                entry = interfaces.get(name, InterfaceConfig())
                interfaces[name] = attrs.evolve(entry, ip_configs=entry.ip_configs + (GoCNIIPConfig.from_result(ipc),))
            dns.append(current.dns)
            routes.extend(current.routes)
        return cls(interfaces=interfaces, dns=tuple(dns), routes=tuple(routes), raw=tuple(raw))

    def to_go_json(self) -> dict[str, Any]:
        """Serialise as Go's encoding/json would (go-cni types carry no json tags)."""
        return {
            "Interfaces": {
                name: None
                if cfg is None
                else {
                    "IPConfigs": [c.to_go_json() for c in cfg.ip_configs] or None,
                    "Mac": cfg.mac,
                    "Sandbox": cfg.sandbox,
                    "PciID": cfg.pci_id,
                    "SocketPath": cfg.socket_path,
                }
                for name, cfg in self.interfaces.items()
            },
            "DNS": [d.to_json() if hasattr(d, "to_json") else d for d in self.dns] or None,
            "Routes": [r.to_json() if hasattr(r, "to_json") else r for r in self.routes] or None,
        }

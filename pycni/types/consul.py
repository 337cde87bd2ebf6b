"""Consul's transparent-proxy configuration, as it crosses from Nomad to the consul-cni plugin."""

from __future__ import annotations

import attrs

from .. import _json

__all__ = ["IptablesConfig"]


@attrs.frozen
class IptablesConfig:
    """consul/sdk ``iptables.Config``: what Nomad passes consul-cni in ``CNI_ARGS`` and the
    plugin decodes (``None`` lists were nil in Go)."""

    consul_dns_ip: str = ""
    consul_dns_port: int = 0
    proxy_user_id: str = ""
    proxy_inbound_port: int = 0
    proxy_outbound_port: int = 0
    exclude_inbound_ports: tuple[str, ...] | None = None
    exclude_outbound_ports: tuple[str, ...] | None = None
    exclude_outbound_cidrs: tuple[str, ...] | None = None
    exclude_uids: tuple[str, ...] | None = None
    netns: str = ""

    def to_json(self) -> str:
        def strings(values: tuple[str, ...] | None) -> list[str] | None:
            return None if values is None else list(values)

        return _json.go_marshal(
            {
                "ConsulDNSIP": self.consul_dns_ip,
                "ConsulDNSPort": self.consul_dns_port,
                "ProxyUserID": self.proxy_user_id,
                "ProxyInboundPort": self.proxy_inbound_port,
                "ProxyOutboundPort": self.proxy_outbound_port,
                "ExcludeInboundPorts": strings(self.exclude_inbound_ports),
                "ExcludeOutboundPorts": strings(self.exclude_outbound_ports),
                "ExcludeOutboundCIDRs": strings(self.exclude_outbound_cidrs),
                "ExcludeUIDs": strings(self.exclude_uids),
                "NetNS": self.netns,
                "IptablesProvider": None,
            }
        )

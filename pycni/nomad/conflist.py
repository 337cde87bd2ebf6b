"""Nomad's ``bridge`` network conflist, byte-identical to what the Nomad client generates.

loopback → bridge (host-local IPAM, masquerade, gateway) → firewall (iptables, admin chain
``NOMAD-ADMIN``) → portmap (snat), plus consul-cni when the group uses transparent proxy. The
network is always named ``nomad``, whatever the bridge is called. Serialised like Go's
``json.MarshalIndent(conf, "", "\\t")``: tab indent, keys in struct order, Go's escaping, no
trailing newline. :class:`NomadBridgeConfig` does not apply defaults; :meth:`NomadBridgeConfig.with_defaults`
does what the client does first, and :func:`validate_subnets` is the agent's config check.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import attrs

from .. import _json
from ..errors import ConfigError

__all__ = [
    "NomadBridgeConfig",
    "bridge_conflist",
    "validate_subnets",
    "NETWORK_NAME",
    "DEFAULT_BRIDGE_NAME",
    "DEFAULT_SUBNET",
    "ADMIN_CHAIN",
    "DEFAULT_IPAM_DATA_DIR",
]

NETWORK_NAME = "nomad"
DEFAULT_BRIDGE_NAME = "nomad"
DEFAULT_SUBNET = "172.26.64.0/20"
ADMIN_CHAIN = "NOMAD-ADMIN"
#: On tmpfs: IPAM leases must not survive a reboot (their netns do not).
DEFAULT_IPAM_DATA_DIR = "/var/run/cni"
_PREFIX_LEN = re.compile(r"[0-9]+")


@attrs.frozen
class NomadBridgeConfig:
    """Nomad's ``NomadBridgeConfig`` (the admin chain is always ``NOMAD-ADMIN``).

    The client agent's bridge settings, from which :func:`bridge_conflist` writes a whole
    conflist (loopback, bridge, firewall, portmap[, consul-cni]). Not the bridge plugin's config
    (:class:`pycni_plugins.bridge.BridgeConfig`, the reference's ``NetConf``: twenty fields the
    plugin decodes from any conf, with defaults, CNI_ARGS and checks): the ``bridge`` entry
    written here is Nomad's Go literal, six keys in its order, which that plugin then decodes.
    """

    bridge_name: str = ""
    ipv4_subnet: str = ""
    ipv6_subnet: str = ""
    hairpin_mode: bool = False
    consul_cni: bool = False
    #: Not in Nomad's struct (Nomad always writes /var/run/cni): for callers that keep IPAM
    #: leases elsewhere, such as ``pycni demo``.
    ipam_data_dir: str = DEFAULT_IPAM_DATA_DIR

    def with_defaults(self) -> NomadBridgeConfig:
        """Empty bridge name and IPv4 subnet replaced by ``nomad`` and ``172.26.64.0/20``."""
        return attrs.evolve(
            self, bridge_name=self.bridge_name or DEFAULT_BRIDGE_NAME, ipv4_subnet=self.ipv4_subnet or DEFAULT_SUBNET
        )


def bridge_conflist(conf: NomadBridgeConfig) -> bytes:
    ranges: list[Any] = [[{"subnet": conf.ipv4_subnet}]]
    routes: list[Any] = [{"dst": "0.0.0.0/0"}]
    if conf.ipv6_subnet:
        ranges.append([{"subnet": conf.ipv6_subnet}])
        routes.append({"dst": "::/0"})
    plugins: list[Any] = [
        {"type": "loopback"},
        {
            "type": "bridge",
            "bridge": conf.bridge_name,
            "ipMasq": True,
            "isGateway": True,
            "forceAddress": True,
            "hairpinMode": conf.hairpin_mode,
            "ipam": {"type": "host-local", "ranges": ranges, "routes": routes, "dataDir": conf.ipam_data_dir},
        },
        {"type": "firewall", "backend": "iptables", "iptablesAdminChainName": ADMIN_CHAIN},
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    ]
    if conf.consul_cni:
        plugins.append({"type": "consul-cni", "log_level": "debug"})
    return _json.go_marshal_indent({"cniVersion": "0.4.0", "name": NETWORK_NAME, "plugins": plugins}).encode()


def _cidr_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of a CIDR as Go's ``net.ParseCIDR`` accepts it (host bits allowed), else None."""
    addr, sep, bits = text.partition("/")
    if not sep or not _PREFIX_LEN.fullmatch(bits):
        return None
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    if int(bits) > ip.max_prefixlen or (isinstance(ip, ipaddress.IPv6Address) and ip.scope_id):
        return None
    return ip


def _is_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return isinstance(ip, ipaddress.IPv4Address) or ip.ipv4_mapped is not None


def validate_subnets(ipv4_subnet: str, ipv6_subnet: str) -> None:
    """The agent's checks of ``bridge_network_subnet`` / ``bridge_network_subnet_ipv6`` ("" = unset)."""
    for key, subnet, want_v4 in (
        ("bridge_network_subnet", ipv4_subnet, True),
        ("bridge_network_subnet_ipv6", ipv6_subnet, False),
    ):
        if not subnet:
            continue
        ip = _cidr_ip(subnet)
        if ip is None:
            raise ConfigError(f"invalid {key}: invalid CIDR address: {subnet}")
        if _is_ipv4(ip) != want_v4:
            raise ConfigError(f"invalid {key}: not an {'IPv4' if want_v4 else 'IPv6'} address: {subnet}")

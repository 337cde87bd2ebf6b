"""Transparent proxy: the Consul ``iptables.Config`` Nomad hands consul-cni in ``CONSUL_IPTABLES_CONFIG``.

Built from the first service of the group whose sidecar proxy has a ``transparent_proxy`` block
(``setupTransparentProxyArgs``). :meth:`IptablesConfig.to_json` is the exact value Nomad sends:
Go's compact ``json.Marshal`` of the struct, fields in declaration order, nil lists as ``null``,
excluded inbound ports as a string-sorted set, ``"IptablesProvider":null`` last.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .. import _json
from ..types.consul import IptablesConfig
from .errors import TransparentProxyError
from .models import Allocation, Node, Proxy, Service, TaskGroup, TransparentProxy
from .ports import PortMappings

__all__ = [
    "IptablesConfig",
    "transparent_proxy_config",
    "uses_transparent_proxy",
    "dns_from_attrs",
    "DEFAULT_UID_META",
    "DEFAULT_OUTBOUND_PORT_META",
]

DEFAULT_UID_META = "connect.transparent_proxy.default_uid"
DEFAULT_OUTBOUND_PORT_META = "connect.transparent_proxy.default_outbound_port"
DEFAULT_CLUSTER = "default"
_DIGITS = re.compile(r"[0-9]+")


def parse_uint16(text: str) -> int:
    """``strconv.ParseUint(text, 10, 16)``; ``ValueError`` carries Go's message."""
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"strconv.ParseUint: parsing {_json.go_quote(text)}: invalid syntax")
    if len(text.lstrip("0")) > 5 or int(text) > 0xFFFF:
        raise ValueError(f"strconv.ParseUint: parsing {_json.go_quote(text)}: value out of range")
    return int(text)


def _is_uint16(text: str) -> bool:
    try:
        parse_uint16(text)
    except ValueError:
        return False
    return True


def dns_from_attrs(attributes: Mapping[str, str], cluster: str) -> tuple[str, int]:
    """Consul DNS address and port fingerprinted for ``cluster``; ``("", 0)`` when unusable."""
    get = attributes.get
    if cluster in ("", DEFAULT_CLUSTER):
        addr_key, port_key = "unique.consul.dns.addr", "consul.dns.port"
    else:
        addr_key, port_key = f"unique.consul.{cluster}.dns.addr", f"consul.{cluster}.dns.port"
    addr = get(addr_key)
    if not addr:
        return "", 0
    port = get(port_key)
    if port is None or port in ("0", "-1"):
        return "", 0
    try:
        return addr, parse_uint16(port)
    except ValueError:
        return "", 0


def _first_transparent_proxy(services: Iterable[Service]) -> tuple[Service, Proxy, TransparentProxy] | None:
    # Only one tproxy service per group passes job validation; Nomad takes the first.
    for svc in services:
        proxy = svc.proxy
        if proxy is not None and proxy.transparent_proxy is not None:
            return svc, proxy, proxy.transparent_proxy
    return None


def uses_transparent_proxy(group: TaskGroup) -> bool:
    """Whether Nomad adds consul-cni to the group's bridge network (any service with tproxy)."""
    return _first_transparent_proxy(group.services) is not None


def transparent_proxy_config(
    alloc: Allocation, node: Node, netns_path: str, ports: PortMappings
) -> IptablesConfig | None:
    """The config for the group's transparent-proxy service, or ``None`` if it has none.

    Raises :class:`TransparentProxyError` when no outbound port is set and the node's default
    (``connect.transparent_proxy.default_outbound_port`` meta) is not a port number.
    """
    group = alloc.group
    found = _first_transparent_proxy(group.services)
    if found is None:
        return None
    svc, proxy, tproxy = found

    uid = tproxy.uid or node.meta.get(DEFAULT_UID_META, "")
    outbound = tproxy.outbound_port
    if outbound == 0:
        default = node.meta.get(DEFAULT_OUTBOUND_PORT_META, "")
        try:
            outbound = parse_uint16(default)
        except ValueError as e:
            raise TransparentProxyError(
                f"could not parse default_outbound_port {_json.go_quote(default)} as port number: {e}"
            ) from None

    envoy = ports.get(f"connect-proxy-{svc.name}")
    inbound = envoy.host_port if envoy is not None else 0

    excluded: set[str] = set()
    # Reserved ports always stay reachable from outside: the jobspec "to", verbatim (0, -1 too).
    for network in group.networks:
        excluded.update(str(port.to) for port in network.reserved_ports)
    for entry in tproxy.exclude_inbound_ports or ():
        if _is_uint16(entry):
            excluded.add(entry)
        elif (mapped := ports.get(entry)) is not None:
            excluded.add(str(mapped.container_port))
    # Exposed check paths bypass Envoy so health checks work.
    for path in proxy.expose.paths if proxy.expose is not None else ():
        if (mapped := ports.get(path.listener_port)) is not None:
            excluded.add(str(mapped.container_port))

    dns_ip, dns_port = ("", 0) if tproxy.no_dns else dns_from_attrs(node.attributes, svc.cluster)
    return IptablesConfig(
        consul_dns_ip=dns_ip,
        consul_dns_port=dns_port,
        proxy_user_id=uid,
        proxy_inbound_port=inbound,
        proxy_outbound_port=outbound,
        exclude_inbound_ports=tuple(sorted(excluded)) or None,
        exclude_outbound_ports=tuple(str(p) for p in tproxy.exclude_outbound_ports or ()) or None,
        exclude_outbound_cidrs=tproxy.exclude_outbound_cidrs,
        exclude_uids=tproxy.exclude_uids,
        netns=netns_path,
    )

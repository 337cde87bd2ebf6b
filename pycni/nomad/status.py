"""The allocation's network status from a go-cni result (Nomad's ``cniToAllocNet``).

Interfaces are visited in byte-wise name order, first only those with a sandbox, then (fallback,
e.g. Calico's host-side entries) all of them. The first interface with any address wins: its
first IPv4 (an IPv4-mapped IPv6 counts as IPv4, shown dotted) and first IPv6 address; later
interfaces never fill in the other family. With only IPv6, ``Address`` repeats it. DNS comes
from the first network's DNS entry only, and only if it names servers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..errors import CNIError
from ..gocni_result import GoCNIIPConfig, GoCNIResult, InterfaceConfig
from ..types import DNS, parse_result
from .errors import DecodeError, StatusError

__all__ = ["DNSConfig", "AllocNetworkStatus", "alloc_net_status", "with_consul_dns", "result_from_json"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _strings(values: Iterable[str] | None) -> list[str] | None:
    return None if values is None else list(values)


@attrs.frozen
class DNSConfig:
    """``structs.DNSConfig``; ``None`` is a nil slice (JSON ``null``), ``()`` an empty one."""

    servers: tuple[str, ...] | None = None
    searches: tuple[str, ...] | None = None
    options: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "Servers": _strings(self.servers),
            "Searches": _strings(self.searches),
            "Options": _strings(self.options),
        }


@attrs.frozen
class AllocNetworkStatus:
    """``structs.AllocNetworkStatus``."""

    interface_name: str = ""
    address: str = ""
    address_ipv6: str = ""
    dns: DNSConfig | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "InterfaceName": self.interface_name,
            "Address": self.address,
            "AddressIPv6": self.address_ipv6,
            "DNS": self.dns.to_json() if self.dns is not None else None,
        }


def _ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    # Go's To4() also accepts ::ffff:a.b.c.d, and String() then prints it dotted.
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    return ip.ipv4_mapped


def _pick(result: GoCNIResult, require_sandbox: bool) -> AllocNetworkStatus | None:
    for name in sorted(result.interfaces):  # code-point order is UTF-8 byte order, as Go sorts
        iface = result.interfaces[name]
        if iface is None or (require_sandbox and not iface.sandbox):  # nil entries: a plugin's doing
            continue
        v4 = v6 = ""
        for ipc in iface.ip_configs:
            mapped = _ipv4(ipc.ip)
            if mapped is not None:
                v4 = v4 or str(mapped)
            else:
                v6 = v6 or str(ipc.ip)
        if v4 or v6:
            return AllocNetworkStatus(interface_name=name, address=v4, address_ipv6=v6)
    return None


def _slice(dns: DNS, field: str) -> tuple[str, ...] | None:
    # Go copies the decoded slice: nil (null) when the result had no such array, else the array.
    values = tuple(getattr(dns, field))
    return values if values or field in dns.arrays else None


def alloc_net_status(result: GoCNIResult) -> AllocNetworkStatus:
    if not result.interfaces:
        raise StatusError("failed to configure network: no interfaces found")
    status = _pick(result, require_sandbox=True) or _pick(result, require_sandbox=False)
    if status is None:
        raise StatusError("failed to configure network: no interface with an address")
    if not status.address:
        # Kept for consumers that only read Address (service registration with address_mode=alloc).
        status = attrs.evolve(status, address=status.address_ipv6)
    if result.dns and result.dns[0].nameservers:
        first = result.dns[0]
        dns = DNSConfig(tuple(first.nameservers), _slice(first, "search"), _slice(first, "options"))
        status = attrs.evolve(status, dns=dns)
    return status


def with_consul_dns(status: AllocNetworkStatus, consul_dns_ip: str) -> AllocNetworkStatus:
    """Point the allocation's resolver at Consul DNS (its port-53 traffic is DNAT'ed there)."""
    dns = status.dns or DNSConfig((), (), ())
    return attrs.evolve(status, dns=attrs.evolve(dns, servers=(consul_dns_ip,)))


# -- decoding a result given as JSON -------------------------------------------------------------


def _ip(value: Any, path: str) -> IPAddress:
    if not isinstance(value, str):
        raise DecodeError(path, "expected an IP address string")
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise DecodeError(path, f"invalid IP address {value[:60]!r}") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        raise DecodeError(path, f"invalid IP address {value[:60]!r}")
    return ip


def _go_str(obj: Mapping[str, Any], key: str, path: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DecodeError(f"{path}.{key}", "expected a string")
    return value


def _go_interface(value: Any, path: str) -> InterfaceConfig | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise DecodeError(path, "expected an object")
    configs = value.get("IPConfigs")
    configs = [] if configs is None else configs
    if not isinstance(configs, list):
        raise DecodeError(f"{path}.IPConfigs", "expected an array")
    ips = []
    for i, entry in enumerate(configs):
        where = f"{path}.IPConfigs[{i}]"
        if not isinstance(entry, dict):
            raise DecodeError(where, "expected an object")
        gateway = entry.get("Gateway")
        ips.append(
            GoCNIIPConfig(
                _ip(entry.get("IP"), f"{where}.IP"),
                None if gateway in (None, "") else _ip(gateway, f"{where}.Gateway"),  # Go writes nil as ""
            )
        )
    return InterfaceConfig(
        ip_configs=tuple(ips),
        mac=_go_str(value, "Mac", path),
        sandbox=_go_str(value, "Sandbox", path),
        pci_id=_go_str(value, "PciID", path),
        socket_path=_go_str(value, "SocketPath", path),
    )


def _from_go_json(data: Mapping[str, Any]) -> GoCNIResult:
    interfaces = data["Interfaces"]
    interfaces = {} if interfaces is None else interfaces
    if not isinstance(interfaces, dict):
        raise DecodeError("Interfaces", "expected an object")
    entries = data.get("DNS")
    entries = [] if entries is None else entries
    if not isinstance(entries, list):
        raise DecodeError("DNS", "expected an array")
    dns = []
    for i, entry in enumerate(entries):
        try:
            dns.append(DNS.from_json(entry))
        except CNIError as e:
            raise DecodeError(f"DNS[{i}]", e.msg) from None
    return GoCNIResult(
        interfaces={name: _go_interface(cfg, f"Interfaces[{name!r}]") for name, cfg in interfaces.items()},
        dns=tuple(dns),
    )


def result_from_json(data: Any, *, default_ifname: str = "eth0") -> GoCNIResult:
    """A go-cni ``Result`` as Go serialises it (``{"Interfaces": …, "DNS": […]}``), or plain CNI
    result JSON (one network's, or a list of them in network order) put through go-cni's
    ``createResult``."""
    if isinstance(data, dict) and "Interfaces" in data:
        return _from_go_json(data)
    results = data if isinstance(data, list) else [data]
    try:
        return GoCNIResult.from_results([parse_result(r) for r in results], default_ifname=default_ifname)
    except CNIError as e:
        raise DecodeError("", e.msg, code=e.code) from None

"""CNI 1.0.0 / 1.1.0 results (Go's ``types100``; the two versions share one model).

This is the model pycni works in; older results are converted to it (see :mod:`.convert`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

import attrs

from .._json import GoValueError, go_int, go_string
from ._common import (
    DNS,
    EMPTY_DNS,
    MISSING,
    IPAddress,
    IPInterface,
    Route,
    address,
    array,
    checked,
    cidr,
    decode_dns,
    decode_route,
    members,
    object_keys,
    optional_integer,
    route_tuple,
    versioned,
)

__all__ = ["Interface", "IPConfig", "Result"]


@attrs.frozen
class Interface:
    """An interface the plugin created; ``sandbox`` is its netns path (``""`` = the host).

    ``mtu``, ``socket_path`` and ``pci_id`` are 1.1.0 fields; 0.3.x/0.4.0 results use only
    ``name``, ``mac`` and ``sandbox``.
    """

    name: str
    mac: str = ""
    mtu: int = 0
    sandbox: str = ""
    socket_path: str = ""
    pci_id: str = ""

    @classmethod
    def from_json(cls, obj: Any) -> Interface:
        return checked(decode_interface, obj, "interface")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.mac:
            out["mac"] = self.mac
        if self.mtu:
            out["mtu"] = self.mtu
        if self.sandbox:
            out["sandbox"] = self.sandbox
        if self.socket_path:
            out["socketPath"] = self.socket_path
        if self.pci_id:
            out["pciID"] = self.pci_id
        return out


_INTERFACE_KEYS = object_keys("name", "mac", "mtu", "sandbox", "socketPath", "pciID")


def decode_interface(value: Any) -> Interface:
    obj = members(value, _INTERFACE_KEYS)
    key = "name"
    try:
        name = go_string(obj.get("name"))
        key = "mac"
        mac = go_string(obj.get("mac"))
        key = "mtu"
        mtu = go_int(obj.get("mtu"))
        key = "sandbox"
        sandbox = go_string(obj.get("sandbox"))
        key = "socketPath"
        socket_path = go_string(obj.get("socketPath"))
        key = "pciID"
        pci_id = go_string(obj.get("pciID"))
    except GoValueError as e:
        raise e.at(key) from None
    return Interface(name, mac, mtu, sandbox, socket_path, pci_id)


@attrs.frozen
class IPConfig:
    """An address (host bits kept, ``10.1.2.3/24``) and optional gateway.

    ``interface`` indexes ``Result.interfaces``; ``None`` (absent) differs from 0, and plugins may
    emit -1. Delegated IPAM plugins leave it out.
    """

    address: IPInterface
    gateway: IPAddress | None = None
    interface: int | None = None

    @classmethod
    def from_json(cls, obj: Any) -> IPConfig:
        return checked(decode_ip_config, obj, "ip config")

    def to_json(self) -> dict[str, Any]:
        return ip_config_json(self.interface, self.address, self.gateway)


def ip_config_json(interface: int | None, addr: IPInterface, gateway: IPAddress | None) -> dict[str, Any]:
    """An ip's ``interface``, ``address`` and ``gateway`` as Go emits them (0.3.x/0.4.0 too)."""
    out: dict[str, Any] = {}
    if interface is not None:
        out["interface"] = interface
    out["address"] = str(addr)
    if gateway is not None:
        out["gateway"] = str(gateway)
    return out


_IP_KEYS = object_keys("interface", "address", "gateway", nullable=("interface", "gateway"))


def ip_config_fields(obj: dict[Any, Any]) -> tuple[int | None, IPInterface, IPAddress | None]:
    """An ip's ``interface``, ``address`` and ``gateway`` decoded from its members (0.3.x/0.4.0 too)."""
    key = "interface"
    try:
        interface = optional_integer(obj.get("interface"))
        key = "address"
        addr = cidr(obj.get("address", MISSING))
        key = "gateway"
        gateway = address(obj.get("gateway"))
    except GoValueError as e:
        raise e.at(key) from None
    return interface, addr, gateway


def decode_ip_config(value: Any) -> IPConfig:
    interface, addr, gateway = ip_config_fields(members(value, _IP_KEYS))
    return IPConfig(addr, gateway, interface)


def interface_tuple(items: Iterable[Interface]) -> tuple[Interface, ...]:
    return tuple(items)


def _ip_config_tuple(items: Iterable[IPConfig]) -> tuple[IPConfig, ...]:
    return tuple(items)


@attrs.frozen
class Result:
    """A 1.0.0 or 1.1.0 ADD result; ``cni_version`` ``""`` means "not set yet" (1.1.0 on conversion)."""

    VERSIONS: ClassVar[tuple[str, ...]] = ("1.0.0", "1.1.0")

    cni_version: str
    interfaces: tuple[Interface, ...] = attrs.field(default=(), converter=interface_tuple)
    ips: tuple[IPConfig, ...] = attrs.field(default=(), converter=_ip_config_tuple)
    routes: tuple[Route, ...] = attrs.field(default=(), converter=route_tuple)
    dns: DNS = EMPTY_DNS

    @classmethod
    def from_json(cls, obj: Any) -> Result:
        """Decode as 1.x, version taken as written; :func:`~pycni.types.parse_result` does libcni's fixup."""
        return versioned(decode_result, obj, cls.VERSIONS)

    def to_json(self) -> dict[str, Any]:
        """Go's emission: empty lists are omitted, and so is ``dns`` when all of it is empty."""
        ips, routes = [ip.to_json() for ip in self.ips], [r.to_json() for r in self.routes]
        out = lists_json(self.cni_version, [i.to_json() for i in self.interfaces], ips, routes)
        dns = self.dns.to_json()
        if dns:
            out["dns"] = dns
        return out


def lists_json(
    cni_version: str, interfaces: list[dict[str, Any]], ips: list[dict[str, Any]], routes: list[dict[str, Any]]
) -> dict[str, Any]:
    """A 0.3.x-to-1.x result's ``cniVersion`` and its lists, each already emitted in its version's
    fields, as Go emits them (an empty list omitted)."""
    out: dict[str, Any] = {}
    if cni_version:
        out["cniVersion"] = cni_version
    if interfaces:
        out["interfaces"] = interfaces
    if ips:
        out["ips"] = ips
    if routes:
        out["routes"] = routes
    return out


_RESULT_KEYS = object_keys("interfaces", "ips", "routes", "dns", ignored="cniVersion", whole=("ips", "routes"))

IP = TypeVar("IP")


def decode_lists(
    value: Any, interface: Callable[[Any], Interface], ip_config: Callable[[Any], IP]
) -> tuple[tuple[Interface, ...], tuple[IP, ...], tuple[Route, ...], DNS]:
    """A 0.3.x-to-1.x result's interfaces, ips (each decoded by its version's decoders), routes
    and dns."""
    obj = members(value, _RESULT_KEYS)
    key = "interfaces"
    try:
        interfaces = array(obj.get("interfaces"), interface)
        key = "ips"
        ips = array(obj.get("ips"), ip_config)
        key = "routes"
        routes = array(obj.get("routes"), decode_route)
        key = "dns"
        dns = decode_dns(obj.get("dns"))
    except GoValueError as e:
        raise e.at(key) from None
    return interfaces, ips, routes, dns


def decode_result(value: Any, version: str) -> Result:
    return Result(version, *decode_lists(value, decode_interface, decode_ip_config))

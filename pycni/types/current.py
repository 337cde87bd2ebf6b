"""CNI 1.0.0 / 1.1.0 results (Go's ``types100``; the two versions share one model).

This is the model pycni works in; older results are converted to it (see :mod:`.convert`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

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
    declared_version,
    decode_dns,
    decode_route,
    invalid,
    members,
    object_keys,
    optional_integer,
    route_tuple,
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
        out: dict[str, Any] = {}
        if self.interface is not None:
            out["interface"] = self.interface
        out["address"] = str(self.address)
        if self.gateway is not None:
            out["gateway"] = str(self.gateway)
        return out


_IP_KEYS = object_keys("interface", "address", "gateway", nullable=("interface", "gateway"))


def decode_ip_config(value: Any) -> IPConfig:
    obj = members(value, _IP_KEYS)
    key = "interface"
    try:
        interface = optional_integer(obj.get("interface"))
        key = "address"
        addr = cidr(obj.get("address", MISSING))
        key = "gateway"
        gateway = address(obj.get("gateway"))
    except GoValueError as e:
        raise e.at(key) from None
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
        try:
            return decode_result(obj, declared_version(obj, cls.VERSIONS))
        except GoValueError as e:
            raise invalid(e, "result") from None

    def to_json(self) -> dict[str, Any]:
        """Go's emission: empty lists are omitted, and so is ``dns`` when all of it is empty."""
        out: dict[str, Any] = {}
        if self.cni_version:
            out["cniVersion"] = self.cni_version
        if self.interfaces:
            out["interfaces"] = [i.to_json() for i in self.interfaces]
        if self.ips:
            out["ips"] = [ip.to_json() for ip in self.ips]
        if self.routes:
            out["routes"] = [r.to_json() for r in self.routes]
        dns = self.dns.to_json()
        if dns:
            out["dns"] = dns
        return out


_RESULT_KEYS = object_keys("interfaces", "ips", "routes", "dns", ignored="cniVersion", whole=("ips", "routes"))


def decode_result(value: Any, version: str) -> Result:
    obj = members(value, _RESULT_KEYS)
    key = "interfaces"
    try:
        interfaces = array(obj.get("interfaces"), decode_interface)
        key = "ips"
        ips = array(obj.get("ips"), decode_ip_config)
        key = "routes"
        routes = array(obj.get("routes"), decode_route)
        key = "dns"
        dns = decode_dns(obj.get("dns"))
    except GoValueError as e:
        raise e.at(key) from None
    return Result(version, interfaces, ips, routes, dns)

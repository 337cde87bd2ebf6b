"""CNI 0.1.0 / 0.2.0 results (Go's ``types020``): at most one IPv4 and one IPv6 config.

Routes hang off each config and are Go's shared route type, so they keep (and emit) the 1.1.0
route fields a plugin wrote; conversion *to* 0.1.0/0.2.0 keeps only ``dst`` and ``gw``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from .._json import GoValueError
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
    route_tuple,
    versioned,
)

__all__ = ["IPConfig020", "Result020"]


@attrs.frozen
class IPConfig020:
    """One address (host bits kept), its gateway and the routes through it."""

    ip: IPInterface
    gateway: IPAddress | None = None
    routes: tuple[Route, ...] = attrs.field(default=(), converter=route_tuple)

    @classmethod
    def from_json(cls, obj: Any) -> IPConfig020:
        return checked(decode_ip_config, obj, "ip config")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ip": str(self.ip)}
        if self.gateway is not None:
            out["gateway"] = str(self.gateway)
        if self.routes:
            out["routes"] = [r.to_json() for r in self.routes]
        return out


_IP_KEYS = object_keys("ip", "gateway", "routes", whole=("routes",), nullable=("gateway",))


def decode_ip_config(value: Any) -> IPConfig020:
    obj = members(value, _IP_KEYS)
    key = "ip"
    try:
        ip = cidr(obj.get("ip", MISSING))
        key = "gateway"
        gateway = address(obj.get("gateway"))
        key = "routes"
        routes = array(obj.get("routes"), decode_route)
    except GoValueError as e:
        raise e.at(key) from None
    return IPConfig020(ip, gateway, routes)


def _optional_ip_config(value: Any) -> IPConfig020 | None:
    return None if value is None else decode_ip_config(value)


@attrs.frozen
class Result020:
    """A 0.1.0/0.2.0 ADD result."""

    VERSIONS: ClassVar[tuple[str, ...]] = ("0.1.0", "0.2.0")

    cni_version: str
    ip4: IPConfig020 | None = None
    ip6: IPConfig020 | None = None
    dns: DNS = EMPTY_DNS

    @classmethod
    def from_json(cls, obj: Any) -> Result020:
        """Decode as 0.1.0/0.2.0, version taken as written (see :func:`~pycni.types.parse_result`)."""
        return versioned(decode_result, obj, cls.VERSIONS)

    def to_json(self) -> dict[str, Any]:
        """Go's emission: absent configs omitted, ``dns`` always present (``{}`` when empty)."""
        out: dict[str, Any] = {}
        if self.cni_version:
            out["cniVersion"] = self.cni_version
        if self.ip4 is not None:
            out["ip4"] = self.ip4.to_json()
        if self.ip6 is not None:
            out["ip6"] = self.ip6.to_json()
        out["dns"] = self.dns.to_json()
        return out


_RESULT_KEYS = object_keys("ip4", "ip6", "dns", ignored="cniVersion", whole=("ip4", "ip6"), nullable=("ip4", "ip6"))


def decode_result(value: Any, version: str) -> Result020:
    obj = members(value, _RESULT_KEYS)
    key = "ip4"
    try:
        ip4 = _optional_ip_config(obj.get("ip4"))
        key = "ip6"
        ip6 = _optional_ip_config(obj.get("ip6"))
        key = "dns"
        dns = decode_dns(obj.get("dns"))
    except GoValueError as e:
        raise e.at(key) from None
    return Result020(version, ip4, ip6, dns)

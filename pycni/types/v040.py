"""CNI 0.3.0 / 0.3.1 / 0.4.0 results (Go's ``types040``).

Differences from 1.x: every ip carries ``version``, interfaces have only name/mac/sandbox, and
``dns`` is always emitted. Routes are Go's shared type, so their 1.1.0 fields survive here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import attrs

from .._json import GoValueError, go_string
from ._common import (
    DNS,
    EMPTY_DNS,
    IPAddress,
    IPInterface,
    Route,
    checked,
    members,
    object_keys,
    route_tuple,
    versioned,
)
from .current import Interface, decode_lists, interface_tuple, ip_config_fields, ip_config_json, lists_json

__all__ = ["IPConfig040", "Result040"]


@attrs.frozen
class IPConfig040:
    """An address with its family label ``version``: ``"4"`` or ``"6"`` as written by plugins.

    libcni keeps whatever string is there; it is ``""`` when a plugin leaves it out (the reference
    loopback plugin prints 1.x-shaped ips under 0.3.x/0.4.0), and such an ip is not carried into a
    0.1.0/0.2.0 result.
    """

    version: str
    address: IPInterface
    gateway: IPAddress | None = None
    interface: int | None = None

    @classmethod
    def from_json(cls, obj: Any) -> IPConfig040:
        return checked(decode_ip_config, obj, "ip config")

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, **ip_config_json(self.interface, self.address, self.gateway)}


_IP_KEYS = object_keys("version", "interface", "address", "gateway", nullable=("interface", "gateway"))


def decode_ip_config(value: Any) -> IPConfig040:
    obj = members(value, _IP_KEYS)
    try:
        version = go_string(obj.get("version"))
    except GoValueError as e:
        raise e.at("version") from None
    interface, addr, gateway = ip_config_fields(obj)
    return IPConfig040(version, addr, gateway, interface)


def interface_to_json(interface: Interface) -> dict[str, Any]:
    out: dict[str, Any] = {"name": interface.name}
    if interface.mac:
        out["mac"] = interface.mac
    if interface.sandbox:
        out["sandbox"] = interface.sandbox
    return out


_INTERFACE_KEYS = object_keys("name", "mac", "sandbox")


def decode_interface(value: Any) -> Interface:
    """Only name/mac/sandbox are 0.4.0 fields; anything else is ignored, as Go ignores it."""
    obj = members(value, _INTERFACE_KEYS)
    key = "name"
    try:
        name = go_string(obj.get("name"))
        key = "mac"
        mac = go_string(obj.get("mac"))
        key = "sandbox"
        sandbox = go_string(obj.get("sandbox"))
    except GoValueError as e:
        raise e.at(key) from None
    return Interface(name, mac, sandbox=sandbox)


def _ip_config_tuple(items: Iterable[IPConfig040]) -> tuple[IPConfig040, ...]:
    return tuple(items)


@attrs.frozen
class Result040:
    """A 0.3.0/0.3.1/0.4.0 ADD result. Its interfaces use only name, mac and sandbox."""

    VERSIONS: ClassVar[tuple[str, ...]] = ("0.3.0", "0.3.1", "0.4.0")

    cni_version: str
    interfaces: tuple[Interface, ...] = attrs.field(default=(), converter=interface_tuple)
    ips: tuple[IPConfig040, ...] = attrs.field(default=(), converter=_ip_config_tuple)
    routes: tuple[Route, ...] = attrs.field(default=(), converter=route_tuple)
    dns: DNS = EMPTY_DNS

    @classmethod
    def from_json(cls, obj: Any) -> Result040:
        """Decode as 0.3.x/0.4.0, version taken as written (see :func:`~pycni.types.parse_result`)."""
        return versioned(decode_result, obj, cls.VERSIONS)

    def to_json(self) -> dict[str, Any]:
        """Go's emission: empty lists omitted, ``dns`` always present (``{}`` when empty)."""
        ips, routes = [ip.to_json() for ip in self.ips], [r.to_json() for r in self.routes]
        out = lists_json(self.cni_version, [interface_to_json(i) for i in self.interfaces], ips, routes)
        out["dns"] = self.dns.to_json()
        return out


def decode_result(value: Any, version: str) -> Result040:
    return Result040(version, *decode_lists(value, decode_interface, decode_ip_config))

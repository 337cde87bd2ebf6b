"""The ADD result as the Go plugin prints it at the config's ``cniVersion``, built from pycni.types models."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from pycni import version as _version
from pycni.types import DNS, IPAddress, IPConfig, Result, Result020, Result040, Route
from pycni.types.v020 import IPConfig020
from pycni.types.v040 import IPConfig040

from .config import IPRange

__all__ = ["build_result"]


def build_result(
    version: str, allocated: Sequence[tuple[IPAddress, IPRange]], routes: Sequence[Route], dns: DNS
) -> dict[str, Any]:
    """Each allocated IP with its range's prefix and gateway, the config's routes, the resolv.conf DNS."""
    parsed = _version.parse(version)
    if parsed < (0, 3, 0):  # one IP per family, each with the routes of its family (dst and gw only)
        per_family: dict[int, IPConfig020] = {}
        for family in (4, 6):
            found = next(((ip, r) for ip, r in allocated if ip.version == family), None)
            if found is not None:
                ip, r = found
                own = [Route(rt.dst, rt.gw) for rt in routes if rt.dst.version == family]
                per_family[family] = IPConfig020(_interface(ip, r), r.gateway, own)
        return Result020(version or "0.1.0", per_family.get(4), per_family.get(6), dns).to_json()
    if parsed < (1, 0, 0):  # dns always printed
        ips040 = [IPConfig040(str(ip.version), _interface(ip, r), r.gateway) for ip, r in allocated]
        return Result040(version, ips=ips040, routes=routes, dns=dns).to_json()
    # 1.x: an empty dns omitted (the latest cni library); skel prints the keys sorted
    ips = [IPConfig(_interface(ip, r), r.gateway) for ip, r in allocated]
    return Result(version, ips=ips, routes=routes, dns=dns).to_json()


def _interface(ip: IPAddress, r: IPRange) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    return ipaddress.ip_interface((ip, r.subnet.prefixlen))

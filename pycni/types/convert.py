"""Result conversion between the seven spec versions, with libcni's rules (``GetAsVersion``).

Every ordered pair converts. Within a family it is a relabel; across families it goes through
0.4.0, exactly as libcni chains its converters, so the lossy steps are libcni's:

- 1.x → 0.3.x/0.4.0: ``version`` from the address family; interfaces lose mtu/socketPath/pciID.
- 0.3.x/0.4.0 → 1.x: ``version`` dropped; interfaces keep name/mac/sandbox.
- → 0.1.0/0.2.0: the first ip labelled "4" and the first labelled "6"; each route goes to the
  config of its dst family with dst/gw only, or is dropped; no ip at all is an error.
- 0.1.0/0.2.0 → newer: ip4 then ip6, no interface index, routes ip4's then ip6's.
"""

from __future__ import annotations

from typing import Literal, overload

import attrs

from ..errors import ResultError
from ._common import Route
from .current import Interface, IPConfig, Result
from .v020 import IPConfig020, Result020
from .v040 import IPConfig040, Result040

__all__ = ["AnyResult", "convert"]

AnyResult = Result | Result040 | Result020

_MODEL_FOR_VERSION: dict[str, type[AnyResult]] = {v: m for m in (Result020, Result040, Result) for v in m.VERSIONS}

# What GetAsVersion assumes for a result whose cniVersion was never set.
_IMPLEMENTED: dict[type[AnyResult], str] = {Result020: "0.2.0", Result040: "0.4.0", Result: "1.1.0"}


@overload
def convert(result: AnyResult, to_version: Literal["1.0.0", "1.1.0"]) -> Result: ...
@overload
def convert(result: AnyResult, to_version: Literal["0.3.0", "0.3.1", "0.4.0"]) -> Result040: ...
@overload
def convert(result: AnyResult, to_version: Literal["", "0.1.0", "0.2.0"]) -> Result020: ...
@overload
def convert(result: AnyResult, to_version: str) -> AnyResult: ...
def convert(result: AnyResult, to_version: str) -> AnyResult:
    """``result`` as ``to_version`` (``""`` means 0.1.0); the result itself when already there.

    Raises :class:`ResultError` for an unknown version on either side, and for a result with no
    usable ip going to 0.1.0/0.2.0 (``cannot convert: no valid IP addresses``).
    """
    model = type(result)
    if model not in _IMPLEMENTED:
        raise TypeError(f"not a CNI result model: {model.__name__}")
    to_version = to_version or "0.1.0"
    from_version = result.cni_version or _IMPLEMENTED[model]
    target = _MODEL_FOR_VERSION.get(to_version)
    if target is None or from_version not in model.VERSIONS:
        raise ResultError(f"no converter for CNI result version {from_version} to {to_version}")
    if target is model:
        return result if result.cni_version == to_version else attrs.evolve(result, cni_version=to_version)
    via = to_version if target is Result040 else "0.4.0"
    if isinstance(result, Result):
        step = _to_040(result, via)
    elif isinstance(result, Result020):
        step = _from_020(result, via)
    else:
        step = result  # 0.3.x/0.4.0 going to another family: its own label never shows
    if target is Result040:
        return step
    return _to_020(step, to_version) if target is Result020 else _from_040(step, to_version)


def _short_interface(interface: Interface) -> Interface:
    """The 0.3.x/0.4.0 interface fields only."""
    if interface.mtu or interface.socket_path or interface.pci_id:
        return Interface(interface.name, interface.mac, sandbox=interface.sandbox)
    return interface


def _to_040(result: Result, version: str) -> Result040:
    ips = [
        IPConfig040("4" if ip.address.version == 4 else "6", ip.address, ip.gateway, ip.interface) for ip in result.ips
    ]
    interfaces = [_short_interface(i) for i in result.interfaces]
    return Result040(version, interfaces, ips, result.routes, result.dns)


def _from_040(result: Result040, version: str) -> Result:
    ips = [IPConfig(ip.address, ip.gateway, ip.interface) for ip in result.ips]
    interfaces = [_short_interface(i) for i in result.interfaces]
    return Result(version, interfaces, ips, result.routes, result.dns)


def _to_020(result: Result040, version: str) -> Result020:
    first4 = next((ip for ip in result.ips if ip.version == "4"), None)
    first6 = next((ip for ip in result.ips if ip.version == "6"), None)
    if first4 is None and first6 is None:
        raise ResultError("cannot convert: no valid IP addresses")
    routes4: list[Route] = []
    routes6: list[Route] = []
    for route in result.routes:
        (routes4 if route.dst.version == 4 else routes6).append(Route(route.dst, route.gw))
    ip4 = None if first4 is None else IPConfig020(first4.address, first4.gateway, routes4)
    ip6 = None if first6 is None else IPConfig020(first6.address, first6.gateway, routes6)
    return Result020(version, ip4, ip6, result.dns)


def _from_020(result: Result020, version: str) -> Result040:
    ips: list[IPConfig040] = []
    routes: list[Route] = []
    for label, config in (("4", result.ip4), ("6", result.ip6)):
        if config is not None:
            ips.append(IPConfig040(label, config.ip, config.gateway))
            routes.extend(config.routes)
    return Result040(version, (), ips, routes, result.dns)

"""static: IPAM from the config itself (addresses, routes, DNS), no allocation and no state.

Config keys, CNI_ARGS, result and error texts follow containernetworking/plugins v1.9.1 (its
static plugin only changed its skel wiring since Debian's 1.1.1):

* ``ipam.addresses`` (``address`` in CIDR notation, optional ``gateway``), ``ipam.routes``,
  ``ipam.dns``;
* ``IP=`` in CNI_ARGS (comma-separated CIDRs) adds addresses, ``GATEWAY=`` (comma-separated)
  sets the gateway of every ``IP=`` address whose subnet holds it (not of ``ipam.addresses``);
* ``args.cni.ips`` replaces the addresses, and ``runtimeConfig.ips`` (the ``ips`` capability)
  replaces them again;
* more than one address of a family needs cniVersion >= 0.3.0;
* CHECK needs a prevResult and fails only for an address found there with another gateway;
  DEL, GC and STATUS do nothing.

Where pycni differs, on purpose: a gateway of the other address family than its address is
refused (upstream prints it, and the interface plugin then fails to add the route).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

import attrs

from pycni import version as _version
from pycni._json import GoValueError, go_kind
from pycni.errors import CNIError
from pycni.sdk import Plugin, PluginRequest
from pycni.types import DNS, IPConfig, Result, Route
from pycni.types._common import address, cidr

from ._common import Fields, emit, fail, prev_result

__all__ = ["StaticConfig", "StaticPlugin", "load_config"]

_NO_PREV = "Required prevResult missing"


@attrs.frozen
class StaticConfig:
    ips: tuple[IPConfig, ...] = ()
    routes: tuple[Route, ...] = ()
    dns: DNS = DNS()


def _cidr(text: Any, message: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    if not isinstance(text, str) or "/" not in text:
        raise fail(message.format(text if isinstance(text, str) else text))
    try:
        return cidr(text)
    except GoValueError:
        raise fail(message.format(text)) from None


def _ip_list(f: Fields, source: Mapping[str, Any], where: str) -> list[Any]:
    items = f.array("ips", source=source)
    for item in items:
        if not isinstance(item, str):
            raise fail(f"json: cannot unmarshal {go_kind(item)} into Go struct field {where}.ips of type string")
    return items


def load_config(request: PluginRequest) -> StaticConfig:
    """The addresses (CNI_ARGS, ``args.cni.ips`` and ``runtimeConfig.ips`` applied), routes and DNS."""
    f = Fields(request.config, "failed to load netconf")
    ipam = request.config.get("ipam")
    if ipam is None:
        raise fail("IPAM config missing 'ipam' key")
    if not isinstance(ipam, Mapping):
        raise fail("json: cannot unmarshal into Go struct field Net.ipam of type main.IPAMConfig")
    entries: list[list[Any]] = []  # [address, gateway or None]
    for entry in f.array("addresses", source=ipam):
        if not isinstance(entry, Mapping):
            raise fail("json: cannot unmarshal into Go struct field IPAMConfig.ipam.addresses of type main.Address")
        try:
            gw = address(entry.get("gateway"))
        except GoValueError:
            raise fail(f"invalid IP address: {entry.get('gateway')}") from None
        text = entry.get("address", "")
        entries.append([_cidr(text, "the 'address' field is expected to be in CIDR notation, got: '{}'"), gw])
    env = request.load_args("IP", "GATEWAY")
    from_env: list[list[Any]] = []
    if env.get("IP"):
        for item in env["IP"].split(","):
            text = item.strip()
            from_env.append([_cidr(text, "the 'ip' field is expected to be in CIDR notation, got: '{}'"), None])
    if env.get("GATEWAY"):
        for item in env["GATEWAY"].split(","):
            try:
                gw = ipaddress.ip_address(item.strip())
            except ValueError:
                raise fail(f"invalid gateway address: {item}") from None
            for entry in from_env:  # upstream: not the configured addresses (still unparsed then)
                if gw in entry[0].network:
                    entry[1] = gw
    entries += from_env
    replacing = "an entry in the 'ips' field is NOT in CIDR notation, got: '{}'"
    cni = f.mapping("cni", source=f.mapping("args"))
    arg_ips = _ip_list(f, cni, "IPAMArgs.args.cni")
    if arg_ips:
        entries = [[_cidr(text, replacing), None] for text in arg_ips]
    runtime_ips = _ip_list(f, request.runtime_config, "Net.runtimeConfig")
    if runtime_ips:
        entries = [[_cidr(text, replacing), None] for text in runtime_ips]
    for addr, gw in entries:
        if gw is not None and gw.version != addr.version:
            raise fail(f"gateway {gw} is not of the same IP family as address {addr}")
    families = [addr.version for addr, _ in entries]
    if families.count(4) > 1 or families.count(6) > 1:
        try:
            new_enough = _version.greater_or_equal(request.cni_version, "0.3.0")
        except CNIError:
            new_enough = False
        if not new_enough:
            raise fail(f"CNI version {request.cni_version} does not support more than 1 address per family")
    try:
        routes = tuple(Route.from_json(r) for r in f.array("routes", source=ipam))
        dns = DNS.from_json(ipam["dns"]) if ipam.get("dns") is not None else DNS()
    except CNIError as e:
        raise fail(e.msg, e.details) from None
    return StaticConfig(tuple(IPConfig(addr, gw) for addr, gw in entries), routes, dns)


class StaticPlugin(Plugin):
    type = "static"

    def validate(self, request: PluginRequest) -> None:
        load_config(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf = load_config(request)
        return emit(Result("1.1.0", ips=list(conf.ips), routes=list(conf.routes), dns=conf.dns), request)

    def check(self, request: PluginRequest) -> None:
        conf = load_config(request)
        prev = prev_result(request)
        if prev is None:
            raise fail(_NO_PREV)
        for want in conf.ips:
            for have in prev.ips:
                if have.address.ip == want.address.ip:
                    if want.gateway is not None and want.gateway != have.gateway:
                        raise fail(f"static: Failed to match addr {have.address.ip} on interface {request.ifname}")
                    break

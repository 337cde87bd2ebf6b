"""An IPAM result applied to, and checked against, one interface (the reference's ``pkg/ipam``
``ConfigureIface`` and ``pkg/ip`` ``ValidateExpected*``), in the calling thread's namespace.

The plugins that hand a whole interface to the container (macvlan, ipvlan, vlan, host-device)
share these; container-side callers run them inside :func:`pycni.netns.run_in`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable, Mapping

from pycni.types import IPConfig, Result, Route

from . import addressing, batch, links, routing, sysctl
from .errors import fail, failing

__all__ = [
    "configure_iface",
    "check_ips",
    "check_routes",
    "check_on_link",
    "default_route_link",
    "default_route_indexes",
]


def configure_iface(ifname: str, result: Result, *, quiet_inet_conf: Mapping[str, int] | None = None) -> None:
    """Addresses (those whose ``interface`` names ``ifname``), link up, then routes; a route
    without a gateway uses the first gateway of its family. IPv6 gets ``disable_ipv6=0`` on
    ``lo`` and the interface and ``keep_addr_on_down=1``, and waits for DAD to settle when a
    gateway is IPv6. ``quiet_inet_conf``: the interface's IPv4 settings (``/proc/sys/net/ipv4/
    conf/<ifname>/`` names) set first, through netlink in the same send, a failure ignored.

    The requests go in one send (:mod:`.batch`), or two around the DAD wait: the kernel still
    applies those after a failed one, which the caller's undo (the interface deleted or handed
    back) takes away with the rest; the error is the first failure's, in order.
    """
    if not result.interfaces:
        raise fail("no interfaces to configure")
    index = links.ifindex(ifname)
    if index is None:
        raise fail(f'failed to lookup "{ifname}": Link not found')
    gateways: dict[int, str] = {}
    v6_enabled = False
    requests = batch.Requests()
    if quiet_inet_conf:
        requests.link_set(index, inet_conf=quiet_inet_conf)  # its answer is not read
    steps: list[tuple[int, str]] = []  # (answer position, what failed)
    for ip in result.ips:
        if ip.interface is None:
            continue
        if not 0 <= ip.interface < len(result.interfaces) or result.interfaces[ip.interface].name != ifname:
            raise fail(f'failed to add IP addr {ip.address} to "{ifname}": invalid interface index')
        if ip.address.version == 6 and not v6_enabled:
            for name in ("lo", ifname):
                with contextlib.suppress(OSError):  # unreadable: the reference logs and goes on
                    sysctl.ensure(f"net/ipv6/conf/{name}/disable_ipv6", 0)
            try:
                sysctl.write(f"net/ipv6/conf/{ifname}/keep_addr_on_down", 1)
            except OSError as e:
                raise fail(f'failed to enable keep_addr_on_down for interface "{ifname}": {e.strerror}') from e
            v6_enabled = True
        steps.append((requests.addr_add(index, ip.address), f'failed to add IP addr {ip.address} to "{ifname}"'))
        if ip.gateway is not None:
            gateways.setdefault(ip.gateway.version, str(ip.gateway))
    steps.append((requests.link_set(index, up=True), f'failed to set "{ifname}" UP'))
    if 6 in gateways:
        _sent(requests, steps)
        with failing(f'failed to settle addresses for "{ifname}"'), links.iproute() as ipr:
            addressing.wait_dad(ipr, index)
        requests, steps = batch.Requests(), []
    for route in result.routes:
        gw = str(route.gw) if route.gw is not None else gateways.get(route.dst.version)
        position = requests.route_append(
            index, route.dst.network, gw, priority=route.priority or 0, table=route.table, scope=route.scope
        )
        steps.append(
            (position, f"failed to add route '{route.dst.network} via {gw} dev {ifname} metric {route.priority}'")
        )
    _sent(requests, steps)


def _sent(requests: batch.Requests, steps: list[tuple[int, str]]) -> None:
    """Send ``requests``; the first failed step (in order) raised with its text."""
    answers = requests.send()
    for position, what in steps:
        with failing(what):
            answers[position].check()


def check_ips(ifname: str, ips: Iterable[IPConfig]) -> None:
    """Each address is on ``ifname`` and a main-table route to its prefix exists."""
    with links.iproute() as ipr:
        index = links.ifindex(ifname)
        if index is None:
            raise fail(f"Cannot find container link {ifname}")
        have = {a for a, _ in addressing.addresses(ipr, index)}
        for ip in ips:
            if ip.address not in have:
                raise fail(f"Failed to match addr {ip.address} on interface {ifname}")
            if not _has_route_to(ipr, ip.address.network):
                raise fail(f"Failed to find Gateway {ip.gateway} for interface {ifname}")


def check_routes(routes: Iterable[Route]) -> None:
    """Each route is in the main table: by destination (and gateway, if given); a default route
    matches any default route, as the reference's lookup does."""
    with links.iproute() as ipr:
        for route in routes:
            dst = route.dst.network
            gw = None if route.gw is None or dst.prefixlen == 0 else route.gw
            if not _has_route_to(ipr, dst, gw):
                raise fail(f"Expected Route {route.to_json()} not found in routing table")


def check_on_link(ipr: links.IPRoute, index: int, ifname: str, prev: Result) -> None:
    """A veth plugin's CHECK of its container end ``ifname`` (bridge, ptp): the prevResult's
    addresses of that interface (or of none) are on link ``index``, its routes go through it."""
    have = {a for a, _ in addressing.addresses(ipr, index)}
    for ip in prev.ips:
        if ip.interface is not None and 0 <= ip.interface < len(prev.interfaces):
            if prev.interfaces[ip.interface].name != ifname:
                continue
        if ip.address not in have:
            raise fail(f"Failed to match addr {ip.address} on interface {ifname}")
    for route in prev.routes:
        gw = str(route.gw) if route.gw is not None else None
        if not routing.has_route(ipr, index, route.dst.network, gw):
            raise fail(f"Expected Route {route.to_json()} not found in routing table")


def _has_route_to(ipr: links.IPRoute, dst: ipaddress.IPv4Network | ipaddress.IPv6Network, gw: object = None) -> bool:
    family = socket.AF_INET if dst.version == 4 else socket.AF_INET6
    for msg in routing.dump_routes(ipr, family):
        if msg["dst_len"] != dst.prefixlen:
            continue
        have = msg.get("dst")
        if have is not None and ipaddress.ip_network(f"{have}/{dst.prefixlen}", strict=False) != dst:
            continue
        if gw is not None and (msg.get("gateway") is None or ipaddress.ip_address(msg["gateway"]) != gw):
            continue
        return True
    return False


FR_ACT_TO_TBL = 1


def _rule_tables(ipr: links.IPRoute, family: int) -> set[int]:
    """The tables the routing rules of ``family`` send lookups to (any selector counts: a route
    that some packets take is a route the host needs)."""
    return {msg.get("table") for msg in links.call(ipr.get_rules, family=family) if msg["action"] == FR_ACT_TO_TBL}


def default_route_indexes(ipr: links.IPRoute, versions: Iterable[int] = (4, 6)) -> list[int]:
    """Every link a default route can leave through: IPv4 and IPv6 (``versions``), every table a
    rule reaches, each nexthop of a multipath route. Main-table IPv4 routes come first, in the
    kernel's order, so the first index is the device Go's ``GetDefaultRouteInterfaceName``
    would name."""
    found: list[tuple[int, int, int]] = []
    families = [f for f in (socket.AF_INET, socket.AF_INET6) if (4 if f == socket.AF_INET else 6) in versions]
    # Dumped in the calling thread's namespace, ``ipr``'s (every caller opened it there), with
    # only the default routes decoded: the others grow with the links (a veth's link-local routes).
    for family in families:
        rank = 0 if family == socket.AF_INET else 1
        tables = _rule_tables(ipr, family)
        requests = batch.Requests()  # one dump per send: a socket runs one dump at a time (EBUSY)
        position = requests.route_dump(family, defaults_only=True)
        answer = requests.send()[position]
        answer.check()
        for msg in answer.messages:
            table = msg.get("table")
            if table not in tables:
                continue
            oifs = [msg.get("oif")] + [hop["oif"] for hop in msg.get("multipath") or ()]
            where = (rank, 0 if table == routing.RT_TABLE_MAIN else 1)
            found.extend((*where, oif) for oif in oifs if oif)
    ordered = [oif for *_, oif in sorted(found, key=lambda f: f[:2])]
    return list(dict.fromkeys(ordered))


def default_route_link(ipr: links.IPRoute) -> links.Link | None:
    """The first link of :func:`default_route_indexes` (macvlan's and ipvlan's default master)."""
    for index in default_route_indexes(ipr):
        link = links.get_link(ipr, index=index)
        if link is not None:
            return link
    return None

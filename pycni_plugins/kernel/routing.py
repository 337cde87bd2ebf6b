"""Routes and policy routing rules, in the calling thread's network namespace (through
:func:`.links.call`, with an ``ipr`` of a :func:`.links.iproute` block opened in the same
thread): added, deleted, dumped as the attributes that re-create them; the output interface the
kernel picks; whether a route is there."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from typing import Any

from pyroute2.netlink.rtnl.rtmsg import rtmsg

from . import batch
from .errors import LinkError
from .links import IPRoute, call

__all__ = [
    "IPNetwork",
    "RT_TABLE_MAIN",
    "add_route",
    "del_route",
    "dump_routes",
    "route",
    "dump_rules",
    "rule",
    "route_oif",
    "has_route",
]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# linux/rtnetlink.h
RT_TABLE_MAIN, RTPROT_BOOT = 254, 3
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_HOST, RT_SCOPE_NOWHERE = 0, 253, 254, 255
_RTA_OIF = [name for name, *_ in rtmsg.nla_map].index("RTA_OIF")
_ATTRS_START = batch.HEADER_SIZE + 12  # struct rtmsg is 12 bytes


def add_route(
    ipr: IPRoute,
    index: int,
    dst: IPNetwork,
    gateway: str | None,
    *,
    priority: int = 0,
    table: int | None = None,
    scope: int | None = None,
    src: str | None = None,
) -> None:
    """Append a route (NLM_F_CREATE|NLM_F_APPEND, as the reference's ``RouteAddEcmp``);
    ``src`` is its preferred source address."""
    spec: dict[str, Any] = {
        "dst": str(dst),
        "oif": index,
        "table": RT_TABLE_MAIN if table is None else table,
        "proto": RTPROT_BOOT,
        "scope": (RT_SCOPE_UNIVERSE if gateway else RT_SCOPE_LINK) if scope is None else scope,
    }
    if gateway:
        spec["gateway"] = gateway
    if priority:
        spec["priority"] = priority
    if src:
        spec["prefsrc"] = src
    call(ipr.route, "append", **spec)


def del_route(ipr: IPRoute, index: int, dst: IPNetwork) -> None:
    """Delete the main-table route to ``dst`` through ``index``, whatever its scope and protocol
    (the kernel's own prefix route included); a missing one is fine."""
    try:
        call(ipr.route, "del", dst=str(dst), oif=index, table=RT_TABLE_MAIN, scope=RT_SCOPE_NOWHERE, proto=0)
    except LinkError as e:
        if e.errno != errno.ESRCH:
            raise


def dump_routes(ipr: IPRoute, family: int, table: int = RT_TABLE_MAIN) -> list[dict[str, Any]]:
    """The routes of ``table`` in ``family``, each as the attributes that identify and re-create
    it with :func:`route`: ``family``, ``dst_len``, ``proto``, ``scope``, ``type``, ``table``, and
    those of ``dst``, ``gateway``, ``prefsrc``, ``oif``, ``priority`` it has."""
    out = []
    for msg in call(ipr.route, "dump", family=family, table=table):
        spec: dict[str, Any] = {
            "family": msg["family"],
            "dst_len": msg["dst_len"],
            "proto": msg["proto"],
            "scope": msg["scope"],
            "type": msg["type"],
            "table": msg.get("table") or msg["table"],  # RTA_TABLE; the header's is 8 bits
        }
        for key in ("dst", "gateway", "prefsrc", "oif", "priority"):
            value = msg.get(key)
            if value is not None:
                spec[key] = value
        out.append(spec)
    return out


def route(ipr: IPRoute, command: str, **spec: Any) -> None:
    """``add``, ``replace`` or ``del`` one route given by pyroute2's attributes (as
    :func:`dump_routes` gives them)."""
    call(ipr.route, command, **spec)


def dump_rules(ipr: IPRoute, family: int) -> list[dict[str, Any]]:
    """The policy routing rules of ``family``: ``family``, ``table``, ``priority``, and
    ``src``/``src_len`` (``src`` is None for a rule from any source)."""
    return [
        {
            "family": msg["family"],
            "table": msg.get("table") or msg["table"],  # FRA_TABLE; the header's is 8 bits
            "priority": msg.get("priority") or 0,
            "src": msg.get("src"),
            "src_len": msg["src_len"],
        }
        for msg in call(ipr.get_rules, family=family)
    ]


def rule(ipr: IPRoute, command: str, **spec: Any) -> None:
    """``add`` or ``del`` one rule given by pyroute2's attributes (``family``, ``table``,
    ``src``, ``src_len``, ``priority``)."""
    call(ipr.rule, command, **spec)


def route_oif(dst: str) -> int | None:
    """The output interface the kernel picks for ``dst`` (``ip route get``), in the calling
    thread's namespace (one send of :mod:`.batch`: no ``IPRoute`` needed)."""
    requests = batch.Requests()
    requests.route_get(ipaddress.ip_address(dst))
    answer = requests.send()[0]
    if answer.error is not None:
        if answer.error.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return None
        raise answer.error
    # RTA_OIF read from the answer's bytes: pyroute2 would decode its ~10 attributes for it
    oif = batch.attributes(answer.raw[0], _ATTRS_START, (_RTA_OIF,)).get(_RTA_OIF) if answer.raw else None
    return (struct.unpack_from("=I", oif)[0] or None) if oif is not None else None


def has_route(ipr: IPRoute, index: int, dst: IPNetwork, gateway: str | None) -> bool:
    """Whether a main-table route to ``dst`` (via ``gateway``, if given) leaves through ``index``."""
    family = socket.AF_INET if dst.version == 4 else socket.AF_INET6
    want_gw = ipaddress.ip_address(gateway) if gateway is not None else None
    for msg in call(ipr.route, "dump", family=family, table=RT_TABLE_MAIN):
        if msg["dst_len"] != dst.prefixlen or msg.get("oif") != index:
            continue
        have = msg.get("dst")
        if have is not None and ipaddress.ip_network(f"{have}/{dst.prefixlen}") != dst:
            continue
        gw = msg.get("gateway")
        if want_gw is not None and (gw is None or ipaddress.ip_address(gw) != want_gw):
            continue
        return True
    return False

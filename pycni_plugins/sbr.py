"""sbr: source-based routing for the container interface (the reference meta plugin's semantics).

Chained after an interface plugin. For each of the prevResult's addresses on ``CNI_IFNAME``:
a rule ``from <ip>/32 (or /128) lookup <table>`` with the kernel's default priority, a default
route via the address's gateway in that table, and the interface's main-table routes that
belong to the address (source or gateway inside its subnet, or neither set) copied there; the
interface's main-table routes are then deleted, so the rules decide. Tables are the first ones
from 100 up that no rule uses. With ``table`` set (v1.9.1; absent in Debian's 1.1.1) only the
rules are added, pointing at that table. DEL removes the rules whose source is an address of
the interface (of ``table`` only, when set). Both hold an exclusive ``flock`` on the netns path
while they work, as the reference does. CHECK, GC and STATUS do nothing, as upstream.

Where pycni differs, on purpose: ADD validates the prevResult and ``table`` before changing
anything, and undoes its rules and routes if a later step fails (the reference leaves what it
had done); a DEL whose namespace is gone succeeds (the reference's lock would create a file at
the vanished path, and its DEL fails).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator
from typing import Any

from pycni import netns
from pycni.sdk import Plugin, PluginRequest, cancel
from pycni.types import IPConfig, Result

from ._common import Fields, emit, fail, failing, in_netns, netns_gone, prev_result
from .kernel import addressing, links, routing

__all__ = ["SbrPlugin"]

FIRST_TABLE = 100
_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def _table(request: PluginRequest) -> int | None:
    f = Fields(request.config, "failed to parse network configuration")
    if request.config.get("table") is None:
        return None
    table = f.integer("table")
    if not 0 < table < 2**32:
        raise fail(f"invalid table {table}: must be 1..4294967295")
    return table


def _ip_configs(request: PluginRequest) -> tuple[IPConfig, ...]:
    prev = prev_result(request)
    if prev is None:
        raise fail("This plugin must be called as chained plugin")
    if not prev.ips:
        raise fail(f"No IP addresses supplied on interface: {request.ifname}")
    out = []
    for ip in prev.ips:
        i = ip.interface
        if i is not None and 0 <= i < len(prev.interfaces) and prev.interfaces[i].name != request.ifname:
            continue
        out.append(ip)
    return tuple(out)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[int]:
    """The netns file, open and under the reference's lock (``flock(LOCK_EX)`` on it)."""
    fd = netns.open_netns(path)
    try:
        cancel.flock(fd, f"the lock on {path}")
        yield fd
    finally:
        os.close(fd)


def _rules(ipr: links.IPRoute) -> list[dict[str, Any]]:
    return [r for family in _FAMILIES for r in routing.dump_rules(ipr, family)]


def _default_pref(ipr: links.IPRoute, family: int) -> int:
    """The priority the kernel gives a rule sent without one (``fib_default_rule_pref``): one
    below the second rule's. pyroute2 always sends a priority, so it is computed here."""
    prefs = sorted(r["priority"] for r in routing.dump_rules(ipr, family))
    return prefs[1] - 1 if len(prefs) > 1 and prefs[1] else 0


def _add_rule(ipr: links.IPRoute, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, table: int) -> dict[str, Any]:
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    spec = {
        "family": family,
        "table": table,
        "src": str(ip),
        "src_len": ip.max_prefixlen,
        "priority": _default_pref(ipr, family),
    }
    routing.rule(ipr, "add", **spec)
    return spec


def _inside(net: Any, addr: str | None) -> bool:
    return addr is not None and ipaddress.ip_address(addr) in net


def _free_table(used: set[int], start: int) -> int:
    table = start
    while table in used:
        table += 1
    return table


def _add(ifname: str, ips: tuple[IPConfig, ...], table: int | None) -> None:
    undo: list[tuple[str, dict[str, Any]]] = []
    with links.iproute() as ipr:
        try:
            if table is not None:
                for ip in ips:
                    with failing("failed to add rule"):
                        undo.append(("rule", _add_rule(ipr, ip.address.ip, table)))
                return
            _add_with_routes(ipr, ifname, ips, undo)
        except BaseException:
            for what, spec in reversed(undo):
                with contextlib.suppress(Exception):
                    if what == "rule":
                        routing.rule(ipr, "del", **spec)
                    elif what == "route":
                        routing.route(ipr, "del", **spec)
                    else:
                        routing.route(ipr, "replace", **spec)
            raise


def _add_with_routes(ipr: links.IPRoute, ifname: str, ips: tuple[IPConfig, ...], undo: list[Any]) -> None:
    # Tables in use: by a rule, or (as the reference's main-table route list can only show)
    # the main table itself.
    used = {r["table"] for r in _rules(ipr)} | {routing.RT_TABLE_MAIN}
    table = _free_table(used, FIRST_TABLE)
    index = links.ifindex(ifname)
    if index is None:
        raise fail(f"Cannot find network interface {ifname}: Link not found")
    routes = [r for family in _FAMILIES for r in routing.dump_routes(ipr, family) if r.get("oif") == index]
    for ip in ips:
        with failing("Failed to add rule"):
            undo.append(("rule", _add_rule(ipr, ip.address.ip, table)))
        if ip.gateway is not None:
            default = {
                "family": socket.AF_INET if ip.address.version == 4 else socket.AF_INET6,
                "dst_len": 0,
                "gateway": str(ip.gateway),
                "table": table,
                "oif": index,
                "proto": routing.RTPROT_BOOT,
            }
            with failing(f"Failed to add default route to {ip.gateway}"):
                routing.route(ipr, "add", **default)
            undo.append(("route", default))
        for route in routes:
            if (
                _inside(ip.address.network, route.get("prefsrc"))
                or _inside(ip.address.network, route.get("gateway"))
                or (route.get("prefsrc") is None and route.get("gateway") is None)
            ):
                copy = {**route, "table": table}
                with failing("Failed to readd route"):
                    routing.route(ipr, "replace", **copy)
                undo.append(("route", copy))
        used.add(table)
        table = _free_table(used, table + 1)
    for route in routes:
        with failing("Failed to delete route"):
            routing.route(ipr, "del", **route)
        undo.append(("restore", route))


def _tidy(ifname: str, table: int | None) -> None:
    with links.iproute() as ipr:
        rules = [r for r in _rules(ipr) if table is None or r["table"] == table]
        index = links.ifindex(ifname)
        if index is None:
            return
        mine = {a.ip for a, _ in addressing.addresses(ipr, index)}
        errors = []
        for rule in rules:
            src = rule.get("src")
            if src is None or ipaddress.ip_address(src) not in mine:
                continue
            try:
                routing.rule(ipr, "del", **rule)
            except links.LinkError as e:
                errors.append(f"Failed to delete rule {e.strerror}")
        if errors:
            raise fail(errors[-1])


class SbrPlugin(Plugin):
    type = "sbr"

    def validate(self, request: PluginRequest) -> None:
        _table(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        table = _table(request)
        ips = _ip_configs(request)
        try:
            with _locked(request.netns) as fd:
                in_netns(fd, _add, request.ifname, ips, table)
        except netns.NetnsError as e:
            raise fail(f'failed to open netns "{request.netns}": {e.strerror}') from e
        prev = prev_result(request)
        assert isinstance(prev, Result)
        return emit(prev, request)

    def delete(self, request: PluginRequest) -> None:
        table = _table(request)
        if not request.netns:
            return
        try:
            with _locked(request.netns) as fd:
                netns.run_in(fd, _tidy, request.ifname, table)
        except netns.NetnsError as e:
            if not netns_gone(e):
                raise fail(str(e)) from e

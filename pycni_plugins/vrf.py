"""vrf: enslave the container interface to a VRF in the container (the reference meta plugin's
semantics).

Chained after an interface plugin. ``vrfname`` names the VRF, created (and set UP) if missing
with ``table`` or, without one, the lowest table id no other VRF in the namespace uses; an
existing VRF with a different ``table`` is an error. Enslaving makes the kernel drop the
interface's global IPv6 addresses, so they are put back (waiting for their local route to
appear in the VRF's table), and the interface's universe-scope main-table routes are copied
into the VRF's table. The prevResult is passed on unchanged. DEL releases the interface and
deletes the VRF once it has no other member; CHECK verifies the interface is a member.
Supported versions start at 0.3.1, GC and STATUS do nothing, as upstream (v1.9.1, where the
IPv6 address restoration is new compared with Debian's 1.1.1).

Where pycni differs, on purpose:

* a kernel without VRF support (``CONFIG_NET_VRF``, as on the machine this was written on)
  fails ADD with a message naming it instead of a bare "operation not supported";
* ``vrfname`` must be a valid interface name and ``table`` a valid table id (not 253-255, the
  kernel's default, main and local tables), checked before anything changes;
* an ADD that fails after creating the VRF or enslaving the interface undoes that (the
  reference leaves the new VRF and the enslaved interface behind);
* a DEL whose namespace is gone (an empty file left at the path, too) succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import time
from typing import Any

from pycni import netns
from pycni.errors import CNIError
from pycni.sdk import Plugin, PluginRequest
from pycni.types import Result

from ._common import Fields, emit, fail, failing, in_netns, is_link_name, netns_gone, prev_result
from ._sublink import DRIVERS
from .kernel import addressing, links, routing

__all__ = ["VrfPlugin"]

SUPPORTED = ("0.3.1", "0.4.0", "1.0.0", "1.1.0")
_RT_SCOPE_UNIVERSE = 0
_ROUTE_WAIT = tuple(0.01 * 2**i for i in range(9))  # the reference's backoff, 10 ms .. 2.56 s


def _config(request: PluginRequest) -> tuple[str, int]:
    f = Fields(request.config, "failed to load netconf")
    name = f.string("vrfname")
    if not name:
        raise fail("configuration is expected to have a valid vrf name")
    if not is_link_name(name):
        raise fail(f'invalid vrf name "{name}": not a valid interface name')
    table = f.integer("table", bounds=None)  # a uint32, checked with the reference's message
    if not 0 <= table < 2**32:
        raise f.error(f"json: cannot unmarshal number {table} into Go struct field VRFNetConf.table of type uint32")
    if table in (253, 254, 255):
        raise fail(f"invalid table {table}: the kernel's default, main and local tables cannot be a VRF's")
    return name, table


def _vrf_table(ipr: links.IPRoute, index: int) -> int:
    info = links.link_info(ipr, index=index)
    table: int = (info.data.get("IFLA_VRF_TABLE") if info is not None else None) or 0
    return table


def _find(ipr: links.IPRoute, name: str) -> links.Link | None:
    link = links.get_link(ipr, name)
    if link is not None and link.kind != "vrf":
        raise fail(f"Netlink {name} is not a VRF")
    return link


def _free_table(ipr: links.IPRoute) -> int:
    taken = {_vrf_table(ipr, link.index) for link in links.dump_links(ipr) if link.kind == "vrf"}
    table = 1
    while table in taken:
        table += 1
    return table


def _global_v6(ipr: links.IPRoute, index: int) -> set[Any]:
    return {a for a, _ in addressing.addresses(ipr, index, socket.AF_INET6) if not a.ip.is_link_local}


def _add(name: str, table: int, ifname: str) -> None:
    undo: list[Any] = []
    with links.iproute() as ipr:
        try:
            _attach(ipr, name, table, ifname, undo)
        except BaseException:
            for step in reversed(undo):
                with contextlib.suppress(Exception):
                    step()
            raise


def _attach(ipr: links.IPRoute, name: str, table: int, ifname: str, undo: list[Any]) -> None:
    vrf = _find(ipr, name)
    if vrf is not None:
        have = _vrf_table(ipr, vrf.index)
        if table and have != table:
            raise fail(f"VRF {name} already exist with different routing table {have}")
        table = have
    else:
        table = table or _free_table(ipr)
        try:
            links.add_link(ipr, name, "vrf", vrf_table=table)
        except links.LinkError as e:
            if e.errno == errno.EOPNOTSUPP:
                raise fail(
                    f"could not add VRF {name}: this kernel has no VRF support ({DRIVERS['vrf']} is not set): "
                    f"{e.strerror}"
                ) from e
            raise fail(f"could not add VRF {name}: {e.strerror}") from e
        undo.append(lambda: links.delete_link(name))
        vrf = links.get_link(ipr, name)
        assert vrf is not None
        links.set_up(ipr, vrf.index)
    link = links.get_link(ipr, ifname)
    if link is None:
        raise fail(f"could not get link by name {ifname}")
    if link.master:
        master = links.get_link(ipr, index=link.master)
        raise fail(f"interface {ifname} has already a master set: {master.name if master else link.master}")
    before = _global_v6(ipr, link.index)
    routes = [
        r
        for family in (socket.AF_INET, socket.AF_INET6)
        for r in routing.dump_routes(ipr, family)
        if r.get("oif") == link.index and r["scope"] == _RT_SCOPE_UNIVERSE
    ]
    with failing(f"could not set vrf {name} as master of {ifname}"):
        links.set_link(ipr, link.index, master=vrf.index)
    undo.append(lambda: links.set_link(ipr, link.index, master=0))
    for addr in sorted(before - _global_v6(ipr, link.index), key=str):
        with failing(f"could not restore address {addr} to {ifname} @ {name}"):
            addressing.add_address(ipr, link.index, addr, exist_ok=True)
        _wait_local_route(ipr, table, link.index, addr, ifname)
    for r in routes:
        with failing(f"could not add route '{r.get('dst')}/{r['dst_len']}'"):
            routing.route(ipr, "replace", **{**r, "table": table})


def _wait_local_route(ipr: links.IPRoute, table: int, index: int, addr: Any, ifname: str) -> None:
    for delay in (*_ROUTE_WAIT, None):
        for r in routing.dump_routes(ipr, socket.AF_INET6, table):
            if r.get("oif") == index and r["dst_len"] == 128 and ipaddress.ip_address(r.get("dst", "::")) == addr.ip:
                return
        if delay is None:
            raise fail(f"failed getting local/host addresses for {ifname} in table {table} with dst {addr}")
        time.sleep(delay)


def _del(name: str, ifname: str) -> None:
    with links.iproute() as ipr:
        vrf = links.get_link(ipr, name)
        if vrf is None:
            return
        if vrf.kind != "vrf":
            raise fail(f"Netlink {name} is not a VRF")
        link = links.get_link(ipr, ifname)
        if link is None:
            raise fail(f"resetMaster: could not get link by name {ifname}")
        try:
            links.set_link(ipr, link.index, master=0)
        except links.LinkError as e:
            raise fail(f"resetMaster: could reset master to {ifname}") from e
        if not any(other.master == vrf.index for other in links.dump_links(ipr)):
            links.delete_link(name)


def _check(name: str, ifname: str) -> None:
    with links.iproute() as ipr:
        vrf = _find(ipr, name)
        if vrf is None:
            raise fail("Link not found")
        if not any(link.master == vrf.index and link.name == ifname for link in links.dump_links(ipr)):
            raise fail(f"failed to find {ifname} associated to vrf {name}")


class VrfPlugin(Plugin):
    type = "vrf"
    supported_versions = SUPPORTED

    def validate(self, request: PluginRequest) -> None:
        _config(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        name, table = _config(request)
        if request.prev_result is None:
            raise fail("missing prevResult from earlier plugin")
        prev = prev_result(request)
        try:
            in_netns(request.netns, _add, name, table, request.ifname)
        except links.LinkError as e:
            raise fail(f"cmdAdd failed: {e.strerror}") from e
        except CNIError as e:
            raise fail(f"cmdAdd failed: {e.msg}", e.details) from e
        return emit(prev if prev is not None else Result("1.1.0"), request)

    def delete(self, request: PluginRequest) -> None:
        name, _ = _config(request)
        if not request.netns:
            return
        try:
            with failing("cmdDel failed"):
                netns.run_in(request.netns, _del, name, request.ifname)
        except netns.NetnsError as e:
            if not netns_gone(e):
                raise fail(str(e)) from e

    def check(self, request: PluginRequest) -> None:
        name, _ = _config(request)
        if request.prev_result is None:
            raise fail("missing prevResult from earlier plugin")
        in_netns(request.netns, _check, name, request.ifname)

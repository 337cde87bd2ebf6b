"""The world an example runs in, made and removed whole: a throwaway host and container network
namespace, a temp data dir and subnets; in the host, the link configs name as master; before
ADD, a chained plugin's prevResult made real. And what both namespaces hold, read back (links,
addresses, routes, packet-filter rules) to find what a DEL left.

The fuzzer's only contact with the kernel: pyroute2 and libnftables are imported where used.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import attrs

from ... import netns
from ...types import AnyResult, Result020
from .. import strategies

__all__ = ["World", "throwaway_world", "addresses", "materialize", "settled", "state"]

V4_POOL = ipaddress.IPv4Network("198.18.0.0/15")
V6_POOL = ipaddress.IPv6Network("fd00:18::/48")


@attrs.frozen
class World:
    """One example's namespaces (paths), data dir and subnets (a /24 and a /64 of its own)."""

    host: str
    container: str
    data_dir: str
    v4: ipaddress.IPv4Network
    v6: ipaddress.IPv6Network


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Stop signals wait until the block ends, so a world is made and removed whole (a signal
    between making a namespace and registering its removal would leak it)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def throwaway_world(index: int) -> Iterator[World]:
    """A host and a container namespace and a data dir, removed afterwards whatever happens."""
    prefix = f"pycni-fuzz-{os.getpid()}"
    stack = contextlib.ExitStack()
    try:
        with _signals_held():
            host = stack.enter_context(netns.Throwaway(prefix))
            container = stack.enter_context(netns.Throwaway(prefix))
            netns.run_in(host.path, _host_link)
            data_dir = tempfile.mkdtemp(prefix=f"{prefix}-")
            stack.callback(shutil.rmtree, data_dir, True)
        v4 = list(V4_POOL.subnets(new_prefix=24))[index % 512]
        v6 = ipaddress.IPv6Network((int(V6_POOL.network_address) + (index % 65536) * 2**64, 64))
        yield World(host.path, container.path, data_dir, v4, v6)
    finally:
        with _signals_held():
            stack.close()


def addresses(result: AnyResult) -> list[tuple[Any, Any]]:
    """(address, gateway) of each of ``result``'s IPs, whatever its version."""
    if isinstance(result, Result020):
        return [(c.ip, c.gateway) for c in (result.ip4, result.ip6) if c is not None]
    return [(ip.address, ip.gateway) for ip in result.ips]


def _host_link() -> None:
    """(In the host namespace.) The link the configs of macvlan, ipvlan and vlan name as master
    and host-device's as its device (:data:`pycni.testing.strategies.HOST_LINK`): a veth end
    with its peer up too, so it has carrier (without, IPv6 DAD never starts on what is made of
    it, and an ADD with an IPv6 gateway waits out its DAD timeout)."""
    from pyroute2 import IPRoute

    peer = f"{strategies.HOST_LINK}p"
    with IPRoute() as ipr:
        ipr.link("add", ifname=strategies.HOST_LINK, kind="veth", peer=peer, state="up")
        ipr.link("set", index=ipr.link_lookup(ifname=peer)[0], state="up")


def materialize(container: str, result: AnyResult, ifname: str) -> None:
    """(In the host namespace.) A veth to ``ifname`` in ``container`` holding ``result``'s addresses."""
    from pyroute2 import IPRoute

    host_name = "pfz-host"
    interfaces = getattr(result, "interfaces", ())
    if interfaces and interfaces[0].name and interfaces[0].name != ifname:
        host_name = interfaces[0].name
    fd = os.open(container, os.O_RDONLY)
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=host_name, kind="veth", peer={"ifname": ifname, "net_ns_fd": fd}, state="up")
            index = ipr.link_lookup(ifname=host_name)[0]
            for address, gateway in addresses(result):
                if gateway is not None:
                    ipr.addr("add", index=index, address=str(gateway), prefixlen=address.network.prefixlen, flags=0x02)
    finally:
        os.close(fd)
    netns.run_in(container, _container_side, ifname, result)


def _container_side(ifname: str, result: AnyResult) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=index, state="up")
        for address, gateway in addresses(result):
            ipr.addr("add", index=index, address=str(address.ip), prefixlen=address.network.prefixlen, flags=0x02)
            if gateway is not None:
                with contextlib.suppress(Exception):
                    ipr.route(
                        "add",
                        dst="default",
                        gateway=str(gateway),
                        oif=index,
                        family=socket.AF_INET if address.version == 4 else socket.AF_INET6,
                    )


def settled(world: World, timeout: float = 2.0) -> dict[str, dict[str, list[str]]]:
    """The state once the container's links, addresses and routes stop changing: the kernel adds a
    made-real prevResult's IPv6 local routes when the veth's carrier comes up, a moment later."""
    links, deadline = netns.run_in(world.container, _read_links), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.02)
        again = netns.run_in(world.container, _read_links)
        if again == links:
            break
        links = again
    return state(world)


def state(world: World) -> dict[str, dict[str, list[str]]]:
    return {
        "host": netns.run_in(world.host, _read_state),
        "container": netns.run_in(world.container, _read_state),
    }


def _read_state() -> dict[str, list[str]]:
    """(In a namespace.) Its links, addresses, routes and packet-filter rules, as text lines."""
    return {**_read_links(), "rules": _rules()}


def _read_links() -> dict[str, list[str]]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        names = {}
        links = []
        for link in ipr.link("dump"):
            names[link["index"]] = link.get("ifname")
            links.append(f"{link.get('ifname')} {link.get(('linkinfo', 'kind')) or 'device'}")
        addresses = [f"{names.get(a['index'])} {a.get('address')}/{a['prefixlen']}" for a in ipr.addr("dump")]
        routes = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in ipr.route("dump", family=family):
                routes.append(
                    f"{r.get('dst') or 'default'}/{r['dst_len']} via {r.get('gateway')} dev {names.get(r.get('oif'))}"
                    f" table {r.get('table')}"
                )
    return {"links": links, "addresses": addresses, "routes": routes}


def _rules() -> list[str]:
    """The nftables ruleset (pycni's tables, and iptables-nft's: its comments, addresses and
    targets all show there), plus iptables-save's where iptables is the legacy one."""
    lines: list[str] = []
    from ..._libnftables import LibnftablesMissing, Nftables

    try:
        rc, out, _ = Nftables().cmd("list ruleset")
        if rc == 0:
            lines += out.splitlines()
    except LibnftablesMissing:  # the legacy tables are all there is
        pass
    if _legacy_iptables():
        for tool in ("iptables-save", "ip6tables-save"):
            proc = subprocess.run([tool], capture_output=True, text=True, check=False)
            lines += [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    return [line.strip() for line in lines if line.strip()]


@functools.cache
def _legacy_iptables() -> bool:
    if not shutil.which("iptables-save"):
        return False
    version = subprocess.run(["iptables", "-V"], capture_output=True, text=True, check=False).stdout
    return "nf_tables" not in version

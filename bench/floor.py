"""The ``floor`` row: one container's kernel objects made with the fewest raw pyroute2 and
libnftables calls, so a chain's latency can be read as a multiple of what the kernel work costs
from Python at all (``×floor`` in the report).

Per container the default chain leaves a veth pair (host end UP on the bridge, ``eth0`` in the
container), ``lo`` UP, the container's address, its default route via the gateway, and four
nftables elements in pycni's table (masquerade, firewall, host port, hairpin). The floor makes
exactly those:

* ADD: one ``RTM_NEWLINK`` from the host (the veth, its peer created in the container
  namespace, the host end enslaved and UP, both MACs given); in the container, ``eth0``'s two
  settings the chain leaves (as Go's bridge plugin does): ``accept_dad=0`` written to
  ``/proc/sys`` (IPv6 settings have no netlink setter) and ``arp_notify=1`` in one netlink send
  (``IFLA_INET_CONF``, as pycni sends it); one socket (opened with the calling thread in the
  container's namespace, the way the runtime enters the host's) and four requests: ``lo`` UP,
  the address, ``eth0`` UP, the default route; one libnftables transaction adding the four
  elements, with the comments pycni gives them. ``arp_notify=1`` makes ``eth0`` UP send a
  gratuitous ARP, which the bridge floods to every port within that request: at N=1000 most of
  a container's link-up time (docs/scale-and-dataplane.md, "The container's link-up at N"), so a
  floor without it would not compare the same end state.
* DEL: one transaction deleting the elements, one ``RTM_DELLINK`` of the host end (the
  container end goes with it), acknowledged.

Everything else the chain does is not the kernel objects' cost and is left out: no IPAM (the
address is the one host-local hands out), no state records or results cache, no reads, no
sysctls but ``eth0``'s (the cell's one-time ``ip_forward`` is set up front). The bridge, its gateway address
and pycni's nftables skeleton are shared by all containers; they are made before the timed
calls by one in-process ADD and DEL of the chain for a throwaway container (so the tables,
sets and chains are pycni's own, byte for byte).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import nftables
from pyroute2 import IPRoute

from pycni import netns
from pycni.sdk import Attachment
from pycni_plugins.kernel import batch, layout
from pycni_plugins.kernel.nft.ownership import comment

from .drivers import (
    CONTAINER_PORT,
    DEFAULT,
    PORTS_PER_BRIDGE,
    BackendError,
    RuntimeDriver,
    bridge_name,
    container_id,
    expected_address,
    host_port,
    network_name,
    network_of,
    subnet,
)
from .session import Cell

NAME = "floor"
_MAC_BASE = 0x02_00_00_00_00_00  # locally administered
RTPROT_BOOT = 3  # the route's protocol, as pycni's and the reference's


def _mac(n: int) -> str:
    raw = (_MAC_BASE | n).to_bytes(6, "big")
    return ":".join(f"{b:02x}" for b in raw)


def _elements(i: int) -> tuple[list[str], list[str]]:
    """The nft commands adding and deleting container ``i``'s elements, as pycni writes them."""
    addr = ipaddress.ip_interface(f"{expected_address(i)}/{subnet(network_of(i)).prefixlen}")
    att = Attachment(network_name(network_of(i)), container_id(i), "eth0")
    owned = (
        ("masq", layout.masq_element(addr)),
        ("firewall", layout.firewall_element(addr.ip)),
        ("portmap", layout.hostport_element("tcp", host_port(i), addr.ip, CONTAINER_PORT, None)),
        ("portmap", layout.hairpin_element(addr)),
    )
    return [e.add(comment(att, owner)) for owner, e in owned], [e.delete() for _, e in owned]


class FloorDriver:
    """The floor for one cell (see the module docstring). ``add`` returns the address it gave."""

    ops: tuple[str, ...] = ("add", "del")
    workload = DEFAULT

    def __init__(self, cell: Cell) -> None:
        self.cell = cell
        self._prepare()
        with netns.entered(cell.host):
            # Kept for the cell, as the runtime keeps its host-side sockets: bound to the host
            # namespace at creation, usable from here afterwards.
            self.ipr = IPRoute()
            self.nft = nftables.Nftables()
            self.bridges = [socket.if_nametoindex(bridge_name(k)) for k in range(self._networks)]
        self.nft_cmds = [_elements(i) for i in range(len(cell.containers))]
        self.hosts = [f"vfl{i:08x}" for i in range(len(cell.containers))]

    @property
    def _networks(self) -> int:
        return network_of(len(self.cell.containers) - 1) + 1 if self.cell.containers else 1

    def _prepare(self) -> None:
        """The shared objects (bridge, gateway address, ip_forward, pycni's skeleton) by one
        ADD and DEL of the chain for a container of its own, on each network of the cell (one
        bridge per :data:`PORTS_PER_BRIDGE` containers, as the chain's cells)."""
        with netns.Throwaway(name=f"{os.path.basename(self.cell.host)}-floor") as ns:
            # container i of this cell is on network i // PORTS_PER_BRIDGE: the first of each is ours
            last = (self._networks - 1) * PORTS_PER_BRIDGE
            prep = Cell(self.cell.label, self.cell.host, (ns.path,) * (last + 1), self.cell.dir, self.cell.cache_dir)
            self._prep = RuntimeDriver(prep, path=[], backend="inprocess")
            for k in range(self._networks):
                self._prep.add(k * PORTS_PER_BRIDGE)
                self._prep.delete(k * PORTS_PER_BRIDGE)

    def add(self, i: int) -> object:
        fd = os.open(self.cell.containers[i], os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.ipr.link(
                "add",
                ifname=self.hosts[i],
                kind="veth",
                address=_mac(2 * i + 1),
                master=self.bridges[network_of(i)],
                state="up",
                peer={"ifname": "eth0", "net_ns_fd": fd, "address": _mac(2 * i + 2)},
            )
            with netns.entered(fd):
                ctr = IPRoute()
                eth0 = socket.if_nametoindex("eth0")  # an ioctl, not a netlink request
                # eth0's two settings the chain leaves (see the module docstring): IPv6's has no
                # netlink setter; arp_notify goes before eth0 UP, whose gratuitous ARP it asks for
                Path("/proc/sys/net/ipv6/conf/eth0/accept_dad").write_text("0")
                settings = batch.Requests()
                settings.link_set(eth0, inet_conf={"arp_notify": 1})
                (answer,) = settings.send()
                answer.check()
        finally:
            os.close(fd)
        net = subnet(network_of(i))
        try:
            ctr.link("set", index=1, state="up")
            # the broadcast given as pycni (and `ip addr`) give an IPv4 address
            ctr.addr(
                "add",
                index=eth0,
                address=expected_address(i),
                prefixlen=net.prefixlen,
                broadcast=str(net.broadcast_address),
            )
            ctr.link("set", index=eth0, state="up")
            ctr.route("add", dst="0.0.0.0/0", gateway=str(net[1]), oif=eth0, proto=RTPROT_BOOT)
        finally:
            ctr.close()
        self._nft(self.nft_cmds[i][0])
        return expected_address(i)

    def check(self, i: int) -> None:
        raise NotImplementedError("the floor has no CHECK")

    def delete(self, i: int) -> None:
        self._nft(self.nft_cmds[i][1])
        self.ipr.link("del", ifname=self.hosts[i])

    def address(self, result: object) -> str:
        return str(result)

    def _nft(self, commands: list[str]) -> None:
        rc, _, err = self.nft.cmd("\n".join(commands))
        if rc != 0:
            raise BackendError(f"nft: {err.strip()}")

    def close(self) -> None:
        """Close the kept sockets (the cell's ``latency_cell`` calls this before counting fds)."""
        self.ipr.close()
        del self.nft  # libnftables frees its context, and closes its socket, with the object
        self._prep.close()  # the directory fds kept by the chain that made the shared objects

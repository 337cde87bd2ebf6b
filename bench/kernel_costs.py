"""Two kernel costs that grow with N, measured apart from any CNI stack (docs/scale-and-dataplane.md).

    .venv/bin/python bench/kernel_costs.py procsys 2000    # /proc/sys/net lookups vs namespaces that looked
    .venv/bin/python bench/kernel_costs.py bridge 10,500,1000   # one more bridge port with K ports
    .venv/bin/python bench/kernel_costs.py linkup 10,1000       # a container's eth0 up with K live ports

``procsys K``: in a throwaway host namespace, the median cost of reading
``/proc/sys/net/ipv4/ip_forward`` by full path, relative to an open ``/proc/sys/net`` and to an
open ``/proc/sys/net/ipv4``, and through ``pycni_plugins.kernel.sysctl`` from a thread that keeps
its sockets (as ``pycni serve``'s workers and the main thread do) — before and after K
throwaway namespaces each read one ``/proc/sys/net`` file.

``bridge LIST``: in a throwaway namespace with one bridge, after K veth ports for each K in LIST
(both ends up, as a cell's containers' are), the median time of the next port's veth add,
``set master``, ``set up``, a ``link get``, and ``peer up``: its other end set up, which gives
the bridge port carrier (what a container's ``eth0`` up does on the host's bridge).

``linkup LIST``: in a throwaway host namespace with one bridge and K live containers (each a
throwaway namespace whose ``eth0`` is UP with an address, its host end UP on the bridge), the
median time of one more container's send of pycni's bridge plugin — ``eth0``'s address, ``eth0``
UP, the default route, in one netlink send (:mod:`pycni_plugins.kernel.batch`) — with the
container's ``eth0`` (a) as the kernel makes it, (b) with ``arp_notify=1`` (sent first in the
same send, as pycni sends it), (c) with ``accept_dad=0`` (written to /proc/sys before), (d) both,
as the chain leaves it; the four interleaved, round after round.

Everything happens in namespaces made here and removed on the way out; run as root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere

from pycni import netns

PREFIX = "pycni-kcost-"


def _median_us(fn: Callable[[], object], k: int = 200) -> float:
    samples = []
    for _ in range(k):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return round(statistics.median(samples), 1)


def _procsys_costs() -> dict[str, float]:
    from pycni_plugins.kernel import links, sysctl

    links.keep_iproutes()  # this thread keeps, as the daemon's workers do: sysctl keeps its directories

    def full() -> object:
        return Path("/proc/sys/net/ipv4/ip_forward").read_text()

    net = os.open("/proc/sys/net", os.O_RDONLY | os.O_DIRECTORY)
    ipv4 = os.open("/proc/sys/net/ipv4", os.O_RDONLY | os.O_DIRECTORY)
    try:

        def below(fd: int, rel: str) -> Callable[[], object]:
            return lambda: os.close(os.open(rel, os.O_RDONLY, dir_fd=fd))

        return {
            "full path": _median_us(full),
            "below /proc/sys/net": _median_us(below(net, "ipv4/ip_forward")),
            "below /proc/sys/net/ipv4": _median_us(below(ipv4, "ip_forward")),
            "kernel.sysctl.read": _median_us(lambda: sysctl.read("net/ipv4/ip_forward")),
        }
    finally:
        os.close(net)
        os.close(ipv4)


def _look() -> None:
    Path("/proc/sys/net/ipv4/conf/lo/arp_notify").read_text()


def procsys(k: int) -> None:
    with netns.Throwaway(name=f"{PREFIX}host") as host:
        print(f"before: {netns.run_in(host.path, _procsys_costs)} (µs)")
        with contextlib.ExitStack() as stack:
            for i in range(k):
                ns = stack.enter_context(netns.Throwaway(name=f"{PREFIX}{i}"))
                netns.run_in(ns.path, _look)
            print(f"after {k} namespaces looked below /proc/sys/net: {netns.run_in(host.path, _procsys_costs)} (µs)")


def _bridge_costs(points: list[int]) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("add", ifname="br0", kind="bridge")
        (br,) = ipr.link_lookup(ifname="br0")
        ipr.link("set", index=br, state="up")
        ports = 0
        for target in points:
            while ports < target:
                ipr.link("add", ifname=f"h{ports}", kind="veth", peer={"ifname": f"c{ports}"})
                (index,) = ipr.link_lookup(ifname=f"h{ports}")
                ipr.link("set", index=index, master=br)
                ipr.link("set", index=index, state="up")
                ipr.link("set", index=ipr.link_lookup(ifname=f"c{ports}")[0], state="up")
                ports += 1
            labels = ("veth add", "set master", "set up", "link get", "peer up")
            samples: dict[str, list[float]] = {label: [] for label in labels}
            for j in range(15):
                name = f"t{target}-{j}"
                start = time.perf_counter()
                ipr.link("add", ifname=name, kind="veth", peer={"ifname": f"p{name}"})
                samples["veth add"].append(time.perf_counter() - start)
                (index,) = ipr.link_lookup(ifname=name)
                for label, command, spec in (
                    ("set master", "set", {"master": br}),
                    ("set up", "set", {"state": "up"}),
                    ("link get", "get", {}),
                ):
                    start = time.perf_counter()
                    ipr.link(command, index=index, **spec)
                    samples[label].append(time.perf_counter() - start)
                (peer,) = ipr.link_lookup(ifname=f"p{name}")
                start = time.perf_counter()
                ipr.link("set", index=peer, state="up")
                samples["peer up"].append(time.perf_counter() - start)
                ipr.link("del", index=index)
            medians = {label: round(statistics.median(v) * 1000, 3) for label, v in samples.items()}
            print(f"{target} ports: {medians} (ms)", flush=True)


def bridge(points: list[int]) -> None:
    with netns.Throwaway(name=f"{PREFIX}bridge") as ns:
        netns.run_in(ns.path, _bridge_costs, points)


_VARIANTS = {
    "defaults": (False, False),
    "arp_notify": (True, False),
    "accept_dad=0": (False, True),
    "both": (True, True),
}
_NET = ipaddress.ip_network("198.18.0.0/16")


def _live_container(address: str) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        (eth0,) = ipr.link_lookup(ifname="eth0")
        ipr.addr("add", index=eth0, address=address, prefixlen=_NET.prefixlen, broadcast=str(_NET.broadcast_address))
        ipr.link("set", index=eth0, state="up")


def _send(arp_notify: bool, no_dad: bool, address: str) -> float:
    """In the probe container: the setting(s), then the timed send; its time in ms."""
    from pycni_plugins.kernel import batch

    if no_dad:
        Path("/proc/sys/net/ipv6/conf/eth0/accept_dad").write_text("0")
    eth0 = socket.if_nametoindex("eth0")
    requests = batch.Requests()
    if arp_notify:
        requests.link_set(eth0, inet_conf={"arp_notify": 1})
    requests.addr_add(eth0, ipaddress.ip_interface(f"{address}/{_NET.prefixlen}"))
    requests.link_set(eth0, up=True)
    requests.route_append(eth0, ipaddress.ip_network("0.0.0.0/0"), str(_NET[1]))
    start = time.perf_counter()
    answers = requests.send()
    elapsed = (time.perf_counter() - start) * 1000
    for answer in answers:
        answer.check()
    return elapsed


def linkup(points: list[int], rounds: int = 15) -> None:
    from pyroute2 import IPRoute

    with contextlib.ExitStack() as stack:
        host = stack.enter_context(netns.Throwaway(name=f"{PREFIX}lhost"))
        probe = stack.enter_context(netns.Throwaway(name=f"{PREFIX}lprobe"))
        with netns.entered(host.path):
            ipr = IPRoute()
        stack.callback(ipr.close)

        def veth(name: str, ns: str) -> None:
            fd = os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                ipr.link(
                    "add", ifname=name, kind="veth", master=br, state="up", peer={"ifname": "eth0", "net_ns_fd": fd}
                )
            finally:
                os.close(fd)

        ipr.link("add", ifname="br0", kind="bridge")
        (br,) = ipr.link_lookup(ifname="br0")
        ipr.addr("add", index=br, address=str(_NET[1]), prefixlen=_NET.prefixlen)
        ipr.link("set", index=br, state="up")
        live = 0
        for target in points:
            while live < target:
                ns = stack.enter_context(netns.Throwaway(name=f"{PREFIX}l{live}"))
                veth(f"vl{live}", ns.path)
                netns.run_in(ns.path, _live_container, str(_NET[2 + live]))
                live += 1
            time.sleep(5)  # the new containers' own DAD, solicitations and reports die down
            samples: dict[str, list[float]] = {v: [] for v in _VARIANTS}
            for _ in range(rounds):
                for variant, (arp_notify, no_dad) in _VARIANTS.items():
                    veth("vprobe", probe.path)
                    samples[variant].append(netns.run_in(probe.path, _send, arp_notify, no_dad, str(_NET[-2])))
                    ipr.link("del", ifname="vprobe")
                    time.sleep(0.05)
            medians = {v: round(statistics.median(s), 3) for v, s in samples.items()}
            print(f"{target} live containers: {medians} (ms, median of {rounds})", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("procsys", "bridge", "linkup"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "procsys":
        procsys(int(argv[1]))
    elif argv[0] == "bridge":
        bridge([int(v) for v in argv[1].split(",")])
    else:
        linkup([int(v) for v in argv[1].split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

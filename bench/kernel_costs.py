"""Two kernel costs that grow with N, measured apart from any CNI stack (docs/scale-and-dataplane.md).

    .venv/bin/python bench/kernel_costs.py procsys 2000    # /proc/sys/net lookups vs namespaces that looked
    .venv/bin/python bench/kernel_costs.py bridge 10,500,1000   # one more bridge port with K ports

``procsys K``: in a throwaway host namespace, the median cost of reading
``/proc/sys/net/ipv4/ip_forward`` by full path, relative to an open ``/proc/sys/net`` and to an
open ``/proc/sys/net/ipv4``, and through ``pycni_plugins.kernel.sysctl`` from a thread that keeps
its sockets (as ``pycni serve``'s workers and the main thread do) — before and after K
throwaway namespaces each read one ``/proc/sys/net`` file.

``bridge LIST``: in a throwaway namespace with one bridge, after K veth ports for each K in LIST
(both ends up, as a cell's containers' are), the median time of the next port's veth add,
``set master``, ``set up``, a ``link get``, and ``peer up``: its other end set up, which gives
the bridge port carrier (what a container's ``eth0`` up does on the host's bridge).

Everything happens in namespaces made here and removed on the way out; run as root.
"""

from __future__ import annotations

import contextlib
import os
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


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("procsys", "bridge"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "procsys":
        procsys(int(argv[1]))
    else:
        bridge([int(v) for v in argv[1].split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

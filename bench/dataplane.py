"""The data plane, measured in packets: what N containers' firewall and NAT state costs traffic.

Per backend × N, one cell (a throwaway host namespace and N container namespaces) with every
container ADDed (not timed), plus an "outside" namespace joined to the host namespace by a
veth (host 198.19.255.1/24, outside .2). Then, each for ``seconds``, ``repeat`` times (the
median is reported, every run kept in ``runs``):

* ``host_port``: new TCP connections per second from the outside namespace to the *last*
  container's published host port on the host's address (198.19.255.1:20000+N-1): the DNAT path
  through portmap's rules, where a linear chain walks the most rules;
* ``c2c_conn``: new TCP connections per second from container N-1 to container 0's port 80,
  across the bridge (bridged IPv4 traverses the host's iptables/nftables hooks: br_netfilter's
  ``bridge-nf-call-iptables``, recorded per cell, is 1 in a new namespace on this kernel). The
  newest container is the client: per-container forward rules appended in ADD order (the Go
  firewall plugin's) put its ``-s``/``-d`` accepts last, so every packet walks all of them;
* ``c2c_throughput``: iperf3 TCP throughput from container N-1 to container 0.

The connection generator is ``connrate.c`` (compiled here with gcc: Debian packages no tool that
makes complete short-lived connections and reports their rate): ``workers`` processes that each
connect, wait for the server's close, and reset. Its server accepts and closes at once. Servers
and clients run under ``nsenter --net`` in the cell's namespaces, and are gone when the cell is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pycni import netns

from . import rules
from .drivers import CONTAINER_PORT, FAILURES, Backend, host_port
from .measure import Progress
from .session import Session

SOURCE = Path(__file__).with_name("connrate.c")
HOST_ADDR, OUTSIDE_ADDR, LINK_PREFIX = "198.19.255.1", "198.19.255.2", 24
HOST_LINK, OUTSIDE_LINK = "dpout0", "dpin0"
IPERF_PORT = 5201
BACKENDS = ("reference-exec", "netavark", "pycni-inprocess")


def problem() -> str | None:
    """Why the section cannot run here, or ``None``."""
    missing = [tool for tool in ("gcc", "iperf3", "nsenter") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)} (scripts/setup.sh installs them)" if missing else None


def build(scratch: str) -> str:
    """Compile the connection generator into a directory of the session's temp dir."""
    os.makedirs(os.path.join(scratch, "dataplane"), exist_ok=True)
    binary = os.path.join(scratch, "dataplane", "connrate")
    subprocess.run(["gcc", "-O2", "-Wall", "-o", binary, str(SOURCE)], check=True, capture_output=True)
    return binary


def _wire_outside(host: str, outside: str) -> None:
    """The veth between the host namespace and the outside one, addressed and up."""
    from pyroute2 import IPRoute

    def host_side() -> None:
        fd = os.open(outside, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=HOST_LINK, kind="veth", peer={"ifname": OUTSIDE_LINK, "net_ns_fd": fd})
                (index,) = ipr.link_lookup(ifname=HOST_LINK)
                ipr.addr("add", index=index, address=HOST_ADDR, prefixlen=LINK_PREFIX)
                ipr.link("set", index=index, state="up")
        finally:
            os.close(fd)

    def outside_side() -> None:
        with IPRoute() as ipr:
            (index,) = ipr.link_lookup(ifname=OUTSIDE_LINK)
            ipr.addr("add", index=index, address=OUTSIDE_ADDR, prefixlen=LINK_PREFIX)
            ipr.link("set", index=index, state="up")
            ipr.link("set", index=1, state="up")

    netns.run_in(host, host_side)
    netns.run_in(outside, outside_side)


def _in(ns: str, argv: list[str]) -> list[str]:
    return ["nsenter", f"--net={ns}", "--", *argv]


@contextlib.contextmanager
def _server(argv: list[str], ready: str) -> Iterator[None]:
    """A server process for the block: started, waited for until it prints ``ready``, ended."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if ready in line:
                break
        else:
            raise RuntimeError(f"{argv[3]} did not start: {''.join(seen)[-500:]}")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _connrate(binary: str, ns: str, addr: str, port: int, seconds: float, workers: int) -> dict[str, Any]:
    argv = _in(ns, [binary, "client", addr, str(port), str(seconds), str(workers)])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    ok, failed, wall = out.split()
    return {
        "connections": int(ok),
        "failures": int(failed),
        "seconds": float(wall),
        "per_s": round(int(ok) / float(wall), 1),
    }


def _iperf(ns: str, addr: str, seconds: float) -> dict[str, Any]:
    argv = _in(ns, ["iperf3", "-c", addr, "-p", str(IPERF_PORT), "-t", str(seconds), "-J"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30)
    doc = json.loads(proc.stdout)
    if "error" in doc:
        raise RuntimeError(f"iperf3: {doc['error']}")
    received = doc["end"]["sum_received"]
    return {"bits_per_s": round(received["bits_per_second"]), "seconds": round(received["seconds"], 3)}


def _median(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run with the median ``key`` (the lower middle one of an even count), with every run's value."""
    ordered = sorted(runs, key=lambda r: r[key])
    return {**ordered[(len(ordered) - 1) // 2], "runs": [r[key] for r in runs]}


def cell(
    backend: Backend,
    n: int,
    binary: str,
    seconds: float,
    workers: int,
    repeat: int,
    session: Session,
    progress: Progress,
) -> dict[str, Any]:
    """One backend at one N: the three measurements, the ADD count and the firewall state."""
    row: dict[str, Any] = {"backend": backend.name, "n": n, "seconds": seconds, "workers": workers, "repeat": repeat}
    with session.cell(f"{backend.name}-dp-n{n}", n) as c, netns.Throwaway(name=f"{session.prefix}dp-outside") as out:
        driver = backend.make(c)
        results = []
        for i in range(n):
            try:
                results.append(driver.add(i))
            except FAILURES as e:
                row["error"] = f"ADD of container {i} failed: {e}"
                progress.line(f"    {backend.name:<16} n={n:<5} {row['error']}")
                return row
            progress.tick(f"{backend.name} n={n} data-plane ADDs", i + 1, n)
        first, last = driver.address(results[0]), driver.address(results[-1])
        snap = rules.snapshot(c.host)
        row["rules"] = rules.count(snap)
        walk = rules.first_packet(snap, host_port(n - 1), HOST_ADDR, f"{last}:{CONTAINER_PORT}")
        row["first_packet_rules"] = walk.get("rules_evaluated")
        row["bridge_nf_call_iptables"] = netns.run_in(c.host, _bridge_nf)
        _wire_outside(c.host, out.path)
        oldest, newest = c.containers[0], c.containers[-1]
        runs: dict[str, list[dict[str, Any]]] = {"host_port": [], "c2c_conn": [], "c2c_throughput": []}
        for _ in range(repeat):
            with _server(_in(newest, [binary, "server", str(CONTAINER_PORT)]), "listening"):
                runs["host_port"].append(_connrate(binary, out.path, HOST_ADDR, host_port(n - 1), seconds, workers))
            with _server(_in(oldest, [binary, "server", str(CONTAINER_PORT)]), "listening"):
                runs["c2c_conn"].append(_connrate(binary, newest, first, CONTAINER_PORT, seconds, workers))
            with _server(_in(oldest, ["iperf3", "-s", "-1", "--forceflush", "-p", str(IPERF_PORT)]), "listening"):
                runs["c2c_throughput"].append(_iperf(newest, first, seconds))
        for kind, key in (("host_port", "per_s"), ("c2c_conn", "per_s"), ("c2c_throughput", "bits_per_s")):
            row[kind] = _median(runs[kind], key)
        row["from"], row["to"] = last, first  # container to container
    progress.line(
        f"    {backend.name:<16} n={n:<5} host port {row['host_port']['per_s']:>9,.0f} conn/s"
        f" (failures {row['host_port']['failures']}); c2c {row['c2c_conn']['per_s']:>9,.0f} conn/s,"
        f" {row['c2c_throughput']['bits_per_s'] / 1e9:6.2f} Gbit/s; first packet {row['first_packet_rules']} rules"
    )
    return row


def _bridge_nf() -> int | None:
    try:
        return int(Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text())
    except OSError:
        return None  # no br_netfilter: bridged traffic skips the firewall hooks

"""The data plane, measured in packets: what N containers' firewall and NAT state costs traffic.

Per backend × N, one cell (a throwaway host namespace and N container namespaces) with every
container ADDed (not timed), plus an "outside" namespace joined to the host namespace by a
veth (host 198.19.255.1/24, outside .2). The cells of a group (by default every backend's cell
of one N) are made first and held together; then ``repeat`` rounds each take every measurement
once in every cell, one cell after the other, for ``seconds`` each (median, min and max kept,
with every run in round order):

* ``host_port``: new TCP connections per second from the outside namespace to the *last*
  container's published host port on the host's address (198.19.255.1:20000+N-1): the DNAT path
  through portmap's rules, where a linear chain walks the most rules;
* ``c2c_conn``: new TCP connections per second from container N-1 to container 0's port 80,
  across the bridge (bridged IPv4 traverses the host's iptables/nftables hooks: br_netfilter's
  ``bridge-nf-call-iptables``, recorded per cell, is 1 in a new namespace on this kernel). The
  newest container is the client: per-container forward rules appended in ADD order (the Go
  firewall plugin's) put its ``-s``/``-d`` accepts last, so every packet walks all of them;
* ``c2c_throughput``: iperf3 TCP throughput from container N-1 to container 0.

Interleaving is what makes two cells comparable on a shared 2-CPU machine: load that comes and
goes over minutes hits every cell of a round alike, where cells measured one after another
minutes apart differed 2–3× (docs/scale-and-dataplane.md). With ``pin`` the generator runs on
CPU 0 and the server on CPU 1 (``taskset``), so they never share a CPU's time.

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
from dataclasses import dataclass, field
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
    missing = [tool for tool in ("gcc", "iperf3", "nsenter", "taskset") if shutil.which(tool) is None]
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
            raise RuntimeError(f"{' '.join(argv[3:])} did not start: {''.join(seen)[-500:]}")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _connrate(binary: list[str], ns: str, addr: str, port: int, seconds: float, workers: int) -> dict[str, Any]:
    argv = _in(ns, [*binary, "client", addr, str(port), str(seconds), str(workers)])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    ok, failed, wall, cpu = out.split()
    return {
        "connections": int(ok),
        "failures": int(failed),
        "seconds": float(wall),
        "per_s": round(int(ok) / float(wall), 1),
        # the generator's CPU time per connection, softirq work in its context included (connrate.c)
        "cpu_us": round(float(cpu) * 1e6 / max(1, int(ok)), 2),
    }


def _iperf(prefix: list[str], ns: str, addr: str, seconds: float) -> dict[str, Any]:
    argv = _in(ns, [*prefix, "iperf3", "-c", addr, "-p", str(IPERF_PORT), "-t", str(seconds), "-J"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30)
    doc = json.loads(proc.stdout)
    if "error" in doc:
        raise RuntimeError(f"iperf3: {doc['error']}")
    received, cpu = doc["end"]["sum_received"], doc["end"]["cpu_utilization_percent"]
    # both ends' CPU (% of one CPU over the test: iperf3's getrusage) per Gbit moved; softirq
    # work in their context included, as the connection generator's (connrate.c)
    cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100 * received["seconds"]
    return {
        "bits_per_s": round(received["bits_per_second"]),
        "seconds": round(received["seconds"], 3),
        "cpu_ms_per_gbit": round(cpu_s * 1e3 / max(1e-9, received["bytes"] * 8 / 1e9), 2),
    }


def _spread(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run with the median ``key`` (the lower middle one of an even count), every run's value
    (in round order) and their min and max."""
    ordered = sorted(runs, key=lambda r: r[key])
    values = [r[key] for r in runs]
    return {**ordered[(len(ordered) - 1) // 2], "runs": values, "min": min(values), "max": max(values)}


KINDS = (("host_port", "per_s"), ("c2c_conn", "per_s"), ("c2c_throughput", "bits_per_s"))
CPU = {"per_s": ("cpu_us", "cpu_us_per_conn"), "bits_per_s": ("cpu_ms_per_gbit", "cpu_ms_per_gbit")}


@dataclass
class _Live:
    """A cell made and wired, its measurements so far (``runs`` per kind, in round order)."""

    row: dict[str, Any]
    outside: str
    oldest: str
    newest: str
    first: str
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {kind: [] for kind, _ in KINDS})


def _prepare(
    stack: contextlib.ExitStack, backend: Backend, n: int, session: Session, progress: Progress
) -> tuple[dict[str, Any], _Live | None]:
    """One backend's cell of N containers, every one ADDed, wired to its outside namespace; held
    open by ``stack``. ``None`` (and the row's ``error``) when an ADD failed."""
    row: dict[str, Any] = {"backend": backend.name, "n": n}
    c = stack.enter_context(session.cell(f"{backend.name}-dp-n{n}", n))
    out = stack.enter_context(netns.Throwaway(name=f"{session.prefix}dp-outside-{backend.name}-{n}"))
    driver = backend.make(c)
    results = []
    for i in range(n):
        try:
            results.append(driver.add(i))
        except FAILURES as e:
            row["error"] = f"ADD of container {i} failed: {e}"
            progress.line(f"    {backend.name:<16} n={n:<5} {row['error']}")
            return row, None
        progress.tick(f"{backend.name} n={n} data-plane ADDs", i + 1, n)
    first, last = driver.address(results[0]), driver.address(results[-1])
    snap = rules.snapshot(c.host)
    row["rules"] = rules.count(snap)
    walk = rules.first_packet(snap, host_port(n - 1), HOST_ADDR, f"{last}:{CONTAINER_PORT}")
    row["first_packet_rules"] = walk.get("rules_evaluated")
    row["bridge_nf_call_iptables"] = netns.run_in(c.host, _bridge_nf)
    _wire_outside(c.host, out.path)
    row["from"], row["to"] = last, first  # container to container
    return row, _Live(row, out.path, c.containers[0], c.containers[-1], first)


def _round(live: _Live, kind: str, binary: str, seconds: float, workers: int, pin: bool) -> None:
    """One run of one measurement in one cell (its server started and ended around it)."""
    n = live.row["n"]
    server_cpu, client_cpu = (["taskset", "-c", "1"], ["taskset", "-c", "0"]) if pin else ([], [])
    if kind == "host_port":
        with _server(_in(live.newest, [*server_cpu, binary, "server", str(CONTAINER_PORT)]), "listening"):
            run = _connrate([*client_cpu, binary], live.outside, HOST_ADDR, host_port(n - 1), seconds, workers)
    elif kind == "c2c_conn":
        with _server(_in(live.oldest, [*server_cpu, binary, "server", str(CONTAINER_PORT)]), "listening"):
            run = _connrate([*client_cpu, binary], live.newest, live.first, CONTAINER_PORT, seconds, workers)
    else:
        iperf = ["iperf3", "-s", "-1", "--forceflush", "-p", str(IPERF_PORT)]
        with _server(_in(live.oldest, [*server_cpu, *iperf]), "listening"):
            run = _iperf(client_cpu, live.newest, live.first, seconds)
    live.runs[kind].append(run)


def measure(
    cells: list[tuple[Backend, int]],
    binary: str,
    seconds: float,
    workers: int,
    repeat: int,
    pin: bool,
    session: Session,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Every cell of the group made and held at once, then ``repeat`` rounds: in each, every
    measurement taken once in every cell, one cell after another (the cells' order rotated per
    round), so that the machine's load moves over all cells alike and the runs of one round are
    seconds apart. One row per cell, with the median, min, max and every run (in round order,
    so ``runs[i]`` of two cells of the group were taken in the same round)."""
    group = " ".join(f"{backend.name}@{n}" for backend, n in cells)
    with contextlib.ExitStack() as stack:
        made = [_prepare(stack, backend, n, session, progress) for backend, n in cells]
        live = [cell for _, cell in made if cell is not None]
        for r in range(repeat):
            for kind, _ in KINDS:
                for cell in live[r % len(live) :] + live[: r % len(live)] if live else []:
                    _round(cell, kind, binary, seconds, workers, pin)
            progress.tick(f"data-plane rounds of {len(live)} cells", r + 1, repeat)
        for cell in live:
            cell.row.update(seconds=seconds, workers=workers, repeat=repeat, pinned=pin, group=group)
            for kind, key in KINDS:
                cell.row[kind] = _spread(cell.runs[kind], key)
                field_, name = CPU[key]  # the CPU time per connection or per Gbit: load moves it little
                cpu = [run[field_] for run in cell.runs[kind]]
                mid = sorted(cpu)[(len(cpu) - 1) // 2]
                cell.row[kind][name] = {"median": mid, "min": min(cpu), "max": max(cpu), "runs": cpu}
            _report(cell.row, progress)
    return [row for row, _ in made]


def _report(row: dict[str, Any], progress: Progress) -> None:
    hp, cc, tp = row["host_port"], row["c2c_conn"], row["c2c_throughput"]
    progress.line(
        f"    {row['backend']:<16} n={row['n']:<5} host port {hp['per_s']:>9,.0f} conn/s"
        f" [{hp['min']:,.0f}–{hp['max']:,.0f}] (failures {hp['failures']},"
        f" {hp['cpu_us_per_conn']['median']:.1f} µs CPU each);"
        f" c2c {cc['per_s']:>9,.0f} conn/s [{cc['min']:,.0f}–{cc['max']:,.0f}],"
        f" {tp['bits_per_s'] / 1e9:6.2f} Gbit/s [{tp['min'] / 1e9:.2f}–{tp['max'] / 1e9:.2f}];"
        f" first packet {row['first_packet_rules']} rules"
    )


def _bridge_nf() -> int | None:
    try:
        return int(Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text())
    except OSError:
        return None  # no br_netfilter: bridged traffic skips the firewall hooks

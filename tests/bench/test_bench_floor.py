"""The latency section's floor row (bench/floor.py): the chain's kernel objects by raw calls,
timed in the same rotation and reported as ``×floor``."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from bench.session import namespaces_with_prefix

pytestmark = [pytest.mark.privileged]

REPO = Path(__file__).resolve().parents[2]


def _run(out: Path, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "bench/run.py", "--n", "2", "--backends", "pycni-inprocess", "--sections", "latency"]
    proc = subprocess.run([*argv, *extra, "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_the_floor_makes_the_chains_kernel_objects_in_the_same_run_and_is_reported_as_x_floor() -> None:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-test-") as tmp:
        out = Path(tmp) / "bench.json"
        doc = _run(out)
        floor = {r["op"]: r for r in doc["rows"] if r["backend"] == "floor"}
        assert set(floor) == {"add", "del"}
        assert all(r["errors"] == 0 and len(r["samples"]) == 2 for r in floor.values()), floor
        cells = {c["backend"]: c for c in doc["cells"]}
        # The same firewall state as the chain's: pycni's rules, and one element per owner per container.
        assert cells["floor"]["rules_after_add"] == cells["pycni-inprocess"]["rules_after_add"]
        assert cells["floor"]["rules_after_del"] == cells["pycni-inprocess"]["rules_after_del"]
        assert cells["floor"]["first_packet"]["ok"], cells["floor"]["first_packet"]
        assert cells["floor"]["distinct_addresses"] and cells["floor"]["addresses"] == 2
        assert cells["floor"]["open_fds_delta"] <= 0, cells["floor"]["open_fds_new"]
        assert not namespaces_with_prefix(doc["config"]["namespace_prefix"])

        md = subprocess.run(
            [sys.executable, "bench/report.py", "--json", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        header = next(line for line in md.splitlines() if line.startswith("| op | N | backend"))
        assert "×floor" in header
        ratio = _p50(doc, "pycni-inprocess", "add") / _p50(doc, "floor", "add")
        (row,) = [line for line in md.splitlines() if line.startswith("| add | 2 | pycni-inprocess |")]
        assert f"| {ratio:.2f}× |" in row, row


def test_no_floor_leaves_it_out() -> None:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-test-") as tmp:
        doc = _run(Path(tmp) / "bench.json", "--no-floor")
        assert {r["backend"] for r in doc["rows"]} == {"pycni-inprocess"}


def _p50(doc: dict[str, Any], backend: str, op: str) -> float:
    (row,) = [r for r in doc["rows"] if r["backend"] == backend and r["op"] == op]
    return float(row["p50_ms"])


def test_the_floor_spreads_containers_over_the_chains_bridges_as_its_cells_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``PORTS_PER_BRIDGE`` containers (N=5000: five bridges, a bridge takes ≤ 1023 ports)."""
    from pyroute2 import IPRoute

    from bench import drivers, floor
    from bench.session import Session
    from pycni import netns

    monkeypatch.setattr(drivers, "PORTS_PER_BRIDGE", 3)
    monkeypatch.setattr(floor, "PORTS_PER_BRIDGE", 3)
    session = Session()
    try:
        with session.cell("floor-bridges", 7) as cell:
            driver = floor.FloorDriver(cell)
            assert [driver.add(i) for i in range(7)] == [drivers.expected_address(i) for i in range(7)]

            def ports() -> dict[str, int]:
                with IPRoute() as ipr:
                    links = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.get_links()}
                    masters = [m.get_attr("IFLA_MASTER") for m in ipr.get_links()]
                return {links[b]: masters.count(b) for b in set(masters) if b}

            def gateway() -> str:
                with IPRoute() as ipr:
                    (route,) = ipr.get_default_routes(family=2)
                    return str(route.get_attr("RTA_GATEWAY"))

            assert netns.run_in(cell.host, ports) == {"pcbench0": 3, "pcbench1": 3, "pcbench2": 1}
            assert netns.run_in(cell.containers[6], gateway) == str(drivers.subnet(2)[1])
            for i in range(7):
                driver.delete(i)
            driver.close()
    finally:
        session.close()
    assert not namespaces_with_prefix(session.prefix)


def _eth0_settings() -> tuple[str, str]:
    return (
        Path("/proc/sys/net/ipv4/conf/eth0/arp_notify").read_text().strip(),
        Path("/proc/sys/net/ipv6/conf/eth0/accept_dad").read_text().strip(),
    )


def test_the_floors_container_ends_with_the_chains_arp_notify_and_accept_dad() -> None:
    """arp_notify=1 makes eth0 UP send a gratuitous ARP the bridge floods to every port (most
    of the container's link-up time at N=1000): the floor must pay it as the chain does."""
    from bench import drivers, floor
    from bench.session import Session
    from pycni import netns

    session = Session()
    try:
        with session.cell("floor-settings", 2) as cell:
            driver = floor.FloorDriver(cell)
            driver.add(0)
            chain = drivers.RuntimeDriver(cell, path=[], backend="inprocess")
            chain.add(1)
            assert netns.run_in(cell.containers[1], _eth0_settings) == ("1", "0")
            assert netns.run_in(cell.containers[0], _eth0_settings) == ("1", "0")
            chain.delete(1)
            driver.delete(0)
            driver.close()
    finally:
        session.close()
    assert not namespaces_with_prefix(session.prefix)

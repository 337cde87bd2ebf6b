"""The bench's scale and data-plane pieces: cells spread over several bridges above
``PORTS_PER_BRIDGE`` containers, the ``steps`` section's per-request timings, and the
``dataplane`` section's rates for pycni (small N, a few seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import drivers, steps
from bench.measure import Progress
from bench.session import Session, namespaces_with_prefix
from pycni import netns

pytestmark = [pytest.mark.privileged]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """Not ``tmp_path``: concurrent pytest sessions on this machine prune each other's basetemp."""
    with tempfile.TemporaryDirectory(prefix="pycni-bench-test-") as path:
        yield Path(path)


def test_containers_beyond_one_bridge_go_to_further_networks_with_their_own_subnets() -> None:
    assert drivers.PORTS_PER_BRIDGE < 1023  # the kernel's bridge port limit (BR_MAX_PORTS - 1)
    assert drivers.expected_address(0) == "198.18.0.2"
    assert drivers.expected_address(999) == "198.18.3.233"
    assert drivers.expected_address(1000) == "198.19.0.2"
    assert drivers.expected_address(4999) == "198.19.15.233"
    assert drivers.bridge_name(0) == drivers.BRIDGE and drivers.bridge_name(4) == "pcbench4"
    subnets = [drivers.subnet(k) for k in range(10)]
    assert all(not a.overlaps(b) for i, a in enumerate(subnets) for b in subnets[i + 1 :])
    assert drivers.netavark_options(1500)["networks"] == {
        "pycni-bench-1": {"static_ips": ["198.19.1.246"], "interface_name": "eth0"}
    }


def test_a_cell_of_several_bridges_adds_and_deletes_every_container(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyroute2 import IPRoute

    monkeypatch.setattr(drivers, "PORTS_PER_BRIDGE", 3)
    session = Session()
    try:
        with session.cell("bridges", 7) as cell:
            driver = drivers.backend("pycni-inprocess", session.root).make(cell)
            addresses = [driver.address(driver.add(i)) for i in range(7)]
            assert addresses == [drivers.expected_address(i) for i in range(7)]

            def ports() -> dict[str, int]:
                with IPRoute() as ipr:
                    links = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.get_links()}
                    masters = [m.get_attr("IFLA_MASTER") for m in ipr.get_links()]
                return {links[b]: masters.count(b) for b in set(masters) if b}

            assert netns.run_in(cell.host, ports) == {"pcbench0": 3, "pcbench1": 3, "pcbench2": 1}
            for i in range(7):
                driver.delete(i)
    finally:
        session.close()
    assert not namespaces_with_prefix(session.prefix)


def test_steps_times_the_kernel_requests_of_in_process_adds_per_n() -> None:
    session = Session()
    try:
        doc = steps.measure([2, 6], 2, session, Progress())
    finally:
        session.close()
    low, high = doc["points"]
    assert (low["n"], high["n"], low["adds"], high["adds"]) == (2, 6, 1, 2)
    for point in (low, high):
        assert point["errors"] == 0
        assert point["steps"]["netlink link add"]["calls_per_add"] >= 1  # the veth pair
        assert any(label.startswith("nft ") for label in point["steps"])
        assert 0 < point["kernel_ms_per_add"] < point["add_mean_ms"]
        assert set(point["plugins_ms_per_add"]) == set(drivers.CHAIN)
    assert {row["step"] for row in doc["growth"]} >= {"netlink link add", "add_mean_ms"}
    # the instrumentation is gone afterwards
    from pycni_plugins.kernel import links

    assert "call" in links.__dict__ and not hasattr(links.call, "__wrapped__")


def test_dataplane_section_measures_positive_rates_interleaved_for_pycni_and_leaves_nothing(workdir: Path) -> None:
    out = workdir / "dp.json"
    argv = [
        sys.executable,
        "bench/run.py",
        "--n", "1",
        "--backends", "pycni-inprocess",
        "--sections", "dataplane",
        "--dataplane-n", "2,4",
        "--dataplane-seconds", "1",
        "--dataplane-repeat", "2",
        "--dataplane-group", "backend",
        "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [(r["backend"], r["n"]) for r in doc["dataplane"]] == [("pycni-inprocess", 2), ("pycni-inprocess", 4)]
    for row in doc["dataplane"]:
        assert "error" not in row, row
        for kind in ("host_port", "c2c_conn"):
            assert row[kind]["per_s"] > 0 and row[kind]["connections"] > 0, row
            assert len(row[kind]["runs"]) == 2 and min(row[kind]["runs"]) == row[kind]["per_s"] == row[kind]["min"]
            assert row[kind]["max"] == max(row[kind]["runs"])
            assert row[kind]["cpu_us_per_conn"]["median"] > 0  # the generator's CPU time per connection
        assert row["c2c_throughput"]["bits_per_s"] > 0 and len(row["c2c_throughput"]["runs"]) == 2
        assert row["c2c_throughput"]["cpu_ms_per_gbit"]["median"] > 0  # both iperf3 ends' CPU per Gbit
        assert row["first_packet_rules"] == 3  # pycni's DNAT is a map lookup whatever N
        assert (row["from"], row["to"]) == (drivers.expected_address(row["n"] - 1), drivers.expected_address(0))
    # both cells held and measured in the same rounds: the report compares them round by round
    assert {r["group"] for r in doc["dataplane"]} == {"pycni-inprocess@2 pycni-inprocess@4"}
    assert doc["cleanup"] == {"swept_namespaces": [], "temp_root_removed": True}
    assert not namespaces_with_prefix(doc["config"]["namespace_prefix"])
    assert "## Data plane" in proc.stdout

"""``bench/run.py --conflist``: a user's own chain, not the built-in one, measured with the same
cells, tables and PNG; a backend that cannot run the chain says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import drivers
from bench.session import namespaces_with_prefix
from pycni.sdk import builtin_plugin

pytestmark = [pytest.mark.privileged, pytest.mark.reference]

REPO = Path(__file__).resolve().parents[2]
# Not the built-in chain: bridge + portmap only, another version, subnet, bridge and name.
CONFLIST = {
    "cniVersion": "0.4.0",
    "name": "smoke-net",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "smoke0",
            "isGateway": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.19.0.0/24"}]], "dataDir": "/var/lib/cni/x"},
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-test-") as path:
        yield Path(path)


def _bench(workdir: Path, conflist: dict, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    path, out = workdir / "net.conflist", workdir / "bench.json"
    path.write_text(json.dumps(conflist))
    argv = [sys.executable, "bench/run.py", "--conflist", str(path), "--json", str(out), *args]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_a_users_conflist_is_measured_exec_and_in_process(workdir: Path) -> None:
    proc, doc = _bench(workdir, CONFLIST, "--n", "1", "--sections", "latency")
    c = doc["config"]
    assert c["chain"] == ["bridge", "portmap"] and c["cni_version"] == "0.4.0" and c["subnet"] == "198.19.0.0/24"
    assert c["backends"] == ["exec", "pycni-inprocess", "pycni-exec", "pycni-daemon"] and doc["skipped"] == {}
    for name in c["backends"]:
        rows = {r["op"]: r for r in doc["rows"] if r["backend"] == name}
        assert set(rows) == {"add", "check", "del"}, name
        assert rows["add"]["errors"] == 0 and rows["del"]["errors"] == 0, [r["first_error"] for r in rows.values()]
        if name == "exec":  # the reference portmap 1.1.1 fails CHECK on an IPv4-only attachment
            assert "could not check ipv6 dnat" in rows["check"]["first_error"]
        else:
            assert rows["check"]["errors"] == 0, rows["check"]["first_error"]
        (cell,) = [cell for cell in doc["cells"] if cell["backend"] == name]
        assert cell["first_packet"]["ok"], (name, cell["first_packet"])  # to 198.19.0.1, the chain's gateway
    assert "Workload: " + str(workdir / "net.conflist") in proc.stdout
    assert "p50 of exec at the same N" in proc.stdout
    assert not namespaces_with_prefix(c["namespace_prefix"]) and not os.path.exists(c["temp_root"])
    assert not os.path.exists("/var/lib/cni/x")  # the conflist's own dataDir was moved into the cell

    png = workdir / "bench.png"
    subprocess.run(
        [sys.executable, "bench/report.py", "--json", str(workdir / "bench.json"), "--png", str(png)],
        cwd=REPO,
        check=True,
        timeout=60,
    )
    assert png.read_bytes().startswith(b"\x89PNG")


def test_fold_measures_the_folded_conflist_through_one_exec_with_and_without_a_daemon(workdir: Path) -> None:
    folded = "pycni-exec-folded,pycni-daemon-folded"
    _, doc = _bench(workdir, CONFLIST, "--fold", "--n", "1", "--sections", "latency", "--backends", f"exec,{folded}")
    assert doc["config"]["fold"] is True and doc["skipped"] == {}
    for name in ("pycni-exec-folded", "pycni-daemon-folded"):
        rows = {r["op"]: r for r in doc["rows"] if r["backend"] == name}
        assert set(rows) == {"add", "check", "del"}, name
        assert [r["first_error"] for r in rows.values() if r["errors"]] == [], name
        (cell,) = [cell for cell in doc["cells"] if cell["backend"] == name]
        assert cell["first_packet"]["ok"], (name, cell["first_packet"])
        after_del = cell["rules_after_del"]["tables"].values()
        left = {name for table in after_del for name in table.get("elements_by_set", {})}
        assert left <= {"epoch"}, (name, left)  # the table's own marker, no container's element
    assert not namespaces_with_prefix(doc["config"]["namespace_prefix"])


def test_a_type_pycni_lacks_makes_its_backends_not_applicable(workdir: Path) -> None:
    # dhcp is the one reference plugin pycni leaves out (it needs its own daemon).
    chain = {**CONFLIST, "plugins": [*CONFLIST["plugins"], {"type": "dhcp"}]}
    _, doc = _bench(workdir, chain, "--fold", "--sections", "parsing", "--parse-time", "0.002")
    assert builtin_plugin("dhcp") is None
    # Folded, the chain execs what pycni lacks from the plugin dir, as the runtime would.
    assert doc["config"]["backends"][-2:] == ["pycni-exec-folded", "pycni-daemon-folded"]
    assert doc["skipped"] == {
        "pycni-inprocess": "not applicable: not built into pycni: dhcp",
        "pycni-exec": "not applicable: not built into pycni: dhcp",
        "pycni-daemon": "not applicable: not built into pycni: dhcp",
    }
    empty = workdir / "no-plugins"
    empty.mkdir()
    workload = drivers.load_workload(str(workdir / "net.conflist"), str(empty))
    for name in drivers.FOLDED_BACKENDS:
        assert drivers.problem(name, workload) == f"missing in {empty}: dhcp"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--conflist", "/nonexistent.conflist"], "--conflist /nonexistent.conflist: [Errno 2]"),
        (["--conflist", "bench/README.md"], "--conflist bench/README.md: "),
        (
            ["--conflist", "bench/examples/podman-default.conflist", "--sections", "memory"],
            "--sections memory: these measure the built-in chain",
        ),
        (["--fold"], "--fold is for --conflist"),
    ],
)
def test_bad_conflist_arguments_are_one_line_usage_errors(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "bench/run.py", *args], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

"""Smoke tests of the benchmark harness: every section at n=1, the JSON's shape, nothing left behind,
also when interrupted.

Runs ``bench/run.py`` as a subprocess (as a user would) for the reference plugins and every other
backend that can run here, then derives the markdown and PNG reports from its JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import drivers
from bench.session import PREFIX, Session, _run_is_live, namespaces_with_prefix
from pycni import netns

pytestmark = [pytest.mark.privileged, pytest.mark.reference]

REPO = Path(__file__).resolve().parents[2]
ROW_KEYS = {"backend", "n", "op", "p50_ms", "p90_ms", "p99_ms", "samples", "errors", "first_error"}


@pytest.fixture
def workdir() -> Iterator[Path]:
    """Not ``tmp_path``: concurrent pytest sessions on this machine prune each other's basetemp."""
    with tempfile.TemporaryDirectory(prefix="pycni-bench-test-") as path:
        yield Path(path)


def test_harness_runs_every_section_and_leaves_nothing(workdir: Path) -> None:
    names = [n for n in drivers.BACKENDS if drivers.problem(n) is None]
    assert {"reference-exec", *drivers.FOLDED_BACKENDS} <= set(names)
    out = workdir / "bench.json"
    argv = [
        sys.executable,
        "bench/run.py",
        "--n", "1",
        "--backends", ",".join(names),
        "--overhead-samples", "2",
        "--shim-samples", "3",
        "--concurrency-n", "2",
        "--concurrency-workers", "1,2",
        "--concurrency-backends", "pycni-inprocess,reference-exec,pycni-exec-folded,pycni-daemon-folded",
        "--memory-backends", "pycni-inprocess,reference-exec,netavark,pycni-exec-folded,pycni-daemon-folded",
        "--parse-time", "0.005",
        "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())

    assert {"cpu_model", "cores", "kernel", "python", "pyroute2", "debian_packages"} <= doc["machine"].keys()
    assert doc["skipped"] == {}
    for name in names:
        rows = {r["op"]: r for r in doc["rows"] if r["backend"] == name}
        assert set(rows) == set(("add", "del") if name == "netavark" else ("add", "check", "del")), name
        for row in rows.values():
            assert ROW_KEYS <= row.keys() and row["n"] == 1 and len(row["samples"]) == 1
            assert row["p50_ms"] > 0
        assert rows["add"]["errors"] == 0 and rows["del"]["errors"] == 0, [r["first_error"] for r in rows.values()]
        (cell,) = [c for c in doc["cells"] if c["backend"] == name]
        assert cell["first_packet"]["ok"], cell["first_packet"]
        assert cell["distinct_addresses"] and cell["addresses"] == 1
        assert cell["open_fds_delta"] <= 0, (name, cell["open_fds_new"])
        assert not cell["threads_left"], (name, cell["threads_left"])
    assert doc["overhead"]["samples"] == 2 and "p50_ms" in doc["overhead"]["accounted"]
    if "pycni-daemon" in names:
        assert doc["shim"]["samples"] == 3 and doc["shim"]["startup"]["p50_ms"] > 0
    ran = {(c["backend"], c["workers"]) for c in doc["concurrency"]}
    assert ran >= {(b, w) for b in ("reference-exec", *drivers.FOLDED_BACKENDS) for w in (1, 2)}, ran
    for c in doc["concurrency"]:
        assert c["add"]["distinct_addresses"], c
        if c["add"]["errors"] and c["backend"] == "reference-exec":
            # Go portmap 1.1.1 checks for its chain, then creates it: two first ADDs on a fresh
            # host can both try, and the loser fails with EEXIST (an upstream race, not ours).
            assert "CHAIN_USER_ADD failed (File exists)" in c["add"]["first_error"], c
        else:
            assert c["add"]["errors"] == 0, c
    assert {m["backend"] for m in doc["memory"]} >= set(drivers.FOLDED_BACKENDS)
    for m in doc["memory"]:
        assert m["points"][-1]["vm_hwm_kib"] > 0 and m["errors"] == 0, m
        if m["backend"] == "pycni-daemon-folded":  # the daemon's own peak, besides the runtime's
            assert m["points"][-1]["daemon_vm_hwm_kib"] > 10 * 1024, m
    assert {r["version"] for r in doc["parsing"]} >= {"0.2.0", "0.4.0", "1.0.0", "1.1.0"}

    assert doc["cleanup"] == {"swept_namespaces": [], "temp_root_removed": True}
    assert not namespaces_with_prefix(doc["config"]["namespace_prefix"])
    assert not os.path.exists(doc["config"]["temp_root"])

    md, png = workdir / "bench.md", workdir / "bench.png"
    report = [sys.executable, "bench/report.py", "--json", str(out), "--markdown", str(md), "--png", str(png)]
    subprocess.run(report, cwd=REPO, check=True, timeout=60)
    assert "## Latency per container (ms)" in md.read_text()
    assert png.read_bytes().startswith(b"\x89PNG")


def test_rounds_pool_the_samples_of_every_round_and_check_runs_in_the_last(workdir: Path) -> None:
    out = workdir / "rounds.json"
    argv = [sys.executable, "bench/run.py", "--n", "2", "--rounds", "3", "--sections", "latency",
            "--backends", "pycni-inprocess", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    samples = {(r["backend"], r["op"]): len(r["samples"]) for r in doc["rows"]}
    assert samples == {
        ("pycni-inprocess", "add"): 6,
        ("pycni-inprocess", "check"): 2,
        ("pycni-inprocess", "del"): 6,
        ("floor", "add"): 6,
        ("floor", "del"): 6,
    }
    assert all(r["errors"] == 0 for r in doc["rows"]), [r["first_error"] for r in doc["rows"]]
    assert {c["rounds"] for c in doc["cells"]} == {3}
    md = workdir / "rounds.md"
    subprocess.run([sys.executable, "bench/report.py", "--json", str(out), "--markdown", str(md)], cwd=REPO, check=True)
    assert "added and deleted its N containers 3 times" in md.read_text()
    assert all(c["distinct_addresses"] and c["open_fds_delta"] <= 0 for c in doc["cells"]), doc["cells"]
    assert doc["cleanup"] == {"swept_namespaces": [], "temp_root_removed": True}


def test_interrupted_run_cleans_up(workdir: Path) -> None:
    out = workdir / "bench.json"
    # A cell long enough (seconds) that a loaded machine cannot finish it before the signal lands.
    argv = [sys.executable, "bench/run.py", "--n", "400", "--backends", "reference-exec", "--sections", "latency"]
    proc = subprocess.Popen([*argv, "--json", str(out)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # interrupt in the middle of the n=400 cell's ADDs
            if b"== latency n=400" in line:
                break
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True
    assert doc["cleanup"]["temp_root_removed"]
    assert not namespaces_with_prefix(doc["config"]["namespace_prefix"])
    assert not os.path.exists(doc["config"]["temp_root"])


def test_a_killed_run_is_swept_by_the_next_one(workdir: Path) -> None:
    """SIGKILL runs no cleanup, and where /run is no tmpfs its namespace files outlive it."""
    argv = [sys.executable, "bench/run.py", "--n", "20", "--backends", "pycni-inprocess", "--sections", "latency"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stderr is not None
        prefix = None
        for line in proc.stderr:
            if line.startswith(b"pycni bench run "):
                prefix = line.split(b"namespaces ")[1].split(b"*")[0].decode()
            if b"== latency n=20" in line:
                break
        assert prefix is not None
        deadline = time.monotonic() + 60
        while len(namespaces_with_prefix(prefix)) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # the harness and its re-exec'd child alike
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run_id = prefix.removeprefix(PREFIX).rstrip("-")
    deadline = time.monotonic() + 30
    while _run_is_live(run_id) and time.monotonic() < deadline:  # the re-exec'd child dies a moment later
        time.sleep(0.01)
    tmp = tempfile.gettempdir()
    assert namespaces_with_prefix(prefix), "the kill left no namespace files to sweep"
    assert [n for n in os.listdir(tmp) if n.startswith(prefix)], "the kill left no temp dirs to sweep"

    session = Session()
    try:
        assert session.swept
        assert not namespaces_with_prefix(prefix)
        assert not [n for n in os.listdir(tmp) if n.startswith(f"{PREFIX}{run_id}")]
    finally:
        session.close()
    assert session.root_removed()
    assert not os.path.exists(os.path.join(tmp, f"{PREFIX}{session.run_id}.lock"))


def test_a_live_run_is_never_swept() -> None:
    live = Session()
    try:
        name = f"{live.prefix}not-a-namespace"
        open(os.path.join(netns.RUN_DIR, name), "w").close()
        other = Session()
        other.close()
        assert namespaces_with_prefix(live.prefix) == [name]
    finally:
        assert live.close() == [name]

"""A reboot: the kernel state (host namespace, bridge, veths, nftables, container namespaces) is
gone, while the cache, IPAM and state dirs survive (here / is ext4: nothing under /run or /tmp
is a tmpfs). Without a GC the leases of the vanished containers exhaust the range; ``pycni gc
--reconcile`` (dry run first, changing nothing) releases them, drops the stale cache entries and
state records, and new containers get addresses again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pycni import netns
from pycni.errors import CNIError
from tests.faults.conftest import REPO, World, conflist

pytestmark = pytest.mark.privileged
SUBNET = "198.18.66.0/29"  # 198.18.66.2-6: five addresses
ADDRESSES = 5


def _snapshot(root: Path) -> dict[str, bytes]:
    out = {}
    for sub in ("cache", "ipam", "state"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file() and path.name != "lock" and not path.parent.name == "locks":
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


def _first_boot(world: World) -> list[netns.Throwaway]:
    """Fill the range: four containers attached, a fifth whose ADD crashed before the cache
    write (a lease, elements and records nobody has in the cache), and a DEL that crashed."""
    namespaces = [world.make_netns("c") for _ in range(ADDRESSES + 1)]
    for i in range(ADDRESSES - 1):
        world.add(f"old-{i}", namespaces[i].path)
    code, _, err = world.run(
        "add", "old-crashed", namespaces[ADDRESSES - 1].path, failpoints="runtime.add.before-cache-write=kill"
    )
    assert code == -9, err
    code, _, err = world.run("del", "old-0", namespaces[0].path, failpoints="bridge.del.after-nft=kill")
    assert code == -9, err
    assert len(world.leases()) == ADDRESSES
    with pytest.raises(CNIError, match="no IP addresses available"):
        world.add("one-too-many", namespaces[ADDRESSES].path)
    return namespaces


@pytest.fixture
def rebooted(host_ns, make_netns, tmp_path, monkeypatch):
    """(world before, world after the reboot, the old namespaces' paths left as empty files)."""
    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "state"))
    conf = conflist(str(tmp_path / "ipam"), subnet=SUBNET)
    conf["cniVersion"] = "1.1.0"
    before = World(host_ns, make_netns, tmp_path, conf)
    old = _first_boot(before)
    # The reboot: every namespace is gone; where /run is not a tmpfs the files the named
    # namespaces were mounted on stay behind, empty (here for half of them).
    host_ns.__exit__(None, None, None)
    leftovers = []
    for i, ns in enumerate(old):
        ns.__exit__(None, None, None)
        if i % 2 == 0:
            Path(ns.path).touch()
            leftovers.append(ns.path)
    try:
        after = World(make_netns("host"), make_netns, tmp_path, conf)
        yield before, after, leftovers
    finally:
        for path in leftovers:
            os.unlink(path)


def test_reconcile_after_a_reboot(rebooted, tmp_path):
    _, world, _ = rebooted
    ns = world.make_netns("c")
    with pytest.raises(CNIError, match="no IP addresses available"):
        world.add("new-0", ns.path)  # the exhaustion a reboot leaves without GC

    before = _snapshot(tmp_path)
    dry = world.reconcile(dry_run=True)
    assert _snapshot(tmp_path) == before, "a dry run changes nothing"
    assert sorted(s.split(" ")[0] for s in dry.stale_attachments) == [f"old-{i}/eth0" for i in range(ADDRESSES - 1)]
    listed = "\n".join(dry.collected)
    assert "host-local lease" in listed and "old-crashed/eth0" in listed, dry
    assert "pycni state record" in listed, dry

    report = world.reconcile()
    assert report.errors == (), report
    assert world.leftovers() == {}, report
    assert os.listdir(tmp_path / "state" / "nft") == ["epoch"]

    _every_address_works_again(world, [ns])


def _every_address_works_again(world, namespaces=()):
    fresh = [*namespaces] + [world.make_netns("c") for _ in range(ADDRESSES - len(namespaces))]
    for i, ns in enumerate(fresh):
        world.works(f"new-{i}", ns)
    for i, ns in enumerate(fresh):
        world.delete(f"new-{i}", ns.path)
    assert world.leftovers() == {}


def _conf_dir(world, tmp_path):
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-crash.conflist").write_text(world.conflist_text)
    return conf_dir


def _gc_cli(world, conf_dir, *args: str) -> subprocess.CompletedProcess[str]:
    """``pycni gc NETWORK ARGS`` run inside the new host namespace, as an operator would."""
    argv = [sys.executable, "-m", "pycni.cli", "gc", world.network.name, *args, "--conf-dir", str(conf_dir)]
    argv += ["--cache-dir", str(world.cache_dir), "--backend", "inprocess"]
    proc = subprocess.run(
        ["nsenter", f"--net={world.host.path}", *argv],
        cwd=str(REPO),
        env=world.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_gc_after_a_reboot(rebooted, tmp_path):
    """``pycni gc NETWORK --all-stale`` (cnitool's GC: every cached attachment is stale) from the
    CLI, run inside the new host namespace, collects the same."""
    _, world, _ = rebooted
    _gc_cli(world, _conf_dir(world, tmp_path), "--all-stale")
    assert world.leftovers() == {}
    _every_address_works_again(world)


def test_cli_gc_reconcile_after_a_reboot(rebooted, tmp_path):
    _, world, _ = rebooted
    conf_dir = _conf_dir(world, tmp_path)

    def cli(*extra: str) -> dict:
        return json.loads(_gc_cli(world, conf_dir, "--reconcile", *extra).stdout)

    before = _snapshot(tmp_path)
    dry = cli("--dry-run")
    assert dry["dryRun"] and dry["staleAttachments"] and dry["collected"]
    assert _snapshot(tmp_path) == before
    report = cli()
    assert report["errors"] == []
    assert world.leftovers() == {}


def test_a_power_cut_that_left_the_state_records_empty_changes_nothing_for_the_runtime(rebooted, tmp_path):
    """State records are not fsync'd (pycni_plugins/kernel/state.py): after a power cut on a
    state dir that is not a tmpfs any of them may be empty, the nftables epoch too. They read as
    no record: the runtime's DELs of its cached attachments succeed, reconcile frees what the
    rest held, and every address works again."""
    _, world, leftovers = rebooted
    torn = [p for p in (tmp_path / "state").rglob("*") if p.is_file() and not p.name.startswith(".")]
    assert any(p.name == "epoch" for p in torn) and len(torn) > ADDRESSES
    for path in torn:
        path.write_bytes(b"")
    for i in range(1, ADDRESSES - 1):  # old-0's DEL crashed before the reboot: reconcile's
        world.delete(f"old-{i}", leftovers[i // 2] if i % 2 == 0 else "")
    report = world.reconcile()
    assert report.errors == (), report
    fresh = [world.make_netns("c") for _ in range(ADDRESSES)]
    for i, ns in enumerate(fresh):
        world.works(f"new-{i}", ns)
    for i, ns in enumerate(fresh):
        world.delete(f"new-{i}", ns.path)
    left = world.leftovers()
    # Whose a torn record was is unknown, so GC (which takes records by their network) leaves
    # those of the attachments no DEL ran for (old-0's, whose DEL crashed, and the crashed
    # ADD's): empty, read as none, taking nothing.
    assert set(left) <= {"records"}, left
    assert all(not (world.state_dir / r).read_bytes() for r in left.get("records", [])), left

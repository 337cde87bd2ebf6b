"""The runtime SIGKILLed while an exec'd plugin runs: a pycni plugin dies with it, a Go plugin
runs on but holds the container's lock, so the DEL recovering from the crash never races it,
and that DEL converges.

A failpoint with ``sleep`` holds the plugin mid-ADD, so the runtime is killed at a known point.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from pycni_plugins.install import install
from tests.faults.conftest import World
from tests.helpers.slow import scaled

pytestmark = pytest.mark.privileged
GO_PLUGINS = "/usr/lib/cni"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or between open and read
        return False


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _wait_for(world: World, name: str, timeout: float = 60) -> int:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        for point, pid in world.reached():
            if point == name:
                return pid
        time.sleep(0.02)
    raise AssertionError(f"failpoint {name} never reached")


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.02)
    return [p for p in pids if _alive(p)]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def installed(tmp_path):
    directory = tmp_path / "bin"
    install(str(directory))
    return str(directory)


def test_killed_runtime_takes_its_exec_d_pycni_plugin_along(world, installed):
    ns = world.make_netns("c")
    spec = {"backend": "exec", "path": [installed], "timeout": 120}
    runtime = world.spawn("add", "victim", ns.path, failpoints="bridge.add.after-veth=sleep:60", **spec)
    plugin = None
    try:
        plugin = _wait_for(world, "bridge.add.after-veth")
        assert _ppid(plugin) == runtime.pid, "the failpoint was reached in the exec'd plugin"
        runtime.kill()
        runtime.wait()
        assert _gone_within([plugin], 5) == [], "the exec'd plugin outlived the runtime that ran it"
    finally:
        runtime.kill()
        runtime.wait()
        if plugin:
            _kill([plugin])
    assert world.leftovers(ns)["veths"], "killed half-way: its veth is there"
    code, out, err = world.run("del", "victim", ns.path, **spec)
    assert code == 0, out + err
    assert world.leftovers(ns) == {}
    world.works("victim", ns)


def test_a_pycni_plugin_whose_runtime_died_during_its_start_up_changes_nothing(world, installed, tmp_path):
    # The bridge's start-up is held by a wrapper that execs it (same process) after a pause, so
    # the runtime is killed exactly while its plugin is starting.
    pidfile = tmp_path / "bridge.pid"
    real = os.path.join(installed, "bridge.real")
    os.rename(os.path.join(installed, "bridge"), real)
    wrapper = os.path.join(installed, "bridge")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\necho $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}\nsleep 1\nexec {real}\n")
    os.chmod(wrapper, 0o755)
    ns = world.make_netns("c")
    spec = {"backend": "exec", "path": [installed], "timeout": 120}
    runtime = world.spawn("add", "orphan", ns.path, **spec)
    plugin = None
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        plugin = int(pidfile.read_text())
        assert _ppid(plugin) == runtime.pid
        runtime.kill()
        runtime.wait()
        assert _gone_within([plugin], 30) == [], "the orphaned plugin never finished"
    finally:
        runtime.kill()
        runtime.wait()
        if plugin:
            _kill([plugin])
    # loopback ran (and recorded that it brought lo up) before the runtime died; the bridge must
    # have added nothing after it.
    left = world.leftovers(ns)
    assert {k: v for k, v in left.items() if k != "records"} == {}, "the orphaned bridge changed something"
    assert all(r.startswith("loopback/") for r in left.get("records", [])), left
    code, out, err = world.run("del", "orphan", ns.path, **spec)
    assert code == 0, out + err
    assert world.leftovers(ns) == {}


def _go_bridge_world(world: World, tmp_path) -> tuple[World, dict]:
    """The Go reference bridge, its IPAM a pycni-installed host-local (which can be held)."""
    ipam_dir = tmp_path / "ipam-bin"
    install(str(ipam_dir), ["host-local"])
    conf = {
        "cniVersion": "1.0.0",
        "name": "gonet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "gobr0",
                "isGateway": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "198.18.65.0/24"}]],
                    "dataDir": str(world.data_dir),
                },
            }
        ],
    }
    go = World(world.host, world.make_netns, world.root, conf)
    return go, {"backend": "exec", "path": [str(ipam_dir), GO_PLUGINS], "timeout": 120}


@pytest.mark.reference
def test_go_bridge_finishing_after_the_runtime_died_is_still_deleted(world, tmp_path):
    go, spec = _go_bridge_world(world, tmp_path)
    ns = go.make_netns("c")
    runtime = go.spawn("add", "victim", ns.path, failpoints="host-local.add.after-lease=sleep:1", **spec)
    held = []
    try:
        ipam = _wait_for(go, "host-local.add.after-lease")
        held = [ipam, _ppid(ipam)]  # host-local and the Go bridge that exec'd it
        runtime.kill()
        runtime.wait()
        assert _gone_within(held, 20) == []  # they finish the ADD on their own, unseen
    finally:
        runtime.kill()
        runtime.wait()
        _kill(held)
    left = go.leftovers(ns)
    assert left["veths"] and left["leases"] and "cache" not in left, left
    code, out, err = go.run("del", "victim", ns.path, **spec)
    assert code == 0 and json.loads(out)["ok"], out + err
    assert go.leftovers(ns) == {}


@pytest.mark.reference
def test_an_orphaned_go_plugin_holds_the_container_until_it_is_done(world, tmp_path):
    """A Go plugin cannot be told its runtime died (PR_SET_PDEATHSIG would cost a fork per exec),
    but it inherited the container's lock: the DEL recovering from the crash waits for the orphan
    instead of racing it, then converges."""
    go, spec = _go_bridge_world(world, tmp_path)
    ns = go.make_netns("c")
    runtime = go.spawn("add", "victim", ns.path, failpoints="host-local.add.after-lease=sleep:3", **spec)
    held = []
    try:
        ipam = _wait_for(go, "host-local.add.after-lease")
        held = [ipam, _ppid(ipam)]
        runtime.kill()
        runtime.wait()
        assert all(map(_alive, held)), "the orphans are still at work"
        start = time.monotonic()
        code, out, err = go.run("del", "victim", ns.path, **spec)
        waited = time.monotonic() - start
    finally:
        runtime.kill()
        runtime.wait()
        _kill(held)
    assert code == 0 and json.loads(out)["ok"], out + err
    assert waited > 1.5, f"DEL did not wait for the orphaned plugin ({waited:.2f}s)"
    assert not any(map(_alive, held))
    assert go.leftovers(ns) == {}

"""pycni on a firewalld host: a real firewalld 1.3 (Debian's) with its own D-Bus system bus in the
test's host network namespace and a private mount namespace (:mod:`.firewalld`).

firewalld rejects forwarded traffic of interfaces in no zone; the firewall plugin makes each
container's addresses sources of zone ``trusted`` over D-Bus (automatically, or with
``"backend": "firewalld"``), removes them on DEL, and ``gc --reconcile`` re-adds them after a
``firewall-cmd --reload``."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pycni import netns
from pycni.config import conflist_from_bytes
from pycni.errors import CNIError, ErrorCode
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf, build_request
from pycni.testing import probes
from pycni_plugins.firewall import FirewallPlugin
from pycni_plugins.kernel import firewalld as fwd
from tests.conftest import REQUIRE_PRIVILEGED
from tests.helpers.slow import scaled

from . import firewalld as daemon
from .conftest import HOST_UPLINK, OUTSIDE, World
from .profiles import FIREWALLD, FIREWALLDS, PLAIN

pytestmark = pytest.mark.privileged

ECHO_PORT = 7007
ON_FIREWALLD = pytest.mark.parametrize("profile", [FIREWALLD], ids=lambda p: p.name, indirect=True)


@pytest.fixture(autouse=True)
def _firewalld_installed() -> None:
    missing = daemon.missing()
    if missing:
        (pytest.fail if REQUIRE_PRIVILEGED else pytest.skip)(missing)


def _fw(world: World) -> daemon.Firewalld:
    fw: daemon.Firewalld = FIREWALLDS[world.host]
    return fw


def _sources(world: World, zone: str = "trusted") -> list[str]:
    with fwd.session(_fw(world).address) as bus:
        return sorted(bus.sources(zone))


def _with_backend(world: World, extra: dict[str, Any], version: str | None = None) -> Any:
    """The world's network with ``extra`` merged into its firewall plugin's config."""
    raw = json.loads(world.conflist)
    raw["cniVersion"] = version or raw["cniVersion"]
    for plugin in raw["plugins"]:
        if plugin["type"] == "firewall":
            plugin.update(extra)
    return conflist_from_bytes(json.dumps(raw).encode())


def _egress(world: World, rt: RuntimeConf) -> bool:
    ok = probes.tcp_echo(rt.netns, OUTSIDE, ECHO_PORT, timeout=1.5)
    assert probes.ping(rt.netns, OUTSIDE, timeout=1.5) == ok
    return ok


def _connectivity(world: World, runtime: Runtime, net: Any, tag: str, *, go: bool = False) -> None:
    """ADD two containers (one with host port 8080), CHECK, prove egress (TCP + ping,
    masqueraded), outside → host port, container ↔ container; zone sources present; DEL:
    sources gone and the host's ruleset as before. ``go``: the Go plugins, whose portmap fails
    its own CHECK here (``could not check ipv6 dnat``: an IPv4-only chain) and leaves its iptables chains, so
    neither CHECK nor the ruleset is compared."""
    before = world.profile.ruleset(world.host)
    assert _sources(world) == []
    ns1, ns2 = world.make_netns("c"), world.make_netns("c")
    rt1 = RuntimeConf(f"{tag}1", ns1.path, "eth0", capability_args={"portMappings": [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})  # fmt: skip
    rt2 = RuntimeConf(f"{tag}2", ns2.path, "eth0")
    ip1 = str(runtime.add_network_list(net, rt1).ips[0].address.ip)
    try:
        ip2 = str(runtime.add_network_list(net, rt2).ips[0].address.ip)
        try:
            assert _sources(world) == sorted([f"{ip1}/32", f"{ip2}/32"])
            if not go:
                runtime.check_network_list(net, rt1)  # the bridge's judge: this container gets out
            with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE) as server:
                assert _egress(world, rt1)
                assert server.peers == [HOST_UPLINK]  # masqueraded
            with probes.TCPEchoServer(rt1.netns, 80, host="0.0.0.0"):
                assert probes.tcp_echo(world.outside, HOST_UPLINK, 8080, timeout=1.5)
            with probes.TCPEchoServer(rt2.netns, ECHO_PORT, host="0.0.0.0"):
                assert probes.tcp_echo(rt1.netns, ip2, ECHO_PORT, timeout=1.5)
        finally:
            runtime.delete_network_list(net, rt2)
    finally:
        runtime.delete_network_list(net, rt1)
    assert _sources(world) == []
    if not go:
        assert _without_zone_chains(world.profile.ruleset(world.host)) == _without_zone_chains(before)


def _without_zone_chains(ruleset: str, zone: str = "trusted") -> str:
    """The ruleset without the (empty) chains firewalld makes when a zone first gets a source
    and keeps after the last one is removed: firewalld's own bookkeeping, as with the Go plugin."""
    kept: list[str] = []
    skipping = False
    for line in ruleset.splitlines():
        if line.startswith("\tchain ") and f"_{zone}" in line:
            skipping = True
        if not skipping and line.strip():
            kept.append(line)
        elif line == "\t}":
            skipping = False
    return "\n".join(kept)


@ON_FIREWALLD
def test_firewalld_rejects_containers_without_sources(world: World) -> None:
    """The host as it is: a bridge container whose addresses are in no zone cannot get out
    (pycni's own accepts do not overrule firewalld's reject)."""
    raw = json.loads(world.conflist)
    raw["plugins"] = [p for p in raw["plugins"] if p["type"] != "firewall"]
    bare = conflist_from_bytes(json.dumps(raw).encode())
    ns = world.make_netns("c")
    rt = RuntimeConf("bare", ns.path, "eth0")
    world.runtime.add_network_list(bare, rt)
    try:
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert not _egress(world, rt)
    finally:
        world.runtime.delete_network_list(bare, rt)


@ON_FIREWALLD
def test_in_process_sources_are_added_automatically(world: World) -> None:
    _connectivity(world, world.runtime, world.network, "auto")


@ON_FIREWALLD
def test_in_process_backend_firewalld(world: World) -> None:
    _connectivity(world, world.runtime, _with_backend(world, {"backend": "firewalld"}), "fwd")


@ON_FIREWALLD
def test_exec_d_shims_without_the_daemon(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed plugins, exec'd without the daemon, reach the same bus (the caller's
    ``DBUS_SYSTEM_BUS_ADDRESS``)."""
    from pycni_plugins.install import install

    monkeypatch.setenv("PYCNI_DAEMON", "off")
    bindir = tmp_path / "bin"
    install(str(bindir), ["loopback", "bridge", "host-local", "firewall", "portmap"])
    runtime = world.exec_runtime(str(bindir), str(tmp_path / "exec-cache"))
    _connectivity(world, runtime, world.network, "shim")
    _connectivity(world, runtime, _with_backend(world, {"backend": "firewalld"}), "shimfwd")


GO_PLUGINS = "/usr/lib/cni"


@ON_FIREWALLD
def test_the_go_plugins_backend_firewalld_side_by_side(world: World, tmp_path: Path) -> None:
    """The Go reference plugins (Debian's containernetworking-plugins), exec'd with the same
    network and ``"backend": "firewalld"``, find the same bus (``DBUS_SYSTEM_BUS_ADDRESS``) and
    pass the same traffic cases."""
    if not os.path.exists(f"{GO_PLUGINS}/firewall"):
        (pytest.fail if REQUIRE_PRIVILEGED else pytest.skip)("the Go reference plugins are not installed")
    runtime = world.exec_runtime(GO_PLUGINS, str(tmp_path / "go-cache"))
    _connectivity(world, runtime, _with_backend(world, {"backend": "firewalld"}), "go", go=True)


@ON_FIREWALLD
def test_exec_d_shims_through_the_daemon(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shims through ``pycni serve`` (``PYCNI_DAEMON=required``). The shim forwards only
    ``CNI_*``/``PYCNI_*``: the daemon's plugins use the daemon's system bus (its
    ``DBUS_SYSTEM_BUS_ADDRESS``, else ``/run/dbus/system_bus_socket`` in the mount namespace it
    shares with its callers), here firewalld's private one."""
    import tempfile

    from pycni_plugins.install import install
    from tests.serve.conftest import Daemon

    bindir = tmp_path / "bin"
    install(str(bindir), ["loopback", "bridge", "host-local", "firewall", "portmap"])
    sock_dir = tempfile.mkdtemp(prefix="pycni-serve-")
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": _fw(world).address}
    daemon = Daemon(world.host, f"{sock_dir}/pycni.sock", tmp_path / "serve.log", env, [])
    try:
        monkeypatch.setenv("PYCNI_SOCKET", daemon.socket)
        monkeypatch.setenv("PYCNI_DAEMON", "required")
        runtime = world.exec_runtime(str(bindir), str(tmp_path / "daemon-cache"))
        _connectivity(world, runtime, world.network, "served")
        assert any(line.startswith("firewall ADD served1 ") for line in daemon.requests(1)), daemon.log()
    finally:
        daemon.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _check_firewall(world: World, net: Any, rt: RuntimeConf) -> None:
    """The firewall plugin's CHECK alone (the bridge plugin's CHECK judges the whole subnet)."""
    conf = next(p for p in net.plugins if p.type == "firewall")
    cached = world.runtime.get_network_list_cached_result(net, rt)
    assert cached is not None
    config = {**conf.raw, "name": net.name, "cniVersion": net.cni_version, "prevResult": cached.to_json()}
    request = build_request("CHECK", config, rt, [], world.runtime.state_dir)
    netns.run_in(world.host, FirewallPlugin().check, request)


@ON_FIREWALLD
@pytest.mark.parametrize("backend", ["", "firewalld"])
def test_a_reload_loses_the_sources_and_reconcile_restores_them(world: World, backend: str) -> None:
    net = _with_backend(world, {"backend": backend} if backend else {})
    ns = world.make_netns("c")
    rt = RuntimeConf("reload", ns.path, "eth0")
    ip = str(world.runtime.add_network_list(net, rt).ips[0].address.ip)
    try:
        _check_firewall(world, net, rt)
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert _egress(world, rt)
            _fw(world).cmd("--reload")
            assert _sources(world) == []
            # TCP: a new connection (ping's conntrack entry of a moment ago stays established)
            assert not probes.tcp_echo(rt.netns, OUTSIDE, ECHO_PORT, timeout=1.5)
            with pytest.raises(CNIError) as check:
                _check_firewall(world, net, rt)
            assert check.value.msg == f"firewalld zone trusted lacks the source(s) {ip}/32 of this container"
            assert f"run `pycni gc {net.name} --reconcile` to restore" in check.value.details
            report = world.runtime.reconcile_network_list(net)
            assert f"firewall: restored firewalld zone trusted source {ip}/32 of reload/eth0" in report.collected
            assert report.errors == ()
            assert _sources(world) == [f"{ip}/32"]
            assert _egress(world, rt)
        _check_firewall(world, net, rt)
    finally:
        world.runtime.delete_network_list(net, rt)
    assert _sources(world) == []


@ON_FIREWALLD
def test_gc_removes_the_sources_of_dead_attachments(world: World) -> None:
    ns = world.make_netns("c")
    rt = RuntimeConf("dead", ns.path, "eth0")
    ip = str(world.runtime.add_network_list(world.network, rt).ips[0].address.ip)
    assert _sources(world) == [f"{ip}/32"]
    world.runtime.gc_network_list(world.network, [])
    assert _sources(world) == []
    world.runtime.delete_network_list(world.network, rt)


@pytest.fixture
def no_bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A system bus address where there is none (never the machine's own bus)."""
    address = f"unix:path={tmp_path}/no-bus/system_bus_socket"
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", address)
    yield address


@pytest.mark.parametrize("profile", [PLAIN], ids=lambda p: p.name, indirect=True)
def test_backend_firewalld_without_firewalld_is_a_clear_error(world: World, no_bus: str) -> None:
    net = _with_backend(world, {"backend": "firewalld"})
    ns = world.make_netns("c")
    rt = RuntimeConf("nofw", ns.path, "eth0")
    with pytest.raises(CNIError) as add:
        world.runtime.add_network_list(net, rt)
    assert add.value.msg.startswith(
        f"failed to add the container's addresses to firewalld (system bus {no_bus}) zone trusted: "
        f"cannot connect to the system bus at {no_bus}"
    ), add.value.msg
    world.runtime.delete_network_list(net, rt)
    with pytest.raises(CNIError) as status:
        world.runtime.get_status_network_list(_with_backend(world, {"backend": "firewalld"}, "1.1.0"))
    assert (status.value.code, status.value.msg) == (ErrorCode.PLUGIN_NOT_AVAILABLE, "firewalld is not available")
    assert status.value.plugin == "firewall"


@pytest.mark.parametrize("profile", [PLAIN], ids=lambda p: p.name, indirect=True)
def test_no_firewalld_needs_no_bus(world: World, no_bus: str) -> None:
    """Without firewalld's table nothing asks the bus: ADD, CHECK, DEL as ever."""
    ns = world.make_netns("c")
    rt = RuntimeConf("plain", ns.path, "eth0")
    world.runtime.add_network_list(world.network, rt)
    world.runtime.check_network_list(world.network, rt)
    world.runtime.delete_network_list(world.network, rt)
    assert not os.path.exists(no_bus.removeprefix("unix:path="))


@ON_FIREWALLD
def test_a_watcher_of_the_reloaded_signal_restores_within_a_second(world: World) -> None:
    """What the daemon runs (:func:`pycni_plugins.firewalld_zone.heal_on_reload`): a reload's
    ``Reloaded`` signal puts the recorded sources back, well within 1 s."""
    import threading
    import time

    from pycni_plugins import firewalld_zone

    ns = world.make_netns("c")
    rt = RuntimeConf("watched", ns.path, "eth0")
    ip = str(world.runtime.add_network_list(world.network, rt).ips[0].address.ip)
    stop, lines = threading.Event(), []
    watcher = threading.Thread(
        target=firewalld_zone.heal_on_reload, args=(world.runtime.state_dir, stop, lines.append), daemon=True
    )
    watcher.start()
    try:
        time.sleep(0.3)  # subscribed (its first restore found nothing to do)
        assert lines == []
        _fw(world).cmd("--reload")  # returns once firewalld has reloaded
        reloaded = time.monotonic()
        while _sources(world) != [f"{ip}/32"]:
            assert time.monotonic() - reloaded < scaled(1.0), "not restored within 1 s"
            time.sleep(0.02)
        assert len(lines) == 1, lines  # one line per heal: what, and how long after the signal
        assert re.fullmatch(
            rf"restored firewalld zone trusted source {re.escape(ip)}/32 of watched/eth0 "
            r"\([0-9.]+ ms after firewalld's Reloaded signal\)",
            lines[0],
        ), lines
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert _egress(world, rt)
    finally:
        stop.set()
        watcher.join(timeout=5)
        world.runtime.delete_network_list(world.network, rt)
    assert not watcher.is_alive()
    assert _sources(world) == []

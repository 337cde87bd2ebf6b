"""pycni on hosts that already filter: what the judge finds, what CHECK/STATUS say, what traffic
really does, and that pycni changes nothing of the host's own ruleset."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from pycni import netns
from pycni.errors import CNIError, ErrorCode
from pycni.runtime_conf import RuntimeConf
from pycni.testing import probes
from pycni_plugins import nomad
from pycni_plugins.kernel import hostfw
from tests.helpers import kernel

from .conftest import BRIDGE, HOST_UPLINK, OUTSIDE, SUBNET, World
from .profiles import HARDENED_INET, PLAIN, legacy_loaded, nft

pytestmark = pytest.mark.privileged

TARGET = hostfw.Target(BRIDGE, (ipaddress.ip_network(SUBNET),))
ECHO_PORT = 7007


def _inspect(world: World, target: hostfw.Target = TARGET) -> list[hostfw.Finding]:
    return netns.run_in(world.host, hostfw.inspect, target)


def test_the_judge_names_the_dropping_chain(world: World) -> None:
    found = _inspect(world)
    if world.profile.drop_where is None:
        assert found == []
        return
    egress = next(f for f in found if f.flow == "egress")
    assert egress.certain
    assert egress.message == f"{world.profile.drop_where} drops forwarded traffic from {SUBNET} on bridge {BRIDGE}"


def test_the_legacy_tables_are_read_only_where_loaded(world: World) -> None:
    loaded = bool(legacy_loaded(world.host))
    _inspect(world)
    assert bool(legacy_loaded(world.host)) == loaded  # listing loaded no table
    assert loaded == (world.profile.name == "docker-legacy")


def test_add_succeeds_check_and_status_report_and_the_ruleset_is_untouched(world: World) -> None:
    """On the hosts pycni's iptables step answers (Docker's), CHECK and STATUS pass once Nomad's
    admin rule is there (as the Go plugins' host ports need it); elsewhere they name the drop.
    After DEL the host's ruleset is what it was (the iptables step's chain and jump gone too)."""
    before = world.profile.ruleset(world.host)
    if world.profile.compat:
        netns.run_in(world.host, nomad.ensure_forwarding_rules, "NOMAD-ADMIN", BRIDGE, SUBNET)
    rt, _ = world.container("c1", [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
    where = world.profile.drop_where
    if where is None or world.profile.compat:
        world.runtime.check_network_list(world.network, rt)
        world.runtime.get_status_network_list(world.network_at("1.1.0"))
    else:
        with pytest.raises(CNIError) as check:
            world.runtime.check_network_list(world.network, rt)
        assert check.value.code == ErrorCode.INTERNAL
        assert check.value.msg == f"{where} drops forwarded traffic from {SUBNET} on bridge {BRIDGE}"
        assert "let it through" in check.value.details
        with pytest.raises(CNIError) as status:
            world.runtime.get_status_network_list(world.network_at("1.1.0"))
        assert status.value.code == ErrorCode.LIMITED_CONNECTIVITY
        assert where in status.value.msg
    world.runtime.delete_network_list(world.network, rt)
    assert world.profile.ruleset(world.host) == before
    left = {name for name, link in kernel.links(world.host).items() if link["kind"] == "veth"}
    assert left == {"uplink0"}


@pytest.mark.parametrize("profile", [PLAIN, HARDENED_INET], ids=lambda p: p.name, indirect=True)
def test_repeated_checks_reuse_the_inspection(world: World) -> None:

    def twice() -> bool:
        from pycni_plugins.kernel.nft import transport

        hostfw.filters()
        first = transport.memo().host_filters
        hostfw.filters()
        return first is not None and transport.memo().host_filters is first

    assert netns.run_in(world.host, twice)


def test_traffic_is_what_the_judge_says(world: World) -> None:
    rt1, ip1 = world.container("c1")
    rt2, ip2 = world.container("c2")
    try:
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE) as outside_server:
            egress = probes.tcp_echo(rt1.netns, OUTSIDE, ECHO_PORT, timeout=1.5)
            assert egress == (not world.profile.drops_egress or world.profile.compat)
            assert probes.ping(rt1.netns, OUTSIDE, timeout=1.5) == egress
            if egress:
                assert outside_server.peers == ["198.19.0.1"]  # masqueraded
        with probes.TCPEchoServer(rt2.netns, ECHO_PORT, host="0.0.0.0"):
            between = probes.tcp_echo(rt1.netns, ip2, ECHO_PORT, timeout=1.5)
        bridged = any(f.flow == "bridged" and f.certain for f in _inspect(world))
        assert between == (not bridged)
    finally:
        world.runtime.delete_network_list(world.network, rt2)
        world.runtime.delete_network_list(world.network, rt1)


def test_host_ports_are_reachable_where_the_judge_finds_no_inbound_drop(world: World) -> None:
    rt, _ = world.container("c1", [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
    try:
        target = hostfw.Target(BRIDGE, (ipaddress.ip_network(SUBNET),), ("8080/tcp",))
        inbound = netns.run_in(world.host, hostfw.inspect, target, ("inbound",))
        assert [f.flow for f in inbound] == ([] if world.profile.drop_where is None else ["inbound"])
        with probes.TCPEchoServer(rt.netns, 80, host="0.0.0.0"):
            reached = probes.tcp_echo(world.outside, HOST_UPLINK, 8080, timeout=1.5)
        assert reached == (not inbound)
    finally:
        world.runtime.delete_network_list(world.network, rt)


@pytest.mark.parametrize("daemon", [False, True], ids=["no-daemon", "daemon"])
@pytest.mark.parametrize("profile", [HARDENED_INET], ids=lambda p: p.name, indirect=True)
def test_shims_report_what_in_process_reports(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemon: bool
) -> None:
    """The installed plugins, exec'd without the daemon or served by ``pycni serve`` (acting in
    the namespaces the shims pass), read the host's filters in the host namespace they were
    exec'd in: ADD succeeds, CHECK names the admin's drop."""
    import shutil
    import signal
    import tempfile

    from pycni_plugins.install import install
    from tests.serve.conftest import Daemon

    types = ["loopback", "bridge", "host-local", "firewall", "portmap"]
    bindir = tmp_path / "bin"
    served: Daemon | None = None
    sock_dir = tempfile.mkdtemp(prefix="pycni-serve-")
    if daemon:
        sock = os.path.join(sock_dir, "s.sock")
        install(str(bindir), types, socket=sock)
        served = Daemon(world.host, sock, tmp_path / "serve.log", dict(os.environ), [])
        monkeypatch.setenv("PYCNI_DAEMON", "required")
    else:
        install(str(bindir), types)
        monkeypatch.setenv("PYCNI_DAEMON", "off")
    runtime = world.exec_runtime(str(bindir), str(tmp_path / "exec-cache"))
    ns = world.make_netns("c")
    rt = RuntimeConf("x1", ns.path, "eth0")
    try:
        runtime.add_network_list(world.network, rt)
        try:
            with pytest.raises(CNIError) as check:
                runtime.check_network_list(world.network, rt)
            assert check.value.code == ErrorCode.INTERNAL
            expected = f"{world.profile.drop_where} drops forwarded traffic from {SUBNET} on bridge {BRIDGE}"
            assert check.value.msg == expected
        finally:
            runtime.delete_network_list(world.network, rt)
        if served is not None:
            assert any(" CHECK " in line for line in served.requests(1)), served.log()
    finally:
        if served is not None:
            served.stop(signal.SIGTERM)
        shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.mark.parametrize("profile", [PLAIN], ids=lambda p: p.name, indirect=True)
def test_a_chain_the_judge_cannot_read_may_drop_but_fails_no_check_or_status(world: World) -> None:
    """A verdict map before a drop policy: the judge cannot tell, so it names the rule as "may
    drop" and CHECK and STATUS still pass (the traffic does pass here)."""
    nft(world.host, UNREADABLE.format(bridge=BRIDGE))
    try:
        rt, _ = world.container("c1")
        egress = next(f for f in _inspect(world) if f.flow == "egress")
        assert not egress.certain and egress.message.startswith("table inet filter chain forward")
        assert "may drop" in egress.message
        world.runtime.check_network_list(world.network, rt)
        world.runtime.get_status_network_list(world.network_at("1.1.0"))
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert probes.tcp_echo(rt.netns, OUTSIDE, ECHO_PORT, timeout=1.5)
        world.runtime.delete_network_list(world.network, rt)
    finally:
        nft(world.host, "delete table inet filter")


UNREADABLE = """\
table inet filter {{
    chain forward {{
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
        iifname vmap {{ "{bridge}" : accept }}
    }}
}}
"""


def test_status_before_the_first_add_names_only_drops_the_firewall_plugin_cannot_answer(world: World) -> None:
    """STATUS gates an orchestrator's first container: a drop in iptables' FORWARD (Docker's) is
    answered by the firewall plugin's ADD, so it fails no STATUS; an admin's nftables table is not."""
    status = world.network_at("1.1.0")
    if world.profile.drop_where is None or world.profile.compat:
        world.runtime.get_status_network_list(status)
        return
    with pytest.raises(CNIError) as e:
        world.runtime.get_status_network_list(status)
    assert e.value.code == ErrorCode.LIMITED_CONNECTIVITY and world.profile.drop_where in e.value.msg

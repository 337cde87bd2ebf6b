"""The iptables compatibility step (issue 20, point 2): on Docker hosts (iptables-nft and legacy)
pycni's containers reach the outside, are reached on their host ports and reach each other, with
pycni's accepts in the host's own iptables flavour; nothing of it is left after the last DEL or
a GC; ``"iptablesCompat": "always"`` forces it (``"backend": "iptables"``, which Nomad always
writes, does not); a plain host runs no iptables tool."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pycni import netns
from pycni.config import conflist_from_bytes
from pycni.errors import CNIError
from pycni.runtime import Runtime
from pycni.sdk import GCAttachment
from pycni.testing import probes
from pycni_plugins import nomad
from pycni_plugins.kernel import iptables

from .conftest import BRIDGE, HOST_UPLINK, OUTSIDE, SUBNET, World
from .profiles import DOCKER_LEGACY, DOCKER_NFT, PLAIN, in_ns, nft

pytestmark = pytest.mark.privileged

ECHO_PORT = 7007
DOCKER = [DOCKER_NFT, DOCKER_LEGACY]


def _flavour(world: World) -> str:
    return "legacy" if world.profile is DOCKER_LEGACY else "nft"


def _save(world: World, flavour: str | None = None) -> tuple[str, str]:
    """``iptables-<flavour>-save -t filter`` in the host namespace: (stdout without the dated
    comments and counters, stderr)."""
    tool = f"iptables-{flavour or _flavour(world)}-save"
    done = subprocess.run(
        ["nsenter", f"--net={world.host}", tool, "-t", "filter"], capture_output=True, text=True, timeout=30, check=True
    )
    lines = [re.sub(r"\[\d+:\d+\]", "", ln) for ln in done.stdout.splitlines() if not ln.startswith("#")]
    return "\n".join(lines), done.stderr


def _admin_rule(world: World) -> None:
    """What Nomad's bridge configurator does before every setup (``ensureForwardingRules``)."""
    netns.run_in(world.host, nomad.ensure_forwarding_rules, "NOMAD-ADMIN", BRIDGE, SUBNET)


def _pycni_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "PYCNI" in ln]


@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
def test_docker_hosts_get_egress_host_ports_and_container_to_container(world: World) -> None:
    before = world.profile.ruleset(world.host)
    _admin_rule(world)
    rt1, ip1 = world.container("c1", [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
    rt2, ip2 = world.container("c2")
    try:
        save, warnings = _save(world)
        assert warnings == ""
        assert '-A FORWARD -m comment --comment "pycni forward" -j PYCNI-FORWARD' in save
        assert save.index("-j PYCNI-FORWARD") < save.index("-j DOCKER-USER")  # at the top of FORWARD
        ours = [ln for ln in save.splitlines() if ln.startswith("-A PYCNI-FORWARD")]
        assert (
            f'-A PYCNI-FORWARD -d {SUBNET} -o {BRIDGE} -m comment --comment "pycni admin NOMAD-ADMIN" -j ACCEPT' in ours
        )
        for ip in (ip1, ip2):
            assert any(f"-s {ip}/32 " in ln for ln in ours)
            assert any(f"-d {ip}/32 -m conntrack --ctstate RELATED,ESTABLISHED" in ln for ln in ours)
        assert len(ours) == 5
        # The host's own rules are unchanged but for pycni's jump and chain.
        now = world.profile.ruleset(world.host)
        assert _without_pycni(now) == _without_pycni(before)
        world.runtime.check_network_list(world.network, rt1)

        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE) as server:
            assert probes.tcp_echo(rt1.netns, OUTSIDE, ECHO_PORT, timeout=2)
            assert server.peers == [HOST_UPLINK]  # masqueraded
        assert probes.ping(rt1.netns, OUTSIDE, timeout=2)
        with probes.TCPEchoServer(rt1.netns, 80, host="0.0.0.0"):
            assert probes.tcp_echo(world.outside, HOST_UPLINK, 8080, timeout=2)  # DNAT'd host port
        with probes.TCPEchoServer(rt2.netns, ECHO_PORT, host="0.0.0.0"):
            assert probes.tcp_echo(rt1.netns, ip2, ECHO_PORT, timeout=2)
        with probes.TCPEchoServer(rt1.netns, ECHO_PORT, host="0.0.0.0"):
            assert probes.tcp_echo(rt2.netns, ip1, ECHO_PORT, timeout=2)

        world.runtime.delete_network_list(world.network, rt2)
        ours = [ln for ln in _save(world)[0].splitlines() if ln.startswith("-A PYCNI-FORWARD")]
        assert len(ours) == 3 and not any(ip2 + "/32" in ln for ln in ours)
    finally:
        world.runtime.delete_network_list(world.network, rt2)
        world.runtime.delete_network_list(world.network, rt1)
    after, warnings = _save(world)
    assert _pycni_lines(after) == [] and warnings == ""
    assert world.profile.ruleset(world.host) == before
    assert os.listdir(Path(world.runtime.state_dir) / "iptables") == [".lock"]


def _without_pycni(ruleset: str) -> str:
    """A ruleset without pycni's iptables chain and jump (nft listing or legacy save)."""
    out: list[str] = []
    skip = False
    for line in ruleset.splitlines():
        s = line.strip()
        if s.startswith("chain PYCNI-FORWARD"):
            skip = True
        if s and not skip and "PYCNI-FORWARD" not in s and '"pycni forward"' not in s:
            out.append(line)
        if skip and s == "}":
            skip = False
    return "\n".join(out)


def _other_runtime(world: World, tmp_path: Path) -> Runtime:
    """A runtime with its own cache and the world's state dir: what it ADDs, the world's
    runtime does not remember (as after a crash before the cache write)."""
    return Runtime(
        [],
        cache_dir=str(tmp_path / "other-cache"),
        state_dir=world.runtime.state_dir,
        backend="inprocess",
        host_netns=world.host,
    )


@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
def test_gc_removes_a_dead_attachments_rules_and_reconcile_puts_lost_ones_back(world: World, tmp_path: Path) -> None:
    before = world.profile.ruleset(world.host)
    net = world.network_at("1.1.0")
    rt1, ip1 = world.container("c1")
    main, world.runtime = world.runtime, _other_runtime(world, tmp_path)
    rt2, ip2 = world.container("c2")
    world.runtime = main
    try:
        # c2 is unknown to the runtime: the plugins' GC with only c1 valid takes its rules.
        report = world.runtime.reconcile_network_list(net)
        assert any("iptables rules of c2/eth0" in r for r in report.collected), report
        ours = [ln for ln in _save(world)[0].splitlines() if ln.startswith("-A PYCNI-FORWARD")]
        assert any(ip1 + "/32" in ln for ln in ours) and not any(ip2 + "/32" in ln for ln in ours)
        # A lost rule of a valid attachment: CHECK names it, GC puts it back.
        tool = f"iptables-{_flavour(world)}"
        line = next(ln for ln in ours if f"-s {ip1}/32" in ln)
        in_ns(world.host, "sh", "-c", f"{tool} -w -D {line[3:]}")
        with pytest.raises(CNIError, match="expected iptables rule not found|drops forwarded traffic"):
            world.runtime.check_network_list(world.network, rt1)
        world.runtime.reconcile_network_list(net)  # `pycni gc --reconcile`
        world.runtime.check_network_list(world.network, rt1)
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert probes.tcp_echo(rt1.netns, OUTSIDE, ECHO_PORT, timeout=2)
    finally:
        world.runtime.delete_network_list(world.network, rt1)
        world.runtime.delete_network_list(world.network, rt2)
    assert _pycni_lines(_save(world)[0]) == []
    assert world.profile.ruleset(world.host) == before


@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
def test_gc_of_the_last_attachment_removes_the_chain(world: World, tmp_path: Path) -> None:
    before = world.profile.ruleset(world.host)
    main, world.runtime = world.runtime, _other_runtime(world, tmp_path)
    world.container("c1")
    main.gc_network_list(world.network_at("1.1.0"), [])
    assert _pycni_lines(_save(world)[0]) == []
    assert world.profile.ruleset(world.host) == before


def _forced(world: World) -> Any:
    conf = json.loads(world.conflist)
    for plugin in conf["plugins"]:
        if plugin["type"] == "firewall":
            plugin["iptablesCompat"] = "always"
    return conflist_from_bytes(json.dumps(conf).encode())


@pytest.mark.parametrize("profile", [PLAIN], ids=lambda p: p.name, indirect=True)
def test_iptables_compat_always_forces_the_step_on_a_plain_host(world: World) -> None:
    before = world.profile.ruleset(world.host)
    network = _forced(world)
    _admin_rule(world)
    world.network = network
    rt1, ip1 = world.container("c1", [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
    try:
        save, warnings = _save(world, "nft")
        assert warnings == ""
        assert any(f"-A PYCNI-FORWARD -s {ip1}/32" in ln for ln in save.splitlines())
        world.runtime.check_network_list(network, rt1)
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert probes.tcp_echo(rt1.netns, OUTSIDE, ECHO_PORT, timeout=2)
        with probes.TCPEchoServer(rt1.netns, 80, host="0.0.0.0"):
            assert probes.tcp_echo(world.outside, HOST_UPLINK, 8080, timeout=2)
    finally:
        world.runtime.delete_network_list(network, rt1)
    assert world.profile.ruleset(world.host) == before  # even iptables-nft's table is gone


def _spy_on_processes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The argv of every process the test's own process starts from now on."""
    import subprocess as sp

    ran: list[Any] = []
    real = sp.Popen.__init__

    def spy(self: Any, args: Any, *a: Any, **kw: Any) -> None:
        ran.append(args)
        real(self, args, *a, **kw)

    monkeypatch.setattr(sp.Popen, "__init__", spy)
    return ran


@pytest.mark.parametrize("profile", [PLAIN], ids=lambda p: p.name, indirect=True)
def test_a_plain_host_runs_no_iptables_tool(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _spy_on_processes(monkeypatch)
    _admin_rule(world)
    rt, _ = world.container("c1", [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
    world.runtime.check_network_list(world.network, rt)
    world.runtime.gc_network_list(world.network_at("1.1.0"), [GCAttachment("c1", "eth0")])
    world.runtime.delete_network_list(world.network, rt)
    assert ran == [], ran
    assert not (Path(world.runtime.state_dir) / "iptables").exists()


@pytest.mark.parametrize("profile", [PLAIN], ids=lambda p: p.name, indirect=True)
def test_an_admins_own_ip_filter_table_is_never_written(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """An nftables ``table ip filter`` that iptables did not write (no ``FORWARD`` chain) is an
    admin's: its drop is named by CHECK, as on any hardened host, and nothing is written to it
    (no iptables tool runs at all)."""
    nft(world.host, ADMINS_IP_FILTER)
    before = world.profile.ruleset(world.host)
    ran = _spy_on_processes(monkeypatch)
    rt, _ = world.container("c1")
    with pytest.raises(CNIError, match="table ip filter chain forward"):
        world.runtime.check_network_list(world.network, rt)
    world.runtime.gc_network_list(world.network_at("1.1.0"), [GCAttachment("c1", "eth0")])
    world.runtime.delete_network_list(world.network, rt)
    assert ran == [], ran
    assert world.profile.ruleset(world.host) == before
    nft(world.host, "delete table ip filter")


ADMINS_IP_FILTER = """\
table ip filter {
    chain forward {
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
    }
}
"""


@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
@pytest.mark.parametrize("daemon", [False, True], ids=["no-daemon", "daemon"])
def test_shims_take_the_same_step(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemon: bool) -> None:
    """The installed plugins, exec'd without the daemon or served by ``pycni serve`` (running in
    the host namespace; it acts in the namespaces the shims pass), run the host's iptables tools
    in the host namespace they were exec'd in."""
    import shutil
    import signal
    import tempfile

    from pycni_plugins.install import install
    from tests.serve.conftest import Daemon

    bindir = tmp_path / "bin"
    served: Daemon | None = None
    if daemon:
        sock_dir = tempfile.mkdtemp(prefix="pycni-serve-")
        sock = os.path.join(sock_dir, "s.sock")
        install(str(bindir), ["loopback", "bridge", "host-local", "firewall", "portmap"], socket=sock)
        served = Daemon(world.host, sock, tmp_path / "serve.log", dict(os.environ), [])
        monkeypatch.setenv("PYCNI_DAEMON", "required")
    else:
        sock_dir = ""
        install(str(bindir), ["loopback", "bridge", "host-local", "firewall", "portmap"])
        monkeypatch.setenv("PYCNI_DAEMON", "off")
    try:
        _shims_run(world, tmp_path, bindir)
        if served is not None:
            lines = served.requests(12)
            assert len(lines) >= 12 and all(" ok " in ln for ln in lines), served.log()
    finally:
        if served is not None:
            served.stop(signal.SIGTERM)
            shutil.rmtree(sock_dir, ignore_errors=True)


def _shims_run(world: World, tmp_path: Path, bindir: Path) -> None:
    runtime = world.exec_runtime(str(bindir), str(tmp_path / "exec-cache"))
    before = world.profile.ruleset(world.host)
    world.runtime = runtime
    rt, ip = world.container("x1")
    try:
        assert any(f"-s {ip}/32" in ln for ln in _save(world)[0].splitlines())
        runtime.check_network_list(world.network, rt)
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert probes.tcp_echo(rt.netns, OUTSIDE, ECHO_PORT, timeout=2)
    finally:
        runtime.delete_network_list(world.network, rt)
    assert world.profile.ruleset(world.host) == before


def test_parse_admin_rules_of_pycnis_admin_chain() -> None:
    objs: list[dict[str, Any]] = [
        {
            "rule": {
                "expr": [
                    {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "nomad"}},
                    {
                        "match": {
                            "op": "==",
                            "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                            "right": {"prefix": {"addr": "198.18.64.0", "len": 20}},
                        }
                    },
                    {"counter": {"name": "x"}},
                    {"accept": None},
                ]
            }
        },
        {
            "rule": {
                "expr": [
                    {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "nomad"}},
                    {"drop": None},
                ]
            }
        },
    ]
    import ipaddress

    assert iptables.admin_rules(objs, "nomad") == [("nomad", ipaddress.ip_network("198.18.64.0/20"))]
    assert iptables.admin_rules(objs, "other") == []


@pytest.mark.reference
@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
@pytest.mark.parametrize("impl", ["go", "pycni"])
def test_side_by_side_with_the_go_plugins(
    world: World, tmp_path: Path, impl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Go chain (exec'd from /usr/lib/cni, with Nomad's admin rule in iptables as Nomad
    writes it for them) and pycni's (in-process, Nomad's admin rule through the hook) on the
    same Docker host: the same three flows pass. The Go plugins run ``iptables`` from ``PATH``:
    on the legacy host it is iptables-legacy, as ``update-alternatives`` makes it there."""
    from tests.conftest import REFERENCE_PLUGIN_DIR

    flavour = _flavour(world)
    if impl == "go":
        if not os.path.exists(f"{REFERENCE_PLUGIN_DIR}/firewall"):
            pytest.skip("no reference plugins")
        alternatives = tmp_path / "alternatives"
        alternatives.mkdir()
        for tool in ("iptables", "ip6tables"):
            for suffix in ("", "-save", "-restore"):
                (alternatives / f"{tool}{suffix}").symlink_to(f"/usr/sbin/{tool}-{flavour}{suffix}")
        monkeypatch.setenv("PATH", f"{alternatives}:{os.environ.get('PATH', '')}")
        world.runtime = world.exec_runtime(REFERENCE_PLUGIN_DIR, str(tmp_path / "go-cache"))
        in_ns(world.host, f"iptables-{flavour}", "-w", "-N", "NOMAD-ADMIN")
        in_ns(world.host, f"iptables-{flavour}", "-w", "-A", "NOMAD-ADMIN", "-o", BRIDGE, "-d", SUBNET, "-j", "ACCEPT")
    else:
        _admin_rule(world)
    rt1, ip1 = world.container("c1", [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
    rt2, ip2 = world.container("c2")
    try:
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE) as server:
            assert probes.tcp_echo(rt1.netns, OUTSIDE, ECHO_PORT, timeout=2)
            assert server.peers == [HOST_UPLINK]
        assert probes.ping(rt1.netns, OUTSIDE, timeout=2)
        with probes.TCPEchoServer(rt1.netns, 80, host="0.0.0.0"):
            assert probes.tcp_echo(world.outside, HOST_UPLINK, 8080, timeout=2)
        with probes.TCPEchoServer(rt2.netns, ECHO_PORT, host="0.0.0.0"):
            assert probes.tcp_echo(rt1.netns, ip2, ECHO_PORT, timeout=2)
        save, warnings = _save(world)
        assert warnings == ""
        chain = "CNI-FORWARD" if impl == "go" else "PYCNI-FORWARD"
        assert save.splitlines().index(f":{chain} - ") >= 0
        assert next(ln for ln in save.splitlines() if ln.startswith("-A FORWARD")).endswith(f"-j {chain}")
    finally:
        world.runtime.delete_network_list(world.network, rt2)
        world.runtime.delete_network_list(world.network, rt1)


@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
def test_a_chain_made_meanwhile_is_neither_flushed_nor_doubled(world: World) -> None:
    """Another writer (a runtime with another state dir, so another lock) made the chain after
    this one read the table: the batch fails on ``-N``, changing nothing, and is rebuilt."""
    import ipaddress

    flavour = _flavour(world)
    place = iptables.Place(4, flavour)
    first = iptables.attachment_rules([ipaddress.ip_network("198.18.64.2/32")], "k1 firewall n c1 eth0")
    second = iptables.attachment_rules([ipaddress.ip_network("198.18.64.3/32")], "k2 firewall n c2 eth0")
    stale = netns.run_in(world.host, iptables.look, place)
    netns.run_in(world.host, iptables.apply, place, first)
    netns.run_in(world.host, iptables.apply, place, second, stale)
    save = _save(world)[0].splitlines()
    assert len([ln for ln in save if ln.startswith("-A PYCNI-FORWARD")]) == 4
    assert len([ln for ln in save if ln.endswith("-j PYCNI-FORWARD")]) == 1
    netns.run_in(world.host, iptables.remove, place, lambda c: True)
    assert _pycni_lines(_save(world)[0]) == []


SUBNET6 = "fd00:18:64::/64"


@pytest.mark.parametrize("profile", [DOCKER_NFT], ids=lambda p: p.name, indirect=True)
def test_ipv6_where_ip6tables_forward_drops(world: World, tmp_path: Path) -> None:
    """Dual stack on a Docker host whose ip6tables ``FORWARD`` drops too: the IPv6 accepts go to
    ``ip6tables`` (same flavour), so containers reach each other over IPv6 (br_netfilter puts
    bridged IPv6 through ip6tables), and the last DEL takes them."""
    from pycni.nomad.conflist import NomadBridgeConfig, bridge_conflist

    before = world.profile.ruleset(world.host)
    in_ns(world.host, "ip6tables-nft", "-w", "-P", "FORWARD", "DROP")
    before6 = _save6(world)
    raw = bridge_conflist(NomadBridgeConfig(BRIDGE, SUBNET, SUBNET6, ipam_data_dir=str(tmp_path / "ipam6")))
    world.network = conflist_from_bytes(raw)
    rt1, _ = world.container("c1")
    rt2, _ = world.container("c2")
    try:
        got = world.runtime.get_network_list_cached_result(world.network, rt2)
        ip6 = next(str(ip.address.ip) for ip in got.ips if ip.address.version == 6)
        with probes.TCPEchoServer(rt2.netns, ECHO_PORT, host="::"):
            assert probes.tcp_echo(rt1.netns, ip6, ECHO_PORT, timeout=4)
        save6 = _save6(world)
        assert any(ln.startswith(f"-A PYCNI-FORWARD -s {ip6}/128") for ln in save6.splitlines())
    finally:
        world.runtime.delete_network_list(world.network, rt2)
        world.runtime.delete_network_list(world.network, rt1)
    assert _save6(world) == before6
    in_ns(world.host, "ip6tables-nft", "-w", "-P", "FORWARD", "ACCEPT")
    assert _without_ip6(world.profile.ruleset(world.host)) == _without_ip6(before)


def _save6(world: World) -> str:
    out = in_ns(world.host, "ip6tables-nft-save", "-t", "filter")
    return "\n".join(re.sub(r"\[\d+:\d+\]", "", ln) for ln in out.splitlines() if not ln.startswith("#"))


def _without_ip6(ruleset: str) -> str:
    """The ruleset without ``table ip6 filter`` (ip6tables-nft's, made by the test's policy)."""
    out, skip = [], False
    for line in ruleset.splitlines():
        if line.startswith("table ip6 filter"):
            skip = True
        if not skip:
            out.append(line)
        if skip and line == "}":
            skip = False
    return "\n".join(out)


@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
def test_after_a_docker_restart_check_says_what_is_missing_and_reconcile_restores_it(world: World) -> None:
    """dockerd's restart reloads its ruleset (``iptables-restore`` without ``--noflush``: pycni's
    chain and jump are gone); CHECK fails naming it, ``pycni gc --reconcile`` puts it back."""
    from .profiles import DOCKER_20_10

    before = world.profile.ruleset(world.host)
    rt, _ = world.container("c1")
    try:
        in_ns(world.host, f"iptables-{_flavour(world)}-restore", "-w", stdin=DOCKER_20_10)
        assert _pycni_lines(_save(world)[0]) == []
        with pytest.raises(CNIError, match="drops forwarded traffic|expected iptables rule not found"):
            world.runtime.check_network_list(world.network, rt)
        world.runtime.reconcile_network_list(world.network_at("1.1.0"))
        world.runtime.check_network_list(world.network, rt)
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert probes.tcp_echo(rt.netns, OUTSIDE, ECHO_PORT, timeout=2)
    finally:
        world.runtime.delete_network_list(world.network, rt)
    assert world.profile.ruleset(world.host) == before


@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
def test_concurrent_adds_and_dels_leave_exactly_their_rules(world: World) -> None:
    """Six ADDs at once, then six DELs at once (threads of one runtime): two rules per container
    in between, one chain, one jump; nothing after."""
    from concurrent.futures import ThreadPoolExecutor

    before = world.profile.ruleset(world.host)
    with ThreadPoolExecutor(6) as pool:
        made = list(pool.map(lambda i: world.container(f"p{i}"), range(6)))
    try:
        save = _save(world)[0].splitlines()
        assert len([ln for ln in save if ln.startswith("-A PYCNI-FORWARD")]) == 12
        assert len([ln for ln in save if ln.endswith("-j PYCNI-FORWARD")]) == 1
        for _, ip in made:
            assert any(f"-s {ip}/32 " in ln for ln in save)
    finally:
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda m: world.runtime.delete_network_list(world.network, m[0]), made))
    assert _pycni_lines(_save(world)[0]) == []
    assert world.profile.ruleset(world.host) == before


@pytest.mark.parametrize("profile", DOCKER, ids=lambda p: p.name, indirect=True)
def test_the_last_rules_going_never_flush_a_rule_appended_meanwhile(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This DEL read the chain when its rules were the last; another writer appended since: the
    chain's removal fails on ``-X`` (nothing changed) and, read again, only this DEL's rules go."""
    import ipaddress

    place = iptables.Place(4, _flavour(world))
    first = iptables.attachment_rules([ipaddress.ip_network("198.18.64.2/32")], "k1 firewall n c1 eth0")
    second = iptables.attachment_rules([ipaddress.ip_network("198.18.64.3/32")], "k2 firewall n c2 eth0")
    netns.run_in(world.host, iptables.apply, place, first)
    stale = netns.run_in(world.host, iptables.read, place)
    netns.run_in(world.host, iptables.apply, place, second)
    reads = [stale]
    real = iptables.read
    monkeypatch.setattr(iptables, "read", lambda p: reads.pop() if reads else real(p))
    netns.run_in(world.host, iptables.remove, place, lambda c: c.startswith("k1 "))
    ours = [ln for ln in _save(world)[0].splitlines() if ln.startswith("-A PYCNI-FORWARD")]
    assert len(ours) == 2 and all("k2 firewall" in ln for ln in ours)
    netns.run_in(world.host, iptables.remove, place, lambda c: True)
    assert _pycni_lines(_save(world)[0]) == []

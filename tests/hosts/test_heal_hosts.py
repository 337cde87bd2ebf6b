"""The daemon heals the host-firewall steps (issue 20, point 5): with ``pycni serve`` serving the
Nomad-style chain through the shims, ``iptables -F FORWARD`` or a Docker restart (Docker's
ruleset restored again) on a Docker host (iptables-nft: nftables notifications; legacy: the
poller) and ``firewall-cmd --reload`` on a firewalld host are healed within a second — pycni's
chain, jump and rules or zone sources back, egress working, one log line per heal — and a normal
DEL is never put back."""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pycni.chain import fold
from pycni.config import conflist_from_bytes
from pycni.runtime import Runtime
from pycni.testing import probes
from pycni_plugins.kernel import firewalld as fwd
from tests.conftest import REQUIRE_PRIVILEGED
from tests.helpers.slow import scaled
from tests.serve.conftest import Daemon

from . import firewalld as firewalld_daemon
from .conftest import OUTSIDE, World
from .profiles import DOCKER_20_10, DOCKER_LEGACY, DOCKER_NFT, FIREWALLD, FIREWALLDS, in_ns
from .test_iptables_compat import ECHO_PORT, _admin_rule, _pycni_lines, _save

pytestmark = pytest.mark.privileged

TYPES = ["loopback", "bridge", "host-local", "firewall", "portmap", "pycni-chain"]


@pytest.fixture
def served(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Daemon]]:
    """Start ``pycni serve`` in the world's host namespace and point the world's runtime at
    the shims (``PYCNI_DAEMON=required``); stopped (SIGTERM) and its socket dir removed after."""
    started: list[Daemon] = []
    sock_dir = tempfile.mkdtemp(prefix="pycni-serve-")

    def start(env: dict[str, str] | None = None) -> Daemon:
        from pycni_plugins.install import install

        sock = os.path.join(sock_dir, "s.sock")
        bindir = tmp_path / "bin"
        install(str(bindir), TYPES, socket=sock)
        daemon = Daemon(world.host, sock, tmp_path / "serve.log", {**os.environ, **(env or {})}, [])
        started.append(daemon)
        monkeypatch.setenv("PYCNI_DAEMON", "required")
        world.runtime = Runtime(
            [str(bindir)],
            cache_dir=str(tmp_path / "exec-cache"),
            state_dir=world.runtime.state_dir,
            backend="exec",
            host_netns=world.host,
        )
        return daemon

    try:
        yield start
    finally:
        for daemon in started:
            daemon.stop(signal.SIGTERM)
        shutil.rmtree(sock_dir, ignore_errors=True)


def _heals(daemon: Daemon, what: str) -> list[str]:
    return [ln for ln in daemon.log().splitlines() if "pycni serve: heal: " in ln and what in ln]


def _wait(condition: Callable[[], Any], bound: float, what: str) -> float:
    """Seconds until ``condition()`` is true (fails after ``bound``)."""
    started = time.monotonic()
    while not condition():
        elapsed = time.monotonic() - started
        assert elapsed < bound, f"{what}: not within {elapsed:.2f}s"
        time.sleep(0.01)
    return time.monotonic() - started


def _flavour(world: World) -> str:
    return "legacy" if world.profile is DOCKER_LEGACY else "nft"


def _reload(world: World, how: str) -> None:
    flavour = _flavour(world)
    if how == "flush-forward":
        in_ns(world.host, f"iptables-{flavour}", "-w", "-F", "FORWARD")
    else:  # dockerd's restart: its ruleset restored (no --noflush): pycni's chain and jump go
        in_ns(world.host, f"iptables-{flavour}-restore", "-w", stdin=DOCKER_20_10)


@pytest.mark.parametrize("profile", [DOCKER_NFT, DOCKER_LEGACY], ids=lambda p: p.name, indirect=True)
@pytest.mark.parametrize("how", ["flush-forward", "docker-restart"])
def test_the_daemon_heals_the_iptables_step(world: World, served: Callable[..., Daemon], how: str) -> None:
    daemon = served()
    _admin_rule(world)
    rt1, ip1 = world.container("h1")
    rt2, ip2 = world.container("h2")
    try:
        want = sorted(_pycni_lines(_save(world)[0]))
        assert len(want) == 7, want  # the jump, the admin rule, two rules per container
        time.sleep(0.6)  # the legacy poller's first look (nothing missing: no heal)
        assert _heals(daemon, "iptables") == [], daemon.log()

        _reload(world, how)
        assert sorted(_pycni_lines(_save(world)[0])) != want
        seconds = _wait(lambda: sorted(_pycni_lines(_save(world)[0])) == want, scaled(1.0), "healed")
        print(f"{world.profile.name} {how}: healed within {seconds * 1000:.0f} ms")
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert probes.tcp_echo(rt1.netns, OUTSIDE, ECHO_PORT, timeout=2)
        _wait(lambda: _heals(daemon, "iptables rule(s)"), scaled(2.0), "logged")
        heals = _heals(daemon, "iptables rule(s)")
        assert len(heals) == 1, daemon.log()
        # -F FORWARD takes the jump; a Docker restart the chain too: the jump and 5 rules back.
        count = 1 if how == "flush-forward" else 6
        after = "the change" if _flavour(world) == "nft" else "it was seen"  # legacy: by the poll
        assert re.search(rf"restored {count} iptables rule\(s\) in [0-9.]+ ms, [0-9.]+ ms after {after} ", heals[0])
        assert f"restored iptables-{_flavour(world)} jump FORWARD -> PYCNI-FORWARD" in heals[0], heals[0]
        if how == "docker-restart":
            assert f"accept from {ip1}/32 of h1/eth0" in heals[0], heals[0]
        world.runtime.check_network_list(world.network, rt1)

        # A normal DEL is never put back, neither by itself nor by the next heal.
        world.runtime.delete_network_list(world.network, rt2)
        time.sleep(0.7)
        assert not any(ip2 + "/32" in ln for ln in _pycni_lines(_save(world)[0]))
        _reload(world, how)
        left = [ln for ln in want if ip2 + "/32" not in ln]
        _wait(lambda: sorted(_pycni_lines(_save(world)[0])) == left, scaled(1.0), "healed again")
        time.sleep(0.7)
        assert sorted(_pycni_lines(_save(world)[0])) == left
    finally:
        world.runtime.delete_network_list(world.network, rt2)
        world.runtime.delete_network_list(world.network, rt1)
    assert _pycni_lines(_save(world)[0]) == []
    time.sleep(0.7)  # nothing comes back after the last DEL either
    assert _pycni_lines(_save(world)[0]) == []
    assert os.listdir(Path(world.runtime.state_dir) / "iptables") == [".lock"]
    assert " heal: stopped" not in daemon.log() and "FAILED" not in daemon.log(), daemon.log()


@pytest.mark.parametrize("profile", [DOCKER_NFT, DOCKER_LEGACY], ids=lambda p: p.name, indirect=True)
def test_heals_during_concurrent_adds_and_dels_never_fight_them(world: World, served: Callable[..., Daemon]) -> None:
    """Four ADDs at once while ``FORWARD`` is flushed, then four DELs at once while it is flushed
    again: every container's rules are there between, nothing of pycni's after (no DEL put
    back), and nothing comes back later."""
    from concurrent.futures import ThreadPoolExecutor

    daemon = served()
    first = world.container("q0")
    made = [first]
    try:
        with ThreadPoolExecutor(3) as pool:
            adds = pool.map(lambda i: world.container(f"q{i}"), range(1, 4))
            time.sleep(0.05)
            _reload(world, "flush-forward")
            made += list(adds)

        def whole() -> bool:
            lines = _pycni_lines(_save(world)[0])
            return all(any(f"-s {ip}/32 " in ln for ln in lines) for _, ip in made) and any(
                "-A FORWARD" in ln for ln in lines
            )

        _wait(whole, scaled(2.0), "all four containers' rules and the jump")
        with ThreadPoolExecutor(4) as pool:
            dels = pool.map(lambda m: world.runtime.delete_network_list(world.network, m[0]), made)
            time.sleep(0.05)
            _reload(world, "flush-forward")
            list(dels)
            made = []
        _wait(lambda: _pycni_lines(_save(world)[0]) == [], scaled(2.0), "nothing left")
        time.sleep(0.7)
        assert _pycni_lines(_save(world)[0]) == [], daemon.log()
    finally:
        for rt, _ in made:
            world.runtime.delete_network_list(world.network, rt)
    assert "FAILED" not in daemon.log() and not [ln for ln in daemon.requests() if " ok " not in ln], daemon.log()


@pytest.mark.parametrize("profile", [DOCKER_NFT], ids=lambda p: p.name, indirect=True)
def test_a_flushed_ruleset_then_docker_starting_again(world: World, served: Callable[..., Daemon]) -> None:
    """``nft flush ruleset`` takes pycni's tables and iptables-nft's: pycni's come back at once,
    and the compatibility step's rules once Docker makes its table again (no table is made
    for them meanwhile: nothing drops there then)."""
    from .profiles import nft

    daemon = served()
    rt, _ = world.container("r1")
    try:
        want = sorted(_pycni_lines(_save(world)[0]))
        nft(world.host, "flush ruleset")
        _wait(lambda: "table inet pycni" in nft(world.host, "list tables"), scaled(1.0), "pycni's table")
        time.sleep(0.3)
        assert "table ip filter" not in nft(world.host, "list tables")
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert probes.tcp_echo(rt.netns, OUTSIDE, ECHO_PORT, timeout=2)
        in_ns(world.host, "iptables-nft-restore", "-w", stdin=DOCKER_20_10)  # dockerd starts again
        seconds = _wait(lambda: sorted(_pycni_lines(_save(world)[0])) == want, scaled(1.0), "healed")
        print(f"flush ruleset, then Docker: healed within {seconds * 1000:.0f} ms")
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            assert probes.tcp_echo(rt.netns, OUTSIDE, ECHO_PORT, timeout=2)
        world.runtime.check_network_list(world.network, rt)
        assert len(_heals(daemon, " after a change by pid ")) == 2, daemon.log()
    finally:
        world.runtime.delete_network_list(world.network, rt)
    assert _pycni_lines(_save(world)[0]) == []


def _sources(world: World) -> list[str]:
    fw: firewalld_daemon.Firewalld = FIREWALLDS[world.host]
    with fwd.session(fw.address) as bus:
        return sorted(bus.sources("trusted"))


@pytest.fixture
def _firewalld_installed() -> None:
    missing = firewalld_daemon.missing()
    if missing:
        (pytest.fail if REQUIRE_PRIVILEGED else pytest.skip)(missing)


@pytest.mark.usefixtures("_firewalld_installed")
@pytest.mark.parametrize("folded", [False, True], ids=["list", "folded"])
@pytest.mark.parametrize("profile", [FIREWALLD], ids=lambda p: p.name, indirect=True)
def test_the_daemon_heals_a_firewalld_reload(world: World, served: Callable[..., Daemon], folded: bool) -> None:
    fw: firewalld_daemon.Firewalld = FIREWALLDS[world.host]
    daemon = served({"DBUS_SYSTEM_BUS_ADDRESS": fw.address})
    if folded:  # the firewall plugin inside a pycni-chain request: watched all the same
        world.network = conflist_from_bytes(fold(world.conflist))
    rt1, ip1 = world.container("f1")
    rt2, ip2 = world.container("f2")
    try:
        both = sorted([f"{ip1}/32", f"{ip2}/32"])
        assert _sources(world) == both
        _wait(lambda: "heal: watching firewalld's Reloaded signal" in daemon.log(), scaled(2.0), "watching")
        time.sleep(0.3)  # subscribed
        with probes.TCPEchoServer(world.outside, ECHO_PORT, host=OUTSIDE):
            fw.cmd("--reload")  # returns once firewalld has reloaded
            seconds = _wait(lambda: _sources(world) == both, scaled(1.0), "sources back")
            print(f"firewalld reload: healed within {seconds * 1000:.0f} ms")
            assert probes.tcp_echo(rt1.netns, OUTSIDE, ECHO_PORT, timeout=2)
        _wait(lambda: _heals(daemon, "Reloaded signal)"), scaled(2.0), "logged")
        heals = _heals(daemon, "Reloaded signal)")
        assert len(heals) == 1, daemon.log()
        assert f"restored firewalld zone trusted source {ip1}/32 of f1/eth0" in heals[0], heals[0]

        world.runtime.delete_network_list(world.network, rt2)
        assert _sources(world) == [f"{ip1}/32"]
        fw.cmd("--reload")
        _wait(lambda: _sources(world) == [f"{ip1}/32"], scaled(1.0), "healed again")
        time.sleep(0.3)
        assert _sources(world) == [f"{ip1}/32"]
    finally:
        world.runtime.delete_network_list(world.network, rt2)
        world.runtime.delete_network_list(world.network, rt1)
    assert _sources(world) == []
    fw.cmd("--reload")
    time.sleep(0.5)
    assert _sources(world) == []
    assert "FAILED" not in daemon.log() and "could not" not in daemon.log(), daemon.log()

"""Self-healing (issue 20, point 5): after ``nft flush ruleset`` in a host namespace, the daemon
that served the Nomad-style chain there puts pycni's skeleton and every live attachment's
elements back within a second (logging the heal), never re-adds what a DEL removed, and stops
watching a namespace that is gone; without the daemon, CHECK says what is missing and that
``pycni gc --reconcile`` restores it."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pycni import netns
from pycni.config import conflist_from_bytes
from pycni.errors import CNIError
from pycni.nomad.conflist import NomadBridgeConfig, bridge_conflist
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.sdk import Attachment
from pycni.testing.probes import TCPEchoServer, tcp_echo
from pycni_plugins.kernel import layout, nft
from pycni_plugins.kernel.nft.ownership import filed, records
from pycni_plugins.serve.heal import ALIVE_EVERY
from tests.helpers.slow import scaled

pytestmark = pytest.mark.privileged

SUBNET = "198.18.120.0/24"
GATEWAY = "198.18.120.1"
HOST_PORT = 18080


def _network(tmp_path: Path) -> Any:
    conf = NomadBridgeConfig(bridge_name="pheal0", ipv4_subnet=SUBNET, ipam_data_dir=str(tmp_path / "ipam"))
    return conflist_from_bytes(bridge_conflist(conf))


def _rt(cid: str, path: str, port: bool = False) -> RuntimeConf:
    caps = {"portMappings": [{"hostPort": HOST_PORT, "containerPort": 80, "protocol": "tcp"}]} if port else {}
    return RuntimeConf(cid, path, "eth0", capability_args=caps)


def _nft(host: str, *commands: str) -> None:
    subprocess.run(["nsenter", f"--net={host}", "nft", *commands], check=True)


def _missing(state_dir: str) -> list[str]:
    """What the records under ``state_dir`` say is missing in the calling thread's namespace."""
    store = records(state_dir)
    out: list[str] = []
    for name, _, owner in filed(store):
        rec = store.load(name)
        att = Attachment(**rec["attachment"])
        elements = [nft.Element.from_json(r) for r in rec["elements"]]
        named = [tuple(s) for s in rec.get("sections", ())]
        out += nft.skeleton_problems(layout.record_sections(owner, elements, named))
        out += [f"{e.key} of {att.container_id} ({owner})" for e in nft.missing(att, elements)]
    return out


def _keys(state_dir: str) -> set[str]:
    """The attachment keys of the commented elements in pycni's tables."""
    return {k for k, group in nft.attachments(state_dir).items() if group["elements"]}


def _wait_whole(host: str, state_dir: str, bound: float) -> float:
    """Seconds until nothing recorded is missing in ``host`` (fails after ``bound``)."""
    started = time.monotonic()
    while True:
        left = netns.run_in(host, _missing, state_dir)
        elapsed = time.monotonic() - started
        if not left:
            return elapsed
        assert elapsed < bound, f"not healed after {elapsed:.2f}s: {left}"
        time.sleep(0.01)


def _heals(log: str) -> list[str]:
    return [line for line in log.splitlines() if "pycni serve: heal: netns" in line and " after " in line]


def _wait_heals(daemon: Any, count: int = 1) -> list[str]:
    """The daemon's heal lines, once there are ``count`` (it logs just after the heal)."""
    deadline = time.monotonic() + scaled(5)
    while len(_heals(daemon.log())) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return _heals(daemon.log())


@pytest.fixture
def world(
    start_daemon: Callable[..., Any],
    bindir: str,
    make_netns: Callable[[str], netns.Throwaway],
    tmp_path: Path,
    monkeypatch,
) -> Iterator[dict[str, Any]]:
    daemon = start_daemon()  # in its own namespace: the host it serves below is another one
    host = make_netns("hh")
    monkeypatch.setenv("PYCNI_SOCKET", daemon.socket)
    monkeypatch.setenv("PYCNI_DAEMON", "required")
    runtime = Runtime([bindir], cache_dir=str(tmp_path / "cache"), backend="exec", host_netns=host.path, timeout=60)
    yield {"daemon": daemon, "host": host, "runtime": runtime, "network": _network(tmp_path)}


def test_the_daemon_heals_a_flushed_ruleset(world, make_netns, state_dir):
    daemon, host, runtime, network = world["daemon"], world["host"], world["runtime"], world["network"]
    a, b = make_netns("c"), make_netns("c")
    rts = {"a": _rt("heal-a", a.path), "b": _rt("heal-b", b.path, port=True)}
    for rt in rts.values():
        runtime.add_network_list(network, rt)
    with TCPEchoServer(b.path, 80):
        assert tcp_echo(host.path, GATEWAY, HOST_PORT)
        assert tcp_echo(a.path, GATEWAY, HOST_PORT)
        both = netns.run_in(host.path, _keys, state_dir)
        assert len(both) == 2

        _nft(host.path, "flush", "ruleset")
        seconds = _wait_whole(host.path, state_dir, scaled(1.0))
        print(f"healed within {seconds * 1000:.0f} ms of the flush")
        assert netns.run_in(host.path, _keys, state_dir) == both
        assert tcp_echo(host.path, GATEWAY, HOST_PORT), "host port DNAT works again"
        assert tcp_echo(a.path, GATEWAY, HOST_PORT), "and its hairpin from the other container"
        for rt in rts.values():
            runtime.check_network_list(network, rt)
        heals = _wait_heals(daemon)
        assert len(heals) == 1, daemon.log()
        assert "restored 6 element(s)" in heals[0] and "ms after the change" in heals[0], heals[0]

        # A normal DEL is not undone, before or after the next flush.
        runtime.delete_network_list(network, rts["a"])
        time.sleep(0.3)
        assert len(_heals(daemon.log())) == 1, daemon.log()
        only_b = netns.run_in(host.path, _keys, state_dir)
        assert len(only_b) == 1 and only_b < both
        _nft(host.path, "flush", "ruleset")
        _wait_whole(host.path, state_dir, scaled(1.0))
        assert netns.run_in(host.path, _keys, state_dir) == only_b
        assert tcp_echo(host.path, GATEWAY, HOST_PORT)

    # A DEL after the heal removes everything the heal put back.
    runtime.delete_network_list(network, rts["b"])
    assert netns.run_in(host.path, _keys, state_dir) == set()
    assert [n for n in records(state_dir).names() if n != "epoch"] == []
    assert not [line for line in daemon.requests() if " ok " not in line]


def test_the_watcher_ends_with_its_namespace(world, make_netns, state_dir):
    daemon, host, runtime, network = world["daemon"], world["host"], world["runtime"], world["network"]
    c = make_netns("c")
    rt = _rt("heal-gone", c.path)
    runtime.add_network_list(network, rt)
    runtime.delete_network_list(network, rt)
    pid = daemon.proc.pid
    ino = os.stat(host.path).st_ino
    deadline = time.monotonic() + scaled(5)
    while "heal: watching nftables in netns" not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.02)
    found = re.search(rf"watching nftables in netns net:\[{ino}\] \(thread (\d+)\)", daemon.log())
    assert found, daemon.log()
    watcher = f"/proc/{pid}/task/{found.group(1)}"

    def holds_the_namespace() -> bool:
        return any(_readlink(f"/proc/{pid}/fd/{fd}") == f"net:[{ino}]" for fd in os.listdir(f"/proc/{pid}/fd"))

    assert holds_the_namespace() and os.path.exists(watcher)
    host.__exit__(None, None, None)  # the namespace is removed (its fixture's removal is a no-op)
    deadline = time.monotonic() + scaled(2 * ALIVE_EVERY + 3)
    while "is gone: stopped watching it" not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"netns net:[{ino}] is gone: stopped watching it" in daemon.log()
    time.sleep(0.1)
    assert not holds_the_namespace()
    assert not os.path.exists(watcher), "the watcher thread ended"


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_without_the_daemon_check_names_the_fix_and_reconcile_restores(make_netns, tmp_path, state_dir):
    host = make_netns("hh")
    runtime = Runtime([], cache_dir=str(tmp_path / "cache"), backend="inprocess", host_netns=host.path, timeout=60)
    network = _network(tmp_path)
    c = make_netns("c")
    rt = _rt("heal-none", c.path, port=True)
    runtime.add_network_list(network, rt)
    _nft(host.path, "flush", "ruleset")
    with pytest.raises(CNIError) as e:
        runtime.check_network_list(network, rt)
    assert str(e.value) == f"ipMasq: table inet pycni is missing; run `pycni gc {network.name} --reconcile` to restore"
    report = runtime.reconcile_network_list(network)
    assert report.errors == () and any("restored" in r for r in report.collected), report
    runtime.check_network_list(network, rt)
    assert netns.run_in(host.path, _missing, state_dir) == []
    runtime.delete_network_list(network, rt)


def test_no_heal_watches_nothing(start_daemon, bindir, make_netns, tmp_path, monkeypatch, state_dir):
    daemon = start_daemon("--no-heal")
    host = make_netns("hh")
    monkeypatch.setenv("PYCNI_SOCKET", daemon.socket)
    monkeypatch.setenv("PYCNI_DAEMON", "required")
    runtime = Runtime([bindir], cache_dir=str(tmp_path / "cache"), backend="exec", host_netns=host.path, timeout=60)
    network = _network(tmp_path)
    rt = _rt("heal-off", make_netns("c").path)
    runtime.add_network_list(network, rt)
    _nft(host.path, "flush", "ruleset")
    time.sleep(0.5)
    assert netns.run_in(host.path, _missing, state_dir)
    assert "heal:" not in daemon.log()
    runtime.delete_network_list(network, rt)


def test_a_flush_during_concurrent_adds_heals_without_fighting_them(world, make_netns, state_dir):
    daemon, host, runtime, network = world["daemon"], world["host"], world["runtime"], world["network"]
    rts = [_rt(f"heal-c{i}", make_netns("c").path) for i in range(6)]
    runtime.add_network_list(network, rts[0])  # the bridge exists, the daemon watches the host
    errors: list[BaseException] = []

    def add(rt: RuntimeConf) -> None:
        try:
            runtime.add_network_list(network, rt)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=add, args=(rt,)) for rt in rts[1:]]
    for t in threads:
        t.start()
    time.sleep(0.05)
    _nft(host.path, "flush", "ruleset")
    for t in threads:
        t.join()
    assert errors == []
    _wait_whole(host.path, state_dir, scaled(2.0))
    assert len(netns.run_in(host.path, _keys, state_dir)) == 6
    assert _wait_heals(daemon), daemon.log()  # the first container's elements came back
    for rt in rts:
        runtime.check_network_list(network, rt)
    for rt in rts:
        runtime.delete_network_list(network, rt)
    assert netns.run_in(host.path, _keys, state_dir) == set()
    assert [n for n in records(state_dir).names() if n != "epoch"] == []
    assert not [line for line in daemon.requests() if " ok " not in line]

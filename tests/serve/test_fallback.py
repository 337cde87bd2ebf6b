"""Correctness never depends on the daemon: without one (or when told not to use it, or from
another mount namespace) the shim runs the plugin itself; a daemon dying mid-request leaves what
a killed plugin leaves, and DEL/CHECK/GC/STATUS/VERSION fall back while ADD says "try again"."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from pycni.errors import PluginError
from pycni.runtime import Runtime
from tests.faults.conftest import World

from .conftest import call

pytestmark = pytest.mark.privileged

LOOPBACK = {"cniVersion": "1.0.0", "name": "fbnet", "type": "loopback"}
VERSION_ENV = {"CNI_COMMAND": "VERSION"}


def _add_env(ctr: str) -> dict[str, str]:
    return {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": ctr, "CNI_IFNAME": "eth0", "CNI_PATH": "/x"}


def test_without_a_daemon_the_shim_runs_the_plugin_itself(bindir, host_ns, make_netns, sock_dir):
    ctr = make_netns("ctr").path
    expected = call(bindir, "loopback", _add_env(ctr), LOOPBACK, host=host_ns.path, mode="off")
    assert expected.status == 0
    missing = os.path.join(sock_dir, "missing.sock")
    assert call(bindir, "loopback", _add_env(ctr), LOOPBACK, host=host_ns.path, socket_path=missing) == expected
    stale = os.path.join(sock_dir, "stale.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(stale)  # a socket file nobody listens on: connection refused
    assert call(bindir, "loopback", _add_env(ctr), LOOPBACK, host=host_ns.path, socket_path=stale) == expected


def test_daemon_off_never_asks_the_daemon(daemon, bindir, host_ns):
    o = call(bindir, "bridge", VERSION_ENV, host=host_ns.path, socket_path=daemon.socket, mode="off")
    assert o.status == 0 and json.loads(o.stdout)["cniVersion"]
    assert daemon.requests() == []


def test_daemon_required_fails_fast_when_none_answers(bindir, host_ns, sock_dir):
    path = os.path.join(sock_dir, "missing.sock")
    started = time.monotonic()
    o = call(bindir, "bridge", VERSION_ENV, host=host_ns.path, socket_path=path, mode="required")
    elapsed = time.monotonic() - started
    assert o.status == 1 and o.json()["code"] == 11
    assert path.encode() in o.stderr and b"No such file or directory" in o.stderr
    assert elapsed < 5  # no fallback, no retries


def test_a_caller_in_another_mount_namespace_runs_the_plugin_itself(daemon, bindir, host_ns, make_netns):
    ctr = make_netns("ctr").path
    expected = call(bindir, "loopback", _add_env(ctr), LOOPBACK, host=host_ns.path, mode="off")
    private = ("unshare", "--mount", "--propagation", "private")
    o = call(bindir, "loopback", _add_env(ctr), LOOPBACK, host=host_ns.path, socket_path=daemon.socket, wrap=private)
    assert o == expected
    assert [line.rsplit(" ", 1)[0] for line in daemon.requests(1)] == [
        "- - - fallback (caller in another mount namespace)"
    ]
    required = call(
        bindir,
        "loopback",
        _add_env(ctr),
        LOOPBACK,
        host=host_ns.path,
        socket_path=daemon.socket,
        wrap=private,
        mode="required",
    )
    assert required.status == 1 and required.json()["code"] == 11


def _fake_daemon(path: str, answer: bytes) -> threading.Thread:
    """Accept one request, read it, send ``answer`` and hang up (a daemon dying mid-request)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recvmsg(1 << 20, socket.CMSG_SPACE(253 * 4))
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("command", ["VERSION", "STATUS", "GC", "CHECK", "DEL"])
def test_a_request_the_daemon_drops_after_starting_it_runs_again_in_the_shim(bindir, host_ns, sock_dir, command):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"}
    conf = dict(LOOPBACK, cniVersion="1.1.0")
    expected = call(bindir, "loopback", env, conf, host=host_ns.path, mode="off")
    path = os.path.join(sock_dir, f"fake-{command}.sock")
    thread = _fake_daemon(path, b"A\x00" + bytes(8))  # started, run it yourself if I go away
    assert call(bindir, "loopback", env, conf, host=host_ns.path, socket_path=path) == expected
    thread.join(5)


def test_an_add_the_daemon_drops_answers_what_the_daemon_said_beforehand(bindir, host_ns, sock_dir):
    path = os.path.join(sock_dir, "fake-add.sock")
    said = b'{"code": 11, "msg": "gone"}'
    thread = _fake_daemon(path, b"A\x01" + (1).to_bytes(4, "little") + len(said).to_bytes(4, "little") + said)
    o = call(bindir, "loopback", _add_env("/nonexistent"), LOOPBACK, host=host_ns.path, socket_path=path)
    assert (o.status, o.stdout) == (1, said)
    thread.join(5)


@pytest.fixture
def shim_world(host_ns, make_netns, tmp_path, monkeypatch, bindir):
    """The crash tests' world with its runtime exec'ing the shims (in the throwaway host)."""
    world = World(host_ns, make_netns, tmp_path)
    world.runtime = Runtime([bindir], cache_dir=str(world.cache_dir), backend="exec", host_netns=host_ns.path)
    return world


@pytest.mark.parametrize("point", ["bridge.add.after-veth", "host-local.add.after-lease", "portmap.add.after-nft"])
def test_daemon_killed_mid_add_answers_try_again_and_del_converges(start_daemon, shim_world, monkeypatch, point):
    daemon = start_daemon(env={"PYCNI_FAILPOINTS": f"{point}=kill"})
    monkeypatch.setenv("PYCNI_SOCKET", daemon.socket)
    ns = shim_world.make_netns("c")
    with pytest.raises(PluginError) as failed:
        shim_world.add("victim", ns.path)
    assert failed.value.code == 11, failed.value
    assert daemon.proc.wait(10) == -9
    shim_world.delete("victim", ns.path)  # no daemon now: the shims run the plugins
    assert shim_world.leftovers(ns) == {}
    shim_world.works("victim", ns)
    shim_world.delete("victim", ns.path)
    assert shim_world.leftovers(ns) == {}


@pytest.mark.parametrize("point", ["bridge.del.after-link", "nft.release.portmap.after-commit"])
def test_daemon_killed_mid_del_falls_back_and_the_del_succeeds(start_daemon, shim_world, monkeypatch, point):
    daemon = start_daemon(env={"PYCNI_FAILPOINTS": f"{point}=kill"})
    monkeypatch.setenv("PYCNI_SOCKET", daemon.socket)
    ns = shim_world.make_netns("c")
    shim_world.works("victim", ns)
    shim_world.delete("victim", ns.path)
    assert daemon.proc.wait(10) == -9
    assert shim_world.leftovers(ns) == {}

"""The daemon under pressure: who may talk to it, bounded requests and queue, callers that
leave mid-request, SIGTERM, systemd socket activation, ``--check``, and a shim that stays thin."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.kernel import links
from tests.helpers.slow import scaled

from .conftest import PYTHON, Daemon, call, install_for_any_uid

pytestmark = pytest.mark.privileged

VERSION_ENV = {"CNI_COMMAND": "VERSION"}
BRIDGE = {
    "cniVersion": "1.0.0",
    "name": "robnet",
    "type": "bridge",
    "bridge": "prob0",
    "isGateway": True,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.92.0/24"}]]},
}


def _bridge(tmp_path: Path) -> dict:
    return dict(BRIDGE, ipam=dict(BRIDGE["ipam"], dataDir=str(tmp_path / "ipam")))


def _env(command: str, ctr: str, cid: str = "c1") -> dict[str, str]:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": ctr, "CNI_IFNAME": "eth0", "CNI_PATH": "/x"}


def _spawn(bindir: str, plugin: str, env: dict, stdin: dict, host: str, sock: str, **kw) -> subprocess.Popen:
    full = {"PATH": os.environ["PATH"], "PYCNI_STATE_DIR": os.environ["PYCNI_STATE_DIR"], "PYCNI_SOCKET": sock, **env}
    proc = subprocess.Popen(
        ["nsenter", f"--net={host}", os.path.join(bindir, plugin)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full,
        **kw,
    )
    proc.stdin.write(json.dumps(stdin).encode())
    proc.stdin.close()
    proc.stdin = None  # written: communicate() only reads
    return proc


def _wait_for(predicate, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _reached(log: Path, name: str) -> bool:
    return log.exists() and name in log.read_text()


def _veths(path: str) -> list[str]:
    return [name for name, link in links(path).items() if link["kind"] == "veth"]


def test_socket_is_0600_in_a_0700_dir_and_removed_on_sigterm(daemon):
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(daemon.socket)).st_mode) == 0o700
    assert daemon.stop() == 0
    assert not os.path.exists(daemon.socket)
    assert daemon.log().rstrip().endswith("stopped")


def test_refuses_a_socket_dir_others_can_enter_and_a_socket_another_daemon_serves(daemon, host_ns, tmp_path):
    from pycni_plugins.serve.daemon import check

    shared = tempfile.mkdtemp(prefix="pycni-shared-")
    try:
        os.chmod(shared, 0o755)
        p = subprocess.run(
            [PYTHON, "-m", "pycni.cli", "serve", "--socket", os.path.join(shared, "s.sock")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 1 and "must be owned by uid 0 with mode 0700" in p.stderr, p.stderr
    finally:
        os.rmdir(shared)
    p = subprocess.run(
        [PYTHON, "-m", "pycni.cli", "serve", "--socket", daemon.socket], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 1 and "a daemon already answers on" in p.stderr, p.stderr
    assert check(daemon.socket)[0]


def test_check_says_whether_a_daemon_answers(daemon):
    def check() -> subprocess.CompletedProcess[str]:
        argv = [PYTHON, "-m", "pycni.cli", "serve", "--check", "--socket", daemon.socket]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    up = check()
    assert up.returncode == 0 and f"answers on {daemon.socket} (pid {daemon.proc.pid}" in up.stdout
    daemon.stop()
    down = check()
    assert down.returncode == 1 and "no pycni daemon answers" in down.stderr


def test_a_caller_neither_root_nor_the_daemons_uid_is_not_served(daemon, host_ns):
    shims = tempfile.mkdtemp(prefix="pycni-shims-")
    try:
        install_for_any_uid(shims, ["bridge"])
        # Let anyone reach the socket, so that only the peer-credential check stands in the way.
        os.chmod(os.path.dirname(daemon.socket), 0o711)
        os.chmod(daemon.socket, 0o666)
        nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        o = call(shims, "bridge", VERSION_ENV, host=host_ns.path, socket_path=daemon.socket, inner=nobody)
        assert o.status == 0 and json.loads(o.stdout)["cniVersion"], o  # the shim ran it itself
        assert [line.rsplit(" ", 1)[0] for line in daemon.requests(1)] == [
            "- - - fallback (caller uid 65534 is neither root nor the daemon's)"
        ]
        required = call(
            shims, "bridge", VERSION_ENV, host=host_ns.path, socket_path=daemon.socket, inner=nobody, mode="required"
        )
        assert required.status == 1 and required.json()["code"] == 11
    finally:
        subprocess.run(["rm", "-rf", shims], check=True)


_FAKE_DAEMON = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(1)
print("listening", flush=True)
conn, _ = s.accept()
conn.settimeout(5)
data, anc, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(253 * 4))
print(f"bytes={len(data)} fds={sum(len(d) // 4 for _, _, d in anc)}", flush=True)
out = b'{"cniVersion": "6.6.6", "supportedVersions": ["6.6.6"]}'
conn.sendall(b"R" + bytes(4) + len(out).to_bytes(4, "little") + bytes(4) + out)
"""


@pytest.mark.parametrize("mode", ["default", "required"])
def test_a_shim_sends_nothing_to_a_listener_neither_root_nor_its_own_uid(bindir, host_ns, mode):
    """A listener run as nobody on the shim's socket path gets no request and no fds, and its
    forged answer is not printed: the shim runs the plugin itself, or fails when required."""
    parent = tempfile.mkdtemp(prefix="pycni-fake-")
    try:
        os.chmod(parent, 0o755)
        own = os.path.join(parent, "nobody")
        os.mkdir(own, 0o700)
        os.chown(own, 65534, 65534)
        sock = os.path.join(own, "s.sock")
        fake = subprocess.Popen(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-I",
                "-c",
                _FAKE_DAEMON,
                sock,
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        try:
            assert fake.stdout is not None and fake.stdout.readline() == "listening\n"
            o = call(
                bindir,
                "bridge",
                VERSION_ENV,
                host=host_ns.path,
                socket_path=sock,
                mode=None if mode == "default" else mode,
            )
            fake.wait(timeout=scaled(10))
            assert fake.stdout.read() == "bytes=0 fds=0\n"
        finally:
            fake.kill()
            fake.wait()
        assert b"6.6.6" not in o.stdout, o
        if mode == "default":
            assert o.status == 0 and "1.0.0" in o.json()["supportedVersions"], o
        else:
            assert o.status == 1 and o.json()["code"] == 11, o
            assert b"its listener runs as uid 65534, neither root nor ours" in o.stderr, o
    finally:
        subprocess.run(["rm", "-rf", parent], check=True)


def test_a_symlinked_state_dir_is_refused_through_the_daemon(daemon, bindir, host_ns, make_netns, symlinked_state_dir):
    link, real = symlinked_state_dir
    conf = {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}
    o = call(
        bindir,
        "loopback",
        _env("ADD", make_netns("ctr").path),
        conf,
        host=host_ns.path,
        socket_path=daemon.socket,
        mode="required",
    )
    assert o.status == 1 and o.json()["code"] == 5, o
    assert o.json()["msg"] == f"refusing state dir {link}: it is a symlink", o
    assert os.listdir(real) == []


def test_an_oversized_request_is_left_to_the_shim(daemon, bindir, host_ns):
    big = {"cniVersion": "1.0.0", "name": "n", "type": "bridge", "pad": "x" * (2 << 20)}
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"}
    served = call(bindir, "bridge", env, big, host=host_ns.path, socket_path=daemon.socket)
    local = call(bindir, "bridge", env, big, host=host_ns.path, mode="off")
    assert served == local
    (line,) = daemon.requests(1)
    assert " fallback (request of " in line and "over the 1048576 limit" in line


def test_beyond_the_workers_requests_wait_then_get_try_again_later(start_daemon, bindir, host_ns, make_netns, tmp_path):
    fp_log = tmp_path / "fp.log"
    daemon = start_daemon(
        "--workers",
        "1",
        "--queue",
        "1",
        "--wait",
        "0.5",
        env={"PYCNI_FAILPOINTS": "host-local.add.after-lease=sleep:4", "PYCNI_FAILPOINTS_LOG": str(fp_log)},
    )
    ctr = make_netns("ctr").path
    slow = _spawn(bindir, "bridge", _env("ADD", ctr), _bridge(tmp_path), host_ns.path, daemon.socket)
    try:
        _wait_for(lambda: _reached(fp_log, "host-local.add.after-lease"), what="the slow ADD")
        waiting = _spawn(bindir, "bridge", VERSION_ENV, {}, host_ns.path, daemon.socket)
        time.sleep(0.2)  # likely accepted and waiting for the worker by now (either order is checked)
        started = time.monotonic()
        other = call(bindir, "bridge", VERSION_ENV, host=host_ns.path, socket_path=daemon.socket)
        assert time.monotonic() - started < 0.5 + 2, "nobody waits longer than --wait"
        out, _ = waiting.communicate(timeout=30)
        answers = sorted([(waiting.returncode, json.loads(out)), (other.status, other.json())], key=str)
        assert [(status, answer["code"]) for status, answer in answers] == [(1, 11), (1, 11)], answers
        assert sorted(answer["msg"] for _, answer in answers) == [
            "pycni serve is busy: 1 running, waited 0.5s",  # the one that waited its turn
            "pycni serve is busy: too many requests waiting",  # the one beyond the queue, at once
        ]
        out, err = slow.communicate(timeout=60)
        assert slow.returncode == 0, (out, err)
    finally:
        for proc in (slow,):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # The daemon logs a request after answering it: wait for the slow ADD's line.
    outcomes = [line.split(" ", 3)[3] for line in daemon.requests(2)]  # the waiting VERSION and the ADD
    assert any(o.startswith("busy (error 11)") for o in outcomes), outcomes
    assert any(o.startswith("ok") for o in outcomes), outcomes
    assert "busy: 2 connections waiting or running" in daemon.log()


def test_a_caller_killed_mid_add_leaves_the_daemon_holding_its_lock_until_done(
    start_daemon, bindir, host_ns, make_netns, tmp_path
):
    fp_log = tmp_path / "fp.log"
    daemon = start_daemon(
        env={"PYCNI_FAILPOINTS": "bridge.add.after-veth=sleep:2", "PYCNI_FAILPOINTS_LOG": str(fp_log)}
    )
    ctr = make_netns("ctr").path
    lock_path = tmp_path / "container.lock"
    lock = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 1, 0) + b"\0" * 4

    def try_lock() -> bool:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
            return True
        except OSError as e:
            assert e.errno in (errno.EAGAIN, errno.EACCES)
            return False
        finally:
            os.close(fd)

    held = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.fcntl(held, fcntl.F_OFD_SETLK, lock)  # the runtime's container lock, inherited by the plugin
    shim = _spawn(bindir, "bridge", _env("ADD", ctr), _bridge(tmp_path), host_ns.path, daemon.socket, pass_fds=(held,))
    os.close(held)
    try:
        _wait_for(lambda: _reached(fp_log, "bridge.add.after-veth"), what="the ADD in the daemon")
        shim.kill()  # the runtime gave up and killed its plugin
        shim.wait()
        assert not try_lock(), "the daemon must hold the caller's lock while the ADD runs"
        _wait_for(lambda: any("bridge ADD c1" in line for line in daemon.requests()), what="the ADD to finish")
    finally:
        if shim.poll() is None:
            shim.kill()
            shim.wait()
    assert try_lock()
    (line,) = daemon.requests()
    assert " ok, caller gone before the answer " in line, line
    o = call(bindir, "bridge", _env("DEL", ctr), _bridge(tmp_path), host=host_ns.path, socket_path=daemon.socket)
    assert o.status == 0, o
    assert _veths(host_ns.path) == [] and not list((tmp_path / "ipam" / "robnet").glob("198.*"))


def test_sigterm_lets_the_running_request_finish_and_stops_accepting(
    start_daemon, bindir, host_ns, make_netns, tmp_path
):
    fp_log = tmp_path / "fp.log"
    daemon = start_daemon(
        env={"PYCNI_FAILPOINTS": "host-local.add.after-lease=sleep:2", "PYCNI_FAILPOINTS_LOG": str(fp_log)}
    )
    ctr = make_netns("ctr").path
    shim = _spawn(bindir, "bridge", _env("ADD", ctr), _bridge(tmp_path), host_ns.path, daemon.socket)
    try:
        _wait_for(lambda: _reached(fp_log, "host-local.add.after-lease"), what="the ADD in the daemon")
        daemon.proc.send_signal(signal.SIGTERM)
        _wait_for(lambda: not os.path.exists(daemon.socket), timeout=5, what="the socket to go")
        later = call(bindir, "bridge", VERSION_ENV, host=host_ns.path, socket_path=daemon.socket, mode="required")
        assert later.status == 1 and b"No such file or directory" in later.stderr
        out, err = shim.communicate(timeout=60)
    finally:
        if shim.poll() is None:
            shim.kill()
            shim.wait()
    assert shim.returncode == 0 and json.loads(out)["ips"], (out, err)
    assert daemon.proc.wait(60) == 0
    assert daemon.log().rstrip().endswith("stopped")


def test_serves_the_socket_systemd_passes(host_ns, bindir, sock_dir, tmp_path):
    path = os.path.join(sock_dir, "activated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    script = f'exec 3<&0 </dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec nsenter --net={host_ns.path} "$@"'
    log = tmp_path / "activated.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["sh", "-c", script, "sh", PYTHON, "-m", "pycni.cli", "serve", "--socket", "/nonexistent/ignored.sock"],
            stdin=listener.fileno(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    listener.close()
    try:
        daemon = Daemon.__new__(Daemon)
        daemon.socket, daemon.log_path, daemon.proc = path, log, proc
        daemon.wait_ready()
        o = call(bindir, "bridge", VERSION_ENV, host=host_ns.path, socket_path=path, mode="required")
        assert o.status == 0, o
        assert daemon.stop() == 0
        assert os.path.exists(path), "systemd owns the socket file"
        assert f"serving on {path}" in daemon.log()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_shim_imports_only_c_modules_before_it_sends(daemon, bindir, host_ns):
    env = {"PATH": os.environ["PATH"], "PYCNI_SOCKET": daemon.socket, "PYCNI_DAEMON": "required", **VERSION_ENV}

    def imports(*argv: str) -> set[str]:
        p = subprocess.run(
            ["nsenter", f"--net={host_ns.path}", PYTHON, "-IS", "-X", "importtime", *argv],
            input=b"",
            capture_output=True,
            env=env,
            timeout=60,
        )
        assert p.returncode == 0, p
        return {line.rsplit("|", 1)[1].strip() for line in p.stderr.decode().splitlines() if "import time:" in line}

    assert imports(os.path.join(bindir, "bridge")) - imports("-c", "pass") == {"_socket", "fcntl"}

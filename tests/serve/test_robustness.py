"""The daemon under pressure: who may talk to it, bounded requests and queue, callers that
leave mid-request, SIGTERM, systemd socket activation, ``--check``, and a shim that stays thin."""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
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
    from pycni_plugins.serve.sockets import check

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


def test_refuses_a_socket_under_a_directory_another_user_could_swap(host_ns):
    """``nobody`` owns an ancestor of the socket's 0700 directory: it could rename that away
    and take over the socket's path, so the daemon does not start."""
    shared = tempfile.mkdtemp(prefix="pycni-swap-")
    try:
        os.chmod(shared, 0o777)
        os.chown(shared, 65534, 65534)
        run = os.path.join(shared, "run")
        os.mkdir(run, 0o700)
        p = subprocess.run(
            ["nsenter", f"--net={host_ns.path}", PYTHON, "-m", "pycni.cli", "serve", "--socket", f"{run}/pycni.sock"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 1, p
        assert f"another user could replace the socket directory {run}" in p.stderr, p.stderr
        assert f"{shared} is owned by uid 65534, neither root nor 0" in p.stderr, p.stderr
        assert os.listdir(run) == []
    finally:
        shutil.rmtree(shared)


def test_a_shim_does_not_connect_through_a_path_another_user_could_swap(daemon, bindir, host_ns):
    """The daemon's socket reached through a 0777 directory (a symlink in it to the socket's
    directory): anyone could point that elsewhere, so the shim sends nothing."""
    weak = tempfile.mkdtemp(prefix="pycni-weak-")
    try:
        os.chmod(weak, 0o777)
        os.symlink(os.path.dirname(daemon.socket), os.path.join(weak, "to-daemon"))
        sock = os.path.join(weak, "to-daemon", os.path.basename(daemon.socket))
        required = call(bindir, "bridge", VERSION_ENV, host=host_ns.path, socket_path=sock, mode="required")
        assert (required.status, required.json()["code"]) == (1, 11), required
        assert (
            f"another user could replace the socket: {weak} is writable by group or others".encode() in required.stderr
        )
        fallback = call(bindir, "bridge", VERSION_ENV, host=host_ns.path, socket_path=sock)
        assert fallback.status == 0 and fallback.json()["supportedVersions"], fallback
        assert call(bindir, "bridge", VERSION_ENV, host=host_ns.path, socket_path=daemon.socket).status == 0
        assert len(daemon.requests(1)) == 1, "only the request through the safe path reached the daemon"
    finally:
        shutil.rmtree(weak)


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
s = socket.socket(fileno=int(sys.argv[1]))
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
    forged answer is not printed: the shim runs the plugin itself, or fails when required. (The
    path is one the shim trusts: root bound the socket and nobody got it to listen on.)"""
    parent = tempfile.mkdtemp(prefix="pycni-fake-")
    try:
        os.chmod(parent, 0o755)
        sock = os.path.join(parent, "s.sock")
        bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound.bind(sock)
        with bound:
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
                    str(bound.fileno()),
                ],
                stdout=subprocess.PIPE,
                text=True,
                cwd="/",
                pass_fds=(bound.fileno(),),
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


def _raw_request(sock_path: str, ns_path: str, plugin_type: bytes) -> bytes:
    """A shim's request for ``plugin_type`` (VERSION, from the namespace at ``ns_path``) and the answer."""
    env, stdin = b"CNI_COMMAND=VERSION", b"{}"
    head = struct.pack("<6s5I", b"PYCNI\x02", len(plugin_type), len(env), len(stdin), 0, 0)
    fds = [os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC), os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(sock_path)
            with contextlib.suppress(OSError):  # a refused request is answered before it is all read
                s.sendmsg(
                    [head + plugin_type + env + stdin], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                )
            chunks = []
            with contextlib.suppress(ConnectionResetError):  # what it left unread resets, after its answer
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            return b"".join(chunks)
    finally:
        for fd in fds:
            os.close(fd)


def test_a_type_that_is_not_a_plugin_type_is_left_to_the_shim_and_logged_escaped(daemon, host_ns):
    """A type with a newline cannot forge a log line, one of 256 KiB is not even read: both are
    refused before any lookup, each with one log line."""
    forged = b"bridge\n2026-12-04T00:00:00.000Z pycni serve: bridge ADD forged ok 1.0ms"
    for sent, kind in enumerate((forged, b"b" * (256 << 10), b"../../bin/sh"), 1):
        assert _raw_request(daemon.socket, host_ns.path, kind)[:1] == b"F"
        daemon.requests(sent)  # logged just after the answer: the next request must not overtake it
    lines = daemon.requests(3)
    assert [line.split(" ", 3)[3].rsplit(" ", 1)[0] for line in lines] == [
        "fallback ('bridge\\n2026-12-04T00:00:00.000Z pycni serve: bridge ADD forged ok 1.0ms' is not a plugin type)",
        "fallback (a plugin type of 262144 bytes)",
        "fallback (../../bin/sh is not a plugin type)",
    ]
    assert all(line.startswith("- - - fallback (") for line in lines), lines
    assert not any(line.startswith("bridge ADD forged") for line in daemon.requests())


def test_a_busy_daemon_has_the_shim_run_the_plugin_itself_unless_required(
    start_daemon, bindir, host_ns, make_netns, tmp_path
):
    """With its one worker taken and its one queue place too, the daemon answers at once the
    connection beyond the queue, and after ``--wait`` the one that waited: run it yourself, which
    a default-mode shim does; under ``PYCNI_DAEMON=required`` both are error 11."""
    fp_log = tmp_path / "fp.log"
    daemon = start_daemon(
        "--workers",
        "1",
        "--queue",
        "1",
        "--wait",
        "0.5",
        env={"PYCNI_FAILPOINTS": "host-local.add.after-lease=sleep:6", "PYCNI_FAILPOINTS_LOG": str(fp_log)},
    )
    ctr = make_netns("ctr").path
    slow = _spawn(bindir, "bridge", _env("ADD", ctr), _bridge(tmp_path), host_ns.path, daemon.socket)
    try:
        _wait_for(lambda: _reached(fp_log, "host-local.add.after-lease"), what="the slow ADD")
        base = _handling(daemon)  # the slow ADD's and the socketpairs of pyroute2's event loop
        for mode in ("default", "required"):
            required = mode == "required"
            extra = {"PYCNI_DAEMON": "required"} if required else {}
            _wait_for(lambda: _handling(daemon) == base, what="the previous round's connections closed")
            waiting = _spawn(bindir, "bridge", {**VERSION_ENV, **extra}, {}, host_ns.path, daemon.socket)
            _wait_for(lambda: _handling(daemon) > base, what="the queued request")
            started = time.monotonic()
            beyond = call(
                bindir,
                "bridge",
                VERSION_ENV,
                host=host_ns.path,
                socket_path=daemon.socket,
                mode=extra.get("PYCNI_DAEMON"),
            )
            assert time.monotonic() - started < scaled(2), "the one beyond the queue is answered at once"
            out, err = waiting.communicate(timeout=30)
            if not required:
                assert (waiting.returncode, beyond.status) == (0, 0), (out, err, beyond)
                assert json.loads(out)["supportedVersions"] and beyond.json()["supportedVersions"]
            else:
                assert (waiting.returncode, json.loads(out or "{}").get("code")) == (1, 11), (out, err)
                assert json.loads(out)["msg"] == "pycni serve is busy: 1 running, waited 0.5s"
                assert (beyond.status, beyond.json()["code"]) == (1, 11), beyond
                assert b"pycni serve is busy: 2 connections waiting or running" in beyond.stderr, beyond
        out, err = slow.communicate(timeout=60)
        assert slow.returncode == 0, (out, err)
    finally:
        if slow.poll() is None:
            slow.kill()
            slow.wait()
    outcomes = [line.split(" ", 3)[3].rsplit(" ", 1)[0] for line in daemon.requests(3)]
    assert outcomes.count("fallback (pycni serve is busy: 1 running, waited 0.5s)") == 1, outcomes
    assert outcomes.count("busy (error 11)") == 1, outcomes
    assert "ok" in outcomes, outcomes
    assert "busy: 2 connections waiting or running; told the caller to run the plugin itself" in daemon.log()


def _handling(daemon: Daemon) -> int:
    """Connected unix stream sockets the daemon process holds: its callers' connections, and
    any socketpair a library made (its listener not counted)."""
    pid = daemon.proc.pid
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:"):
                inodes.add(target[8:-1])
    with open(f"/proc/{pid}/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return sum(1 for row in rows if row[6] in inodes and row[5] == "03")  # connected stream sockets


def test_idle_connections_from_one_process_cannot_keep_the_daemon_busy(daemon, bindir, host_ns, make_netns):
    """Far more idle connections than workers and queue together, from one process: beyond
    ``per_peer`` they are refused at once, so a shim still gets a worker."""
    idle = []
    try:
        for _ in range(80):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(daemon.socket)
            idle.append(s)
        o = call(
            bindir,
            "loopback",
            _env("ADD", make_netns("ctr").path),
            {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"},
            host=host_ns.path,
            socket_path=daemon.socket,
            mode="required",
        )
        assert o.status == 0, o
        refused = sum(1 for s in idle if _answer(s) == b"F")
        assert refused == 80 - 4, refused
    finally:
        for s in idle:
            s.close()
    assert "connections from pid" in daemon.log()


def test_a_connection_that_sends_nothing_is_closed_after_the_read_deadline(daemon):
    """An idle connection holds its place for 2 s (the read deadline), not forever."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(daemon.socket)
        s.settimeout(scaled(10))
        started = time.monotonic()
        assert s.recv(1) == b"", "closed without an answer"
        assert 1.5 < time.monotonic() - started < scaled(5)
    (line,) = daemon.requests(1)
    assert " dropped (request not sent in time) " in line, line


def _answer(s: socket.socket) -> bytes:
    s.settimeout(scaled(5))
    try:
        return s.recv(1)
    except OSError:
        return b""


def test_an_add_whose_caller_was_killed_is_undone_while_the_daemon_holds_the_callers_lock(
    start_daemon, bindir, host_ns, make_netns, tmp_path
):
    """A runtime that killed its plugin mid-ADD never learns the result to DEL it (libcni and
    go-cni pass no lock fds): the daemon finishes the ADD, then DELs it, holding the caller's
    lock until both are done, so nothing is left for anyone to clean up."""
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
    assert " ok, caller gone before the answer: undone by DEL " in line, line
    assert _veths(host_ns.path) == [] and not list((tmp_path / "ipam" / "robnet").glob("198.*"))
    o = call(bindir, "bridge", _env("DEL", ctr), _bridge(tmp_path), host=host_ns.path, socket_path=daemon.socket)
    assert o.status == 0, "the runtime's own recovering DEL still succeeds"


def test_relative_paths_resolve_against_the_callers_working_directory(daemon, bindir, host_ns, make_netns, tmp_path):
    """host-local with a relative ``dataDir``: an ADD through the daemon and one run by the shim
    itself, from the same directory, share that directory's leases (no duplicate IP)."""
    conf = dict(BRIDGE, ipam=dict(BRIDGE["ipam"], dataDir="rel-leases"))
    caller = tmp_path / "caller"
    caller.mkdir()
    ips = []
    for i, mode in enumerate(("required", "off")):
        o = call(
            bindir,
            "bridge",
            _env("ADD", make_netns(f"ctr{i}").path, f"c{i}"),
            conf,
            host=host_ns.path,
            socket_path=daemon.socket,
            mode=mode,
            cwd=caller,
        )
        assert o.status == 0, o
        ips.append(o.json()["ips"][0]["address"])
    assert ips[0] != ips[1], ips
    assert sorted(p.name for p in (caller / "rel-leases" / "robnet").glob("198.*")) == sorted(
        ip.split("/")[0] for ip in ips
    )
    assert [line.split(" ", 3)[3].rsplit(" ", 1)[0] for line in daemon.requests(1)] == ["ok"]


_FD_FLOOD = """
import array, os, socket, sys, time
fds = array.array("i", [os.open("/dev/null", os.O_RDONLY) for _ in range(15)])
held, end = [], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end and not os.path.exists(sys.argv[3]):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(0.2)
        s.connect(sys.argv[1])
        s.sendmsg([b"P"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        held.append(s)
    except OSError:
        s.close()
    if len(held) > 8:
        held.pop(0).close()
"""


def test_a_flood_of_fds_neither_kills_nor_starves_the_daemon(start_daemon, bindir, host_ns, make_netns, tmp_path):
    """Under a 64-fd limit, four processes keep sending one byte with 15 fds on connection
    after connection: the daemon closes the fds it cannot use, survives running out of fds on
    accept, and serves a shim once they stop (they stop once it has run out, or after 30 s)."""
    daemon = start_daemon(wrap=("prlimit", "--nofile=64:64", "--"))
    stop = tmp_path / "stop"
    argv = [PYTHON, "-c", _FD_FLOOD, daemon.socket, str(scaled(30)), str(stop)]
    flood = [subprocess.Popen(argv, cwd="/") for _ in range(4)]
    try:
        deadline = time.monotonic() + scaled(30)
        while "cannot accept: Too many open files" not in daemon.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.touch()
        for proc in flood:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in flood:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert daemon.proc.poll() is None, daemon.log()
    o = call(
        bindir,
        "loopback",
        _env("ADD", make_netns("ctr").path),
        {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"},
        host=host_ns.path,
        socket_path=daemon.socket,
        mode="required",
    )
    assert o.status == 0, (o, daemon.log()[-3000:])
    assert "cannot accept: Too many open files" in daemon.log(), "the flood reached the limit"
    assert "Traceback" not in daemon.log()


def test_the_daemon_raises_its_soft_fd_limit_to_the_hard_one(start_daemon):
    daemon = start_daemon(wrap=("prlimit", "--nofile=1024:4096", "--"))
    with open(f"/proc/{daemon.proc.pid}/limits") as f:
        (row,) = [line for line in f if line.startswith("Max open files")]
    assert row.split()[3:5] == ["4096", "4096"], row


@contextlib.contextmanager
def _network_lock_held(tmp_path: Path) -> Iterator[Callable[[], None]]:
    """host-local's lock of the robnet network, held as a stuck plugin elsewhere would, until
    the release function it yields is called (or the block ends)."""
    store = tmp_path / "ipam" / "robnet"
    store.mkdir(parents=True)
    fd = os.open(store / "lock", os.O_RDONLY | os.O_CREAT, 0o750)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield lambda: fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _adds_blocked_on_the_lock(
    bindir, host_ns, make_netns, daemon: Daemon, tmp_path: Path, n: int
) -> Iterator[list[subprocess.Popen]]:
    """``n`` bridge ADDs through the daemon, each past its veth and waiting for the IPAM lock."""
    conf = _bridge(tmp_path)
    shims = [
        _spawn(bindir, "bridge", _env("ADD", make_netns(f"ctr{i}").path, f"c{i}"), conf, host_ns.path, daemon.socket)
        for i in range(n)
    ]
    try:
        _wait_for(lambda: len(_veths(host_ns.path)) == n, what=f"{n} ADDs to block on the lock")
        yield shims
    finally:
        for shim in shims:
            if shim.poll() is None:
                shim.kill()
            shim.wait()


def test_adds_killed_while_waiting_for_a_lock_give_up_and_leave_nothing(daemon, bindir, host_ns, make_netns, tmp_path):
    """As a runtime's timeout kills its plugins: the daemon's ADDs stop waiting for the lock at
    once, undo their veths, and take no lease when the lock is free again."""
    with _network_lock_held(tmp_path):
        with _adds_blocked_on_the_lock(bindir, host_ns, make_netns, daemon, tmp_path, 4) as shims:
            time.sleep(scaled(0.5))
            for shim in shims:
                shim.kill()
        lines = daemon.requests(4)
        assert len(lines) == 4, "they gave up while the lock was still held"
        assert _veths(host_ns.path) == []
    time.sleep(scaled(0.5))
    assert not list((tmp_path / "ipam" / "robnet").glob("198.*")), "no lease taken once the lock was free"
    assert all(" error (code 11), caller gone before the answer " in line for line in lines), lines


def test_requests_blocked_on_one_networks_lock_leave_the_workers_to_other_networks(
    start_daemon, bindir, host_ns, make_netns, tmp_path
):
    """Twice as many ADDs as workers wait for one network's lock; a loopback ADD is served at
    once, and the blocked ones complete when the lock is free."""
    daemon = start_daemon("--workers", "2")
    with (
        _network_lock_held(tmp_path) as release,
        _adds_blocked_on_the_lock(bindir, host_ns, make_netns, daemon, tmp_path, 4) as shims,
    ):
        started = time.monotonic()
        o = call(
            bindir,
            "loopback",
            _env("ADD", make_netns("other").path),
            {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"},
            host=host_ns.path,
            socket_path=daemon.socket,
            mode="required",
        )
        assert o.status == 0, o
        assert time.monotonic() - started < scaled(3)
        assert all(shim.poll() is None for shim in shims), "still waiting for the lock"
        release()
        for shim in shims:
            out, err = shim.communicate(timeout=60)
            assert shim.returncode == 0 and json.loads(out)["ips"], (out, err)


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


@pytest.mark.parametrize(
    ("passed", "error"),
    [
        ("a regular file", "fd 3, which systemd passed, is not a socket: Socket operation on non-socket"),
        ("an unbound unix stream socket", "the socket systemd passed is not listening"),
        ("a bound unix socket not listening", "the socket systemd passed is not listening"),
        ("a UDP socket", "the socket systemd passed is not a unix stream socket"),
    ],
)
def test_a_systemd_fd_that_is_not_a_listening_unix_socket_is_a_one_line_error(
    host_ns, sock_dir, tmp_path, passed, error
):
    if passed == "a regular file":
        fd = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT, 0o600)
    elif passed == "a UDP socket":
        fd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM).detach()
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if passed == "a bound unix socket not listening":
            s.bind(os.path.join(sock_dir, "bound.sock"))
        fd = s.detach()
    script = f'exec 3<&0 </dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec nsenter --net={host_ns.path} "$@"'
    try:
        p = subprocess.run(
            ["sh", "-c", script, "sh", PYTHON, "-m", "pycni.cli", "serve", "--socket", "/nonexistent/ignored.sock"],
            stdin=fd,
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(fd)
    assert (p.returncode, p.stdout) == (1, b""), p
    (line,) = p.stderr.decode().splitlines()
    assert line.endswith(error), line


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

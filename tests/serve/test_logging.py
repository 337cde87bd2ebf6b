"""Logs of exec'd plugins and of ``pycni serve``: PYCNI_LOG_LEVEL on stderr with stdout the exact
result, the daemon's JSON lines, and READY=1 to systemd's notify socket once it listens."""

from __future__ import annotations

import json
import os
import socket
import uuid
from typing import Any

import pytest

from pycni import netns
from pycni._json import go_escape

from .conftest import call

pytestmark = pytest.mark.privileged

ATTACHMENT = {"network": "lognet", "container": "c1", "ifname": "eth0"}


def _bridge(tmp_path: Any) -> dict[str, Any]:
    ipam = {"type": "host-local", "dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": "198.18.94.0/24"}]]}
    return {"cniVersion": "1.0.0", "name": "lognet", "type": "bridge", "bridge": "plog1", "ipMasq": True, "ipam": ipam}


def _env(command: str, ctr: str, **extra: str) -> dict[str, str]:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": ctr, "CNI_IFNAME": "eth0"}
    return {**env, "CNI_PATH": "/usr/lib/cni", **extra}


def _as_skel_prints(stdout: bytes) -> bytes:
    # A 1.x result as Go's skel prints it: MarshalIndent, 4 spaces, sorted keys, no newline.
    return go_escape(json.dumps(json.loads(stdout), indent=4, sort_keys=True)).encode()


def test_log_level_debug_through_a_shim_without_daemon_logs_to_stderr_and_stdout_is_the_result(
    bindir, host_ns, make_netns, sock_dir, tmp_path
):
    ctr = make_netns("c")
    nowhere = os.path.join(sock_dir, "none.sock")
    debug = call(
        bindir, "bridge", _env("ADD", ctr.path, PYCNI_LOG_LEVEL="debug"), _bridge(tmp_path), host=host_ns.path,
        socket_path=nowhere,
    )  # fmt: skip
    assert debug.status == 0, debug
    assert debug.stdout == _as_skel_prints(debug.stdout)
    assert json.loads(debug.stdout)["ips"][0]["address"] == "198.18.94.2/24"
    lines = debug.stderr.decode().splitlines()
    fields = "network=lognet container=c1 ifname=eth0 plugin=bridge command=ADD"
    for change in ("netlink link add ifname=plog1 kind=bridge", "netlink addr add", "nft transaction", "sysctl "):
        assert any(change in line and line.endswith(fields) for line in lines), (change, lines)

    quiet = call(bindir, "bridge", _env("DEL", ctr.path), _bridge(tmp_path), host=host_ns.path, socket_path=nowhere)
    assert (quiet.status, quiet.stdout, quiet.stderr) == (0, b"", b"")


def test_a_daemon_leaves_a_caller_asking_for_debug_to_its_shim(bindir, daemon, host_ns, make_netns, tmp_path):
    ctr = make_netns("c")
    env = _env("ADD", ctr.path, PYCNI_LOG_LEVEL="debug")
    out = call(bindir, "bridge", env, _bridge(tmp_path), host=host_ns.path, socket_path=daemon.socket)
    assert out.status == 0, out
    assert b"DEBUG pycni_plugins.kernel: netlink link add" in out.stderr
    assert daemon.requests(1) and "fallback (PYCNI_LOG_LEVEL asks for the plugin's own log" in daemon.requests(1)[0]


def test_serve_json_lines_parse_and_carry_the_attachment(bindir, start_daemon, host_ns, make_netns, tmp_path):
    daemon = start_daemon("--log-format", "json", env={"PYCNI_LOG_LEVEL": "debug"})
    ctr = make_netns("c")
    out = call(bindir, "bridge", _env("ADD", ctr.path), _bridge(tmp_path), host=host_ns.path, socket_path=daemon.socket)
    assert out.status == 0, out
    assert out.stderr == b""
    daemon.stop()
    lines = [json.loads(line) for line in daemon.log().splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    kernel = [line for line in lines if line["logger"] == "pycni_plugins.kernel"]
    assert kernel and all(line["level"] == "debug" and ATTACHMENT.items() <= line.items() for line in kernel)
    assert any(line["message"].startswith("netlink link add ifname=plog1 kind=bridge") for line in kernel)
    served = [line for line in lines if line["logger"] == "pycni.serve" and line["message"].startswith("bridge ADD c1")]
    assert len(served) == 1 and served[0]["level"] == "info"


@pytest.mark.parametrize("where", ["path", "abstract"])
def test_serve_tells_the_notify_socket_it_is_ready_once_it_listens(where, start_daemon, host_ns, sock_dir):
    # The daemon's namespace is the throwaway host's: an abstract address lives there.
    name = f"@pycni-test-{uuid.uuid4().hex}" if where == "abstract" else os.path.join(sock_dir, "notify")

    def bind() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind("\0" + name[1:] if name.startswith("@") else name)
        return sock

    receiver = netns.run_in(host_ns.path, bind)
    with receiver:
        receiver.settimeout(30)
        daemon = start_daemon(env={"NOTIFY_SOCKET": name})  # returns once the socket answers
        assert receiver.recv(4096) == b"READY=1"
        from pycni_plugins.serve.sockets import check

        assert check(daemon.socket)[0]
    daemon.stop()
    assert "cannot notify" not in daemon.log()

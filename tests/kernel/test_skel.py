"""Built-in plugins exec'd as CNI binaries: VERSION, results, errors, env checks."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.privileged


@pytest.fixture
def bindir(tmp_path):
    from pycni_plugins.install import install

    d = tmp_path / "bin"
    install(str(d), ["loopback", "bridge", "host-local", "portmap", "firewall"])
    return d


def _run(bindir, plugin: str, env: dict, stdin: dict | str, pass_fds=()) -> tuple[int, str]:
    data = stdin if isinstance(stdin, str) else json.dumps(stdin)
    full = {"PATH": os.environ["PATH"], "PYCNI_STATE_DIR": os.environ["PYCNI_STATE_DIR"], **env}
    p = subprocess.run([str(bindir / plugin)], input=data.encode(), capture_output=True, env=full, pass_fds=pass_fds)
    return p.returncode, p.stdout.decode()


def test_version(bindir):
    rc, out = _run(bindir, "bridge", {"CNI_COMMAND": "VERSION"}, "")
    assert rc == 0 and out.endswith("}\n")
    assert json.loads(out)["supportedVersions"][-1] == "1.1.0"


@pytest.mark.parametrize(
    ("env", "stdin", "code", "msg"),
    [
        (
            {"CNI_COMMAND": "ADD"},
            "{}",
            4,
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing",
        ),
        ({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"}, "nope", 6, None),
        (
            {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a b", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"},
            {"name": "n"},
            4,
            "invalid characters in containerID",
        ),
        (
            {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"},
            {"name": "x y"},
            7,
            "invalid characters found in network name",
        ),
        ({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a", "CNI_IFNAME": "e/0", "CNI_PATH": "/x"}, {"name": "n"}, 4, None),
        # an 18-byte, 9-character name: counted in bytes, as the kernel does
        (
            {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a", "CNI_IFNAME": "é" * 9, "CNI_PATH": "/x"},
            {"name": "n"},
            4,
            "interface name is too long",
        ),
        # the strict decoder the runtime uses: no NaN/Infinity, deep nesting is a decode error
        (
            {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"},
            '{"name": "n", "mtu": NaN}',
            6,
            None,
        ),
        (
            {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"},
            '{"name": "n", "x": ' + "[" * 100000 + "]" * 100000 + "}",
            6,
            None,
        ),
        # IDs whose cache file name <network>-<id>-<ifname> cannot exist (4100 bytes: far above a file name's 255)
        (
            {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c" * 4100, "CNI_IFNAME": "eth0", "CNI_PATH": "/x"},
            {"name": "n"},
            4,
            "containerID is too long",
        ),
        (
            {
                "CNI_COMMAND": "ADD",
                "CNI_CONTAINERID": "c" * 249,
                "CNI_NETNS": "/x",
                "CNI_IFNAME": "eth0",
                "CNI_PATH": "/x",
            },
            {"name": "n"},
            4,
            "containerID is too long",
        ),
        (
            {"CNI_COMMAND": "BOGUS", "CNI_PATH": "/x"},
            {"name": "n", "cniVersion": "1.0.0"},
            4,
            "unknown CNI_COMMAND: BOGUS",
        ),
        (
            {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"},
            {"name": "n", "cniVersion": "9.0.0"},
            1,
            "incompatible CNI versions",
        ),
    ],
)
def test_errors_are_cni_error_json(bindir, env, stdin, code, msg):
    rc, out = _run(bindir, "bridge", env, stdin)
    assert rc == 1 and not out.endswith("\n")
    err = json.loads(out)
    assert err["code"] == code
    if msg:
        assert err["msg"] == msg


def test_a_lone_surrogate_in_an_error_is_printed_as_go_does(bindir):
    """A ``\\ud800`` escape in the config reaches the message; it is printed as U+FFFD (Go's
    encoder), not a UnicodeEncodeError traceback with nothing on stdout (found by pycni fuzz)."""
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "a", "CNI_IFNAME": "eth0", "CNI_PATH": "/x"}
    rc, out = _run(bindir, "host-local", env, '{"name": "n", "cniVersion": "\\ud800"}')
    err = json.loads(out)
    assert rc == 1 and err["code"] == 1 and err["msg"] == "incompatible CNI versions"
    assert err["details"].startswith('config is "\ufffd", plugin supports')


def test_exec_add_check_del(bindir, host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    fd = os.open(ctr.path, os.O_RDONLY)
    try:
        nspath = f"/proc/self/fd/{fd}"
        env = {"CNI_CONTAINERID": "x1", "CNI_NETNS": nspath, "CNI_IFNAME": "eth0", "CNI_PATH": str(bindir)}
        conf = kit.bridge_conf(tmp_path, [{"subnet": "10.77.0.0/24"}])
        rc, out = _run(bindir, "bridge", {**env, "CNI_COMMAND": "ADD"}, conf, (fd,))
        assert rc == 0, out
        assert not out.endswith("\n") and out.startswith('{\n    "cniVersion": "1.0.0",\n    "interfaces"')
        result = json.loads(out)
        assert result["ips"][0]["address"] == "10.77.0.2/24"
        rc, out = _run(bindir, "bridge", {**env, "CNI_COMMAND": "CHECK"}, {**conf, "prevResult": result}, (fd,))
        assert (rc, out) == (0, "")
        lo = {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}
        rc, out = _run(bindir, "loopback", {**env, "CNI_COMMAND": "ADD", "CNI_IFNAME": "lo"}, lo, (fd,))
        assert rc == 0 and json.loads(out)["interfaces"][0]["name"] == "lo"
        for _ in range(2):
            rc, out = _run(bindir, "bridge", {**env, "CNI_COMMAND": "DEL"}, conf, (fd,))
            assert (rc, out) == (0, "")
        assert "eth0" not in kit.links_in(ctr.path)
    finally:
        os.close(fd)


def test_same_netns_is_refused(bindir, host, kit, tmp_path):
    lo = {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "x",
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_IFNAME": "lo",
        "CNI_PATH": "/x",
    }
    rc, out = _run(bindir, "loopback", env, lo)
    assert rc == 1 and json.loads(out)["msg"] == "plugin's netns and netns from CNI_NETNS should not be the same"

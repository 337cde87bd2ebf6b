"""``pycni serve`` behind the shims: the answers are the plugin's own, byte for byte, and the
daemon acts in the caller's namespaces, never its own."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from pycni import netns
from pycni.sdk import Attachment
from tests.helpers import crashing

from .conftest import Outcome, call

pytestmark = pytest.mark.privileged

V = "1.0.0"
SUBNET = "198.18.91.0/24"
ONE_IP = "198.18.91.10"  # a one-address range: host-local hands out the same one every time


def _confs(tmp_path: Any) -> dict[str, dict[str, Any]]:
    ipam = {
        "type": "host-local",
        "dataDir": str(tmp_path / "ipam"),
        "ranges": [[{"subnet": SUBNET, "rangeStart": ONE_IP, "rangeEnd": ONE_IP, "gateway": "198.18.91.1"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    base = {"cniVersion": V, "name": "srvnet"}
    return {
        "loopback": {**base, "type": "loopback"},
        "bridge": {**base, "type": "bridge", "bridge": "psrv0", "isGateway": True, "ipMasq": True, "ipam": ipam},
        "firewall": {**base, "type": "firewall", "backend": "iptables"},
        "portmap": {
            **base,
            "type": "portmap",
            "capabilities": {"portMappings": True},
            "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},
        },
        "host-local": {**base, "type": "host-local", "ipam": ipam},
    }


def _env(command: str, ctr: str = "", cid: str = "c1") -> dict[str, str]:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": ctr,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
    }


def _chain_pass(bindir: str, confs: dict[str, dict[str, Any]], host: str, ctr: str, **kw: Any) -> list[Outcome]:
    """ADD, CHECK, DEL of loopback → bridge → firewall → portmap, then GC and STATUS of each,
    and host-local on its own: every answer, in order."""
    out: list[Outcome] = []
    chain = ("loopback", "bridge", "firewall", "portmap")
    prev: dict[str, Any] | None = None
    results: dict[str, Any] = {}
    for plugin in chain:
        conf = dict(confs[plugin], **({"prevResult": prev} if prev else {}))
        o = call(bindir, plugin, _env("ADD", ctr), conf, host=host, **kw)
        out.append(o)
        assert o.status == 0, o
        results[plugin] = prev = o.json()
    for plugin in chain:
        o = call(bindir, plugin, _env("CHECK", ctr), dict(confs[plugin], prevResult=prev), host=host, **kw)
        out.append(o)
        assert o.status == 0, o
    for plugin in reversed(chain):
        out.append(call(bindir, plugin, _env("DEL", ctr), dict(confs[plugin], prevResult=prev), host=host, **kw))
        assert out[-1].status == 0, out[-1]
    for plugin in (*chain, "host-local"):
        gc = dict(confs[plugin], cniVersion="1.1.0", **{"cni.dev/valid-attachments": []})
        out.append(call(bindir, plugin, {"CNI_COMMAND": "GC", "CNI_PATH": "/usr/lib/cni"}, gc, host=host, **kw))
        status = dict(confs[plugin], cniVersion="1.1.0")
        out.append(call(bindir, plugin, {"CNI_COMMAND": "STATUS", "CNI_PATH": "/usr/lib/cni"}, status, host=host, **kw))
    for command in ("ADD", "CHECK", "DEL"):
        conf = dict(confs["host-local"])
        if command == "CHECK":
            conf["prevResult"] = json.loads(out[-1].stdout)
        out.append(call(bindir, "host-local", _env(command, ctr), conf, host=host, **kw))
    return out


def _normalised(outcomes: list[Outcome]) -> list[tuple[int, bytes, bytes]]:
    """The answers with what bridge ADD randomises by design (host veth name, both veth MACs)
    replaced by placeholders: everything else must match byte for byte."""
    bridge_add = outcomes[1].json()
    randoms = []
    for iface in bridge_add["interfaces"]:
        if iface["name"] != "psrv0":
            randoms.append(iface["mac"])
            if "sandbox" not in iface:
                randoms.append(iface["name"])
    assert len(randoms) == 3, bridge_add
    fixed = []
    for o in outcomes:
        out = o.stdout
        for n, value in enumerate(randoms):
            out = out.replace(value.encode(), f"<random{n}>".encode())
        fixed.append((o.status, out, o.stderr))
    return fixed


def test_every_plugin_and_command_answers_as_the_plugin_run_without_the_daemon(
    daemon, bindir, make_netns, host_ns, tmp_path
):
    ctr = make_netns("ctr").path
    confs = _confs(tmp_path)
    served = _chain_pass(bindir, confs, host_ns.path, ctr, socket_path=daemon.socket, mode="required")
    local = _chain_pass(bindir, confs, host_ns.path, ctr, socket_path=daemon.socket, mode="off")
    assert _normalised(served) == _normalised(local)
    lines = daemon.requests(len(served))
    assert len(lines) == len(served), lines
    assert all(" ok " in line for line in lines), lines
    assert lines[0].startswith("loopback ADD c1 ok ")


@pytest.mark.parametrize("plugin", ["loopback", "bridge", "firewall", "portmap", "host-local"])
def test_errors_are_the_plugins_own_bytes(daemon, bindir, make_netns, host_ns, tmp_path, plugin):
    ctr = make_netns("ctr").path
    conf = _confs(tmp_path)[plugin]
    cases: list[tuple[dict[str, str], Any]] = [
        ({"CNI_COMMAND": "ADD"}, conf),  # required variables missing (4)
        (_env("DEL", ctr), "nope"),  # undecodable config (6)
        (_env("DEL", ctr, cid="a b"), conf),  # invalid container id (4)
        (_env("ADD", ctr), dict(conf, cniVersion="9.9.9")),  # incompatible version (1)
        (_env("CHECK", ctr), dict(conf, cniVersion="0.3.1")),  # no CHECK before 0.4.0
        (_env("BOGUS", ctr), conf),  # unknown command (4)
        (_env("ADD", host_ns.path), conf),  # the caller's own namespace as the container's
        (dict(_env("ADD", ctr), CNI_IFNAME="e/0"), conf),
        ({**_env("ADD", ctr), "CNI_ARGS": "K=V"}, conf),
    ]
    if plugin in ("loopback", "bridge"):
        cases.append((_env("ADD", str(tmp_path / "gone")), conf))  # CNI_NETNS missing: the plugin's ENOENT
        cases.append((_env("CHECK", str(tmp_path / "gone")), dict(conf, prevResult={"cniVersion": V})))
    for env, stdin in cases:
        served = call(bindir, plugin, env, stdin, host=host_ns.path, socket_path=daemon.socket, mode="required")
        local = call(bindir, plugin, env, stdin, host=host_ns.path, socket_path=daemon.socket, mode="off")
        assert served == local, (env, stdin)
    assert len(daemon.requests(len(cases))) == len(cases)


def test_a_crashing_plugin_answers_error_999_as_the_plugin_run_without_the_daemon(
    start_daemon, make_netns, host_ns, tmp_path
):
    env = crashing.register(tmp_path / "crashing")
    daemon = start_daemon(env=env)
    bindir = str(tmp_path / "crashing" / "bin")
    conf = {"cniVersion": V, "name": "srvnet", "type": crashing.TYPE}
    args = (bindir, crashing.TYPE, _env("ADD", make_netns("ctr").path), conf)
    served = call(*args, host=host_ns.path, socket_path=daemon.socket, mode="required")
    local = call(*args, host=host_ns.path, socket_path=daemon.socket, mode="off")
    assert served == local
    assert (served.status, served.json()) == (1, crashing.ERROR)
    assert served.stderr.decode().endswith("RuntimeError: bug: no such key\n"), "the traceback, on stderr"
    (line,) = daemon.requests(1)
    assert " error (code 999) " in line


def test_a_netns_path_that_is_no_namespace_is_left_to_the_plugin_run_by_the_shim(daemon, bindir, host_ns, tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("")
    conf = _confs(tmp_path)["loopback"]
    served = call(bindir, "loopback", _env("ADD", str(plain)), conf, host=host_ns.path, socket_path=daemon.socket)
    local = call(bindir, "loopback", _env("ADD", str(plain)), conf, host=host_ns.path, mode="off")
    assert served == local and served.status == 1
    assert b"not a network namespace" in served.stdout
    assert daemon.requests() == []
    required = call(
        bindir, "loopback", _env("ADD", str(plain)), conf, host=host_ns.path, socket_path=daemon.socket, mode="required"
    )
    assert required.status == 1 and required.json()["code"] == 11


def test_the_daemon_acts_in_the_callers_namespaces_not_its_own(start_daemon, bindir, make_netns, tmp_path):
    from pyroute2 import IPRoute

    daemon_ns, caller_ns, ctr = make_netns("dhost"), make_netns("chost"), make_netns("ctr")
    daemon = start_daemon(host=daemon_ns.path)
    conf = _confs(tmp_path)["bridge"]
    o = call(
        bindir, "bridge", _env("ADD", ctr.path), conf, host=caller_ns.path, socket_path=daemon.socket, mode="required"
    )
    assert o.status == 0, o

    def links() -> set[str]:
        with IPRoute() as ipr:
            return {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}

    assert "psrv0" in netns.run_in(caller_ns.path, links)
    assert "psrv0" not in netns.run_in(daemon_ns.path, links)
    assert "eth0" in netns.run_in(ctr.path, links)
    o = call(
        bindir, "bridge", _env("DEL", ctr.path), conf, host=caller_ns.path, socket_path=daemon.socket, mode="required"
    )
    assert o.status == 0, o
    assert netns.run_in(ctr.path, links) == {"lo"}
    assert os.path.exists(daemon.socket)


def test_one_worker_serving_callers_of_two_hosts_in_turn_acts_in_each_callers_namespace(
    start_daemon, bindir, make_netns, tmp_path
):
    """The worker keeps its netlink socket between requests: a request from another host
    namespace, or after a failed request, must still act in its own caller's namespace."""
    from pyroute2 import IPRoute

    host_a, host_b = make_netns("hosta"), make_netns("hostb")
    ctr_a, ctr_b = make_netns("ctr"), make_netns("ctr")
    daemon = start_daemon("--workers", "1", host=host_a.path)
    conf_a = _confs(tmp_path)["bridge"]
    conf_b = {**conf_a, "ipam": {**conf_a["ipam"], "dataDir": str(tmp_path / "ipam-b")}}
    broken = {**conf_a, "bridge": "lo"}  # not a bridge: refused after the host's links are read

    def run(command: str, ctr: str, conf: dict[str, Any], host: str, cid: str) -> Outcome:
        return call(
            bindir, "bridge", _env(command, ctr, cid), conf, host=host, socket_path=daemon.socket, mode="required"
        )

    def links(path: str) -> set[str]:
        def body() -> set[str]:
            with IPRoute() as ipr:
                return {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}

        return netns.run_in(path, body)

    assert run("ADD", ctr_a.path, conf_a, host_a.path, "a").status == 0
    failed = run("ADD", ctr_b.path, broken, host_b.path, "x")
    assert failed.status == 1 and "lo" in failed.json()["msg"], failed
    assert run("ADD", ctr_b.path, conf_b, host_b.path, "b").status == 0
    assert "psrv0" in links(host_a.path) and "psrv0" in links(host_b.path)
    assert len(links(host_a.path)) == len(links(host_b.path)) == 3  # lo, the bridge, one veth each
    assert links(ctr_a.path) == links(ctr_b.path) == {"lo", "eth0"}
    assert run("DEL", ctr_a.path, conf_a, host_a.path, "a").status == 0
    assert run("DEL", ctr_b.path, conf_b, host_b.path, "b").status == 0
    assert links(ctr_a.path) == links(ctr_b.path) == {"lo"}
    assert [line.split()[3] for line in daemon.requests(5)] == ["ok", "error", "ok", "ok", "ok"]


def test_the_daemon_keeps_records_in_the_state_dir_the_caller_forwards(
    daemon, bindir, make_netns, host_ns, tmp_path, state_dir
):

    ctr = make_netns("ctr")
    conf = _confs(tmp_path)["bridge"]
    mine = str(tmp_path / "caller-state")
    key = Attachment("srvnet", "c1", "eth0").key
    for command in ("ADD", "DEL"):
        env = {**_env(command, ctr.path), "PYCNI_STATE_DIR": mine}
        o = call(bindir, "bridge", env, conf, host=host_ns.path, socket_path=daemon.socket, mode="required")
        assert o.status == 0, o
        if command == "ADD":
            assert os.listdir(os.path.join(mine, "bridge")) == [key]
            assert sorted(os.listdir(os.path.join(mine, "nft"))) == sorted(["epoch", f"{key}.masq"])
    assert os.listdir(os.path.join(mine, "bridge")) == []
    assert not os.path.exists(state_dir), "the daemon's own $PYCNI_STATE_DIR was not used"
    assert len(daemon.requests(2)) == 2

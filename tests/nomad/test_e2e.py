"""Nomad end to end: a Connect allocation with transparent proxy on the bridge network, for real.

Everything runs in throwaway namespaces: a "host" namespace the in-process plugins run in (it
holds the node's address, where "Consul DNS" listens) and the task's namespace. The configurator
gets the embedded bridge conflist (with consul-cni, since the group uses transparent proxy);
host-local's dataDir, the results cache and pycni's state dir are temp directories.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

from pycni import netns
from pycni.errors import CNIError
from pycni.nomad import bridge as nomad_bridge
from pycni.nomad.bridge import BridgeNetworkConfigurator
from pycni.nomad.cleanup import CleanupReport, force_cleanup, masquerade_chain, masquerade_comment
from pycni.nomad.configurator import make_client
from pycni.nomad.errors import CheckFailedError
from pycni.nomad.models import Allocation, Node
from pycni.sdk import default_state_dir
from pycni_plugins.nomad import remove_container
from tests.helpers import kernel
from tests.helpers.traffic import listening, tcp_as, udp_query

from .conftest import fixture_json

pytestmark = pytest.mark.privileged

SUBNET = ipaddress.ip_network("172.26.64.0/20")
GATEWAY = "172.26.64.1"
NODE_IP = "10.0.2.15"  # the node's address and Consul DNS (unique.consul.dns.addr, port 8600)
PROXY_UID, ORDINARY_UID, EXCLUDED_UID = 101, 65534, 1000


def alloc_json() -> dict[str, Any]:
    """The Connect/tproxy fixture plus a dynamic port whose container port differs (http → 8080)."""
    doc = fixture_json("connect_tproxy_alloc.json")
    http = {"Label": "http", "Value": 23456, "To": 8080}
    doc["AllocatedResources"]["Shared"]["Ports"].append({**http, "HostIP": NODE_IP, "IgnoreCollision": False})
    doc["AllocatedResources"]["Shared"]["Networks"][0]["DynamicPorts"].append({**http, "HostNetwork": "default"})
    return doc


@attrs.define
class Env:
    host: str
    task: str
    tmp: Path
    alloc: Allocation
    node: Node

    @property
    def cache_dir(self) -> str:
        return str(self.tmp / "cache")

    def client(self) -> Any:
        return make_client("/usr/lib/cni", cache_dir=self.cache_dir, backend="inprocess", host_netns=self.host)

    def configurator(self, client: Any = None, node: Node | None = None) -> BridgeNetworkConfigurator:
        own_state = functools.partial(remove_container, state_dir=default_state_dir())
        cleanup = functools.partial(force_cleanup, host_netns=self.host, own_state=own_state)
        return BridgeNetworkConfigurator.for_alloc(
            client or self.client(),
            self.alloc,
            node or self.node,
            host_netns=self.host,
            cleanup=cleanup,
            sleep=lambda _: None,
        )


def _node_address(address: str) -> None:
    """The node's address, local in the host namespace (on ``lo``: no dummy module needed)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.addr("add", index=ipr.link_lookup(ifname="lo")[0], address=address, prefixlen=32)


@pytest.fixture
def env(make_netns: Callable[[str], netns.Throwaway], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    host, task = make_netns("host"), make_netns("task")
    netns.run_in(host.path, _node_address, NODE_IP)
    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "state"))
    ipam = str(tmp_path / "ipam")
    real = nomad_bridge.bridge_conflist
    # The embedded conflist keeps leases in /var/run/cni: point host-local at a temp dir instead.
    monkeypatch.setattr(
        nomad_bridge, "bridge_conflist", lambda conf: real(conf).replace(b'"/var/run/cni"', json.dumps(ipam).encode())
    )
    yield Env(
        host.path, task.path, tmp_path, Allocation.from_json(alloc_json()), Node.from_json(fixture_json("node.json"))
    )


# -- what must be gone after teardown ----------------------------------------------------------


def pycni_elements(path: str, needle: str) -> list[str]:
    """Comments of pycni's nft elements in the namespace that mention ``needle``."""
    out = []
    for obj in _nft_json(path):
        body = obj.get("set") or obj.get("map") or {}
        for elem in body.get("elem", ()):
            key = elem[0] if isinstance(elem, list) else elem
            comment = key.get("elem", {}).get("comment", "") if isinstance(key, dict) else ""
            if needle in comment:
                out.append(f"{body['name']}: {comment}")
    return out


def _nft_json(path: str) -> list[dict[str, Any]]:
    def read() -> list[dict[str, Any]]:
        from pycni._libnftables import Nftables

        rc, out, err = Nftables().json_cmd({"nftables": [{"list": {"ruleset": None}}]})
        assert rc == 0, err
        return out["nftables"]

    return netns.run_in(path, read)


def leftovers(env: Env) -> dict[str, list[str]]:
    """The alloc's host-side state: veths, IPAM leases, pycni nft elements and records, cache files."""
    alloc_id = env.alloc.id
    return {
        "veths": [name for name, link in kernel.links(env.host).items() if link["kind"] == "veth"],
        "leases": [n for n in _names(env.tmp / "ipam" / "nomad") if _is_ip(n)],
        "elements": pycni_elements(env.host, alloc_id),
        "records": [n for n in _names(env.tmp / "state" / "nft") if n != "epoch"],
        "cache": [n for n in _names(Path(env.cache_dir) / "results") if alloc_id in n],
    }


def assert_nothing_left(env: Env) -> None:
    assert leftovers(env) == {"veths": [], "leases": [], "elements": [], "records": [], "cache": []}


def _names(path: Path) -> list[str]:
    return os.listdir(path) if path.exists() else []


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def tproxy_table(path: str) -> str:
    return kernel.nft_ruleset(path)


# -- the allocation's life ----------------------------------------------------------------------


def test_setup_traffic_restore_and_teardown(env: Env) -> None:
    conf = env.configurator()
    status = conf.setup(env.alloc, env.task, created=True)
    assert status is not None
    assert status.interface_name == "eth0"
    address = ipaddress.ip_address(status.address)
    assert address in SUBNET and str(address) != GATEWAY
    assert status.dns is not None and status.dns.servers == (NODE_IP,)  # the node's Consul DNS

    assert all(leftovers(env).values()), leftovers(env)  # what teardown must remove is there

    # consul-cni ran in the task's namespace; NOMAD-ADMIN accepts forwarding to the subnet.
    assert "table ip pycni_tproxy" in tproxy_table(env.task)
    host_rules = kernel.nft_ruleset(env.host)
    assert 'oifname "nomad" ip daddr 172.26.64.0/20 counter name' in host_rules

    # Host ports reach the task: excluded ports (metrics, the exposed check) directly, the rest
    # through Envoy's inbound listener, which sees where the connection was going.
    with listening(
        (env.task, "0.0.0.0", 9102, "metrics"),
        (env.task, "0.0.0.0", 25318, "health"),
        (env.task, "0.0.0.0", 8080, "app"),
        (env.task, "0.0.0.0", 28734, "envoy-inbound"),
    ):
        assert tcp_as(env.host, 0, GATEWAY, 9102) == "metrics -"
        assert tcp_as(env.host, 0, "127.0.0.1", 9102) == "metrics -"
        assert tcp_as(env.host, 0, GATEWAY, 25318) == "health -"
        assert tcp_as(env.host, 0, GATEWAY, 28734) == "envoy-inbound -"
        assert tcp_as(env.host, 0, "127.0.0.1", 23456) == f"envoy-inbound {address}:8080"

    # Outbound from the task: an ordinary UID lands on Envoy's outbound port; Envoy's UID, the
    # excluded UID, port (8500) and CIDR (10.0.0.0/8) go direct; DNS goes to Consul DNS.
    with listening(
        (env.task, "0.0.0.0", 15001, "envoy-outbound"),
        (env.host, "0.0.0.0", 80, "host"),
        (env.host, "0.0.0.0", 8500, "host"),
        (env.host, NODE_IP, 8600, "consul-dns", True),
        (env.host, NODE_IP, 53, "not-consul", True),
    ):
        assert tcp_as(env.task, ORDINARY_UID, GATEWAY, 80) == f"envoy-outbound {GATEWAY}:80"
        assert tcp_as(env.task, PROXY_UID, GATEWAY, 80) == "host -"
        assert tcp_as(env.task, EXCLUDED_UID, GATEWAY, 80) == "host -"
        assert tcp_as(env.task, ORDINARY_UID, GATEWAY, 8500) == "host -"
        assert tcp_as(env.task, ORDINARY_UID, NODE_IP, 80) == "host -"
        assert udp_query(env.task, NODE_IP, 53) == "consul-dns"

    # Restore: the namespace exists, bridge plugin >= 1.3.0, so CHECK runs (and passes).
    assert conf.setup(env.alloc, env.task, created=False) is None
    # A broken tproxy table fails the CHECK (Nomad then recreates the namespace) ...
    netns.run_in(env.task, _delete_tproxy_table)
    with pytest.raises(CheckFailedError) as info:
        conf.setup(env.alloc, env.task, created=False)
    assert str(info.value).startswith("network namespace already exists but was misconfigured: ")
    assert "consul-cni: table ip pycni_tproxy not found" in str(info.value)
    # ... but with an older bridge plugin nothing is checked.
    old = Node.from_json({**fixture_json("node.json"), "Attributes": {"plugins.cni.version.bridge": "v1.2.0"}})
    assert env.configurator(node=old).setup(env.alloc, env.task, created=False) is None

    assert conf.teardown(env.alloc, env.task) is None
    assert_nothing_left(env)
    assert "pycni_tproxy" not in tproxy_table(env.task)


def _delete_tproxy_table() -> None:
    from pycni_plugins.kernel import nft

    nft.run(["delete table ip pycni_tproxy"])


def test_cli_setup_and_teardown(env: Env, tmp_path: Path) -> None:
    alloc_file, node_file = tmp_path / "alloc.json", tmp_path / "node.json"
    alloc_file.write_text(json.dumps(alloc_json()))
    node_file.write_text(json.dumps(fixture_json("node.json")))
    common = ["--alloc", str(alloc_file), "--node", str(node_file), "--netns", env.task, "--host-netns", env.host]
    common += ["--backend", "inprocess", "--cache-dir", env.cache_dir, "--cni-path", "/usr/lib/cni"]

    from pycni.cli import cli

    runner = CliRunner()
    done = runner.invoke(cli, ["nomad", "setup", *common], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    status = json.loads(done.output)
    assert status["InterfaceName"] == "eth0" and ipaddress.ip_address(status["Address"]) in SUBNET
    assert status["DNS"]["Servers"] == [NODE_IP]
    with listening((env.task, "0.0.0.0", 9102, "metrics")):
        assert tcp_as(env.host, 0, GATEWAY, 9102) == "metrics -"

    done = runner.invoke(cli, ["nomad", "setup", "--existing", *common], catch_exceptions=False)
    assert done.exit_code == 0 and json.loads(done.output) is None, done.output

    done = runner.invoke(cli, ["nomad", "teardown", *common], catch_exceptions=False)
    assert done.exit_code == 0 and json.loads(done.output) is None, done.output
    assert_nothing_left(env)


# -- forced cleanup ---------------------------------------------------------------------------


class RemoveFails:
    """The real client, except that DEL fails (as when the netns vanished underneath Nomad)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def remove(self, *args: Any) -> None:
        raise CNIError('plugin type="bridge" failed (delete): failed to Statfs "/proc/4242/ns/net"')


def _iptables(ns: str, *args: str) -> None:
    name = os.path.basename(ns)
    done = subprocess.run(["ip", "netns", "exec", name, "iptables", "-w", "-t", "nat", *args], capture_output=True)
    assert done.returncode == 0, done.stderr


def _plant_reference_rules(ns: str, alloc_id: str, ip: str) -> str:
    """What the reference bridge plugin (ipMasq) leaves for the alloc, in iptables-nft."""
    chain, comment = masquerade_chain("nomad", alloc_id), masquerade_comment("nomad", alloc_id)
    _iptables(ns, "-N", chain)
    _iptables(ns, "-A", chain, "-d", f"{ip}/20", "-j", "ACCEPT", "-m", "comment", "--comment", comment)
    _iptables(ns, "-A", chain, "!", "-d", "224.0.0.0/4", "-j", "MASQUERADE", "-m", "comment", "--comment", comment)
    _iptables(ns, "-A", "POSTROUTING", "-s", ip, "-j", chain, "-m", "comment", "--comment", comment)
    return chain


def test_forced_cleanup_removes_the_leftovers_of_a_failed_teardown(env: Env) -> None:
    status = env.configurator().setup(env.alloc, env.task, created=True)
    assert status is not None
    alloc_id = env.alloc.id
    assert pycni_elements(env.host, alloc_id)  # masquerade, host ports, hairpin, firewall
    chain = _plant_reference_rules(env.host, alloc_id, status.address)

    report = env.configurator(client=RemoveFails(env.client())).teardown(env.alloc, env.task)

    assert isinstance(report, CleanupReport) and report.alloc_id == alloc_id and report.network == "nomad"
    removed = "\n".join(report.removed)
    assert "ip nat POSTROUTING rule handle" in removed and f"ip nat chain {chain} (2 rules)" in removed
    for what in (f"masq4 element {status.address}", "hostports4 element tcp . 9102", "firewall4 element"):
        assert what in removed, removed
    assert "pycni state record nft/" in removed
    assert pycni_elements(env.host, alloc_id) == []
    saved = subprocess.run(
        ["ip", "netns", "exec", os.path.basename(env.host), "iptables-save", "-t", "nat"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert chain not in saved

    # The real DEL still works afterwards and takes the rest (veth, lease, cache).
    assert env.configurator().teardown(env.alloc, env.task) is None
    assert_nothing_left(env)

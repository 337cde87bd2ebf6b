"""Nomad's ``ensureForwardingRules``: NOMAD-ADMIN accepts forwarding to the bridge's subnets.

pycni's admin chains live in ``table inet pycni`` (the firewall plugin's); the rule is appended
by one transaction that is a no-op when the rule is already there, even under concurrency.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from pycni import netns
from pycni.errors import ConfigError
from pycni.nomad.bridge import BridgeNetworkConfigurator, ensure_forwarding_rules
from pycni.nomad.conflist import ADMIN_CHAIN, NomadBridgeConfig
from pycni.nomad.errors import ForwardingRulesError
from pycni.nomad.models import Allocation, Node
from pycni_plugins.nomad import forwarding_rule_commands

from .conftest import fixture_json


def test_the_transaction() -> None:
    commands = forwarding_rule_commands(ADMIN_CHAIN, "nomad", "172.26.64.0/20", 4)
    counter = commands[0].split()[-1]
    assert re.fullmatch(r"nomad-admin-4-[0-9a-f]{16}", counter)
    assert commands == [
        f"add counter inet pycni {counter}",
        f"delete counter inet pycni {counter}",  # EBUSY while a rule uses it: then nothing changes
        f"add counter inet pycni {counter}",
        f'add rule inet pycni NOMAD-ADMIN oifname "nomad" ip daddr 172.26.64.0/20 counter name "{counter}" accept'
        ' comment "-o nomad -d 172.26.64.0/20 -j ACCEPT"',
    ]
    v6 = forwarding_rule_commands(ADMIN_CHAIN, "nomad", "fd00:a::1/64", 6)[-1]
    assert "ip6 daddr fd00:a::/64" in v6  # host bits masked, as iptables does


@pytest.mark.parametrize(
    ("bridge", "subnet", "version", "message"),
    [
        ("nomad", "a.b.c.d/z", 4, 'invalid IPv4 subnet "a.b.c.d/z"'),
        ("nomad", "fd00::/64", 4, 'invalid IPv4 subnet "fd00::/64"'),
        ("nomad", "172.26.64.0/20", 6, 'invalid IPv6 subnet "172.26.64.0/20"'),
        ('bad"', "172.26.64.0/20", 4, 'invalid bridge name "bad""'),  # Nomad's bad_input golden
        ("a-very-long-bridge", "172.26.64.0/20", 4, 'invalid bridge name "a-very-long-bridge"'),
    ],
)
def test_inputs_are_validated(bridge: str, subnet: str, version: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ensure_forwarding_rules(bridge, subnet) if version == 4 else ensure_forwarding_rules(
            bridge, "10.0.0.0/8", subnet
        )
    assert info.value.msg == message


# -- in a namespace ------------------------------------------------------------------------------


def admin_rules(path: str) -> list[str]:
    """The NOMAD-ADMIN rules' comments (the iptables rule each stands for), in order."""

    def read() -> list[str]:
        from pycni._libnftables import Nftables

        rc, out, err = Nftables().json_cmd(
            {"nftables": [{"list": {"chain": {"family": "inet", "table": "pycni", "name": "NOMAD-ADMIN"}}}]}
        )
        assert rc == 0, err
        return [o["rule"].get("comment", "<admin>") for o in out["nftables"] if "rule" in o]

    return netns.run_in(path, read)


def nft(path: str, command: str) -> str:
    def run() -> str:
        from pycni._libnftables import Nftables

        rc, out, err = Nftables().cmd(command)
        assert rc == 0, err
        return out

    return netns.run_in(path, run)


@pytest.mark.privileged
def test_chain_and_rule_are_ensured_once(host_ns: netns.Throwaway) -> None:
    netns.run_in(host_ns.path, ensure_forwarding_rules, "nomad", "172.26.64.0/20", "")
    netns.run_in(host_ns.path, ensure_forwarding_rules, "nomad", "172.26.64.0/20", "")
    assert admin_rules(host_ns.path) == ["-o nomad -d 172.26.64.0/20 -j ACCEPT"]
    forward = nft(host_ns.path, "list chain inet pycni forward")
    assert forward.index("jump NOMAD-ADMIN") < forward.index("@firewall4 accept")  # admin chain first

    # Another bridge/subnet is another rule; IPv6 comes first, as in Nomad.
    netns.run_in(host_ns.path, ensure_forwarding_rules, "golden-gate", "10.1.0.0/16", "fd00:a::/64")
    assert admin_rules(host_ns.path) == [
        "-o nomad -d 172.26.64.0/20 -j ACCEPT",
        "-o golden-gate -d fd00:a::/64 -j ACCEPT",
        "-o golden-gate -d 10.1.0.0/16 -j ACCEPT",
    ]


@pytest.mark.privileged
def test_a_flushed_chain_gets_the_rule_back_after_the_admins_rules(host_ns: netns.Throwaway) -> None:
    netns.run_in(host_ns.path, ensure_forwarding_rules, "nomad", "172.26.64.0/20", "")
    nft(host_ns.path, "flush chain inet pycni NOMAD-ADMIN")
    nft(host_ns.path, 'add rule inet pycni NOMAD-ADMIN iifname "eth9" drop')
    netns.run_in(host_ns.path, ensure_forwarding_rules, "nomad", "172.26.64.0/20", "")
    netns.run_in(host_ns.path, ensure_forwarding_rules, "nomad", "172.26.64.0/20", "")
    assert admin_rules(host_ns.path) == ["<admin>", "-o nomad -d 172.26.64.0/20 -j ACCEPT"]


@pytest.mark.privileged
def test_concurrent_callers_add_one_rule(host_ns: netns.Throwaway) -> None:
    # Each thread has its own netlink socket: the commits really race in the kernel.
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker() -> None:
        try:
            with netns.entered(host_ns.path):
                start.wait()
                ensure_forwarding_rules("nomad", "172.26.64.0/20", "fd00:a::/64")
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert admin_rules(host_ns.path) == ["-o nomad -d fd00:a::/64 -j ACCEPT", "-o nomad -d 172.26.64.0/20 -j ACCEPT"]


# -- wired into the bridge configurator -----------------------------------------------------------


class RecordingClient:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def status(self) -> None:
        self.calls.append("status")

    def load(self, *opts: Any) -> None:
        self.calls.append("load")

    def setup(self, container_id: str, path: str, *ns_opts: Any) -> Any:
        from pycni.gocni_result import GoCNIResult
        from pycni.nomad.status import result_from_json

        self.calls.append("setup")
        result = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": path}]}
        result["ips"] = [{"address": "172.26.64.2/20", "interface": 0}]
        parsed = result_from_json(result)
        assert isinstance(parsed, GoCNIResult)
        return parsed

    def check(self, container_id: str, path: str, *ns_opts: Any) -> None:
        self.calls.append("check")

    def remove(self, container_id: str, path: str, *ns_opts: Any) -> None:
        self.calls.append("remove")


@pytest.mark.privileged
def test_setup_ensures_the_rule_first_and_wraps_its_errors(
    host_ns: netns.Throwaway, make_netns: Callable[[str], netns.Throwaway]
) -> None:
    alloc = Allocation.from_json(fixture_json("bridge_ports_alloc.json"))
    node = Node.from_json(fixture_json("node.json"))
    client = RecordingClient()
    conf = BridgeNetworkConfigurator(client, NomadBridgeConfig(), node, host_netns=host_ns.path)
    assert conf.network_name == "nomad" and b'"bridge": "nomad"' in conf.conf.list_bytes
    assert conf.setup(alloc, "/run/netns/x", created=True) is not None
    assert admin_rules(host_ns.path) == ["-o nomad -d 172.26.64.0/20 -j ACCEPT"]  # the client's defaults

    # Restore (CHECK) ensures it too; a bad subnet fails before any plugin runs.
    nft(host_ns.path, "flush chain inet pycni NOMAD-ADMIN")
    assert conf.setup(alloc, "/run/netns/x", created=False) is None
    assert admin_rules(host_ns.path) == ["-o nomad -d 172.26.64.0/20 -j ACCEPT"]

    other = make_netns("host2")
    bad = RecordingClient()
    broken = BridgeNetworkConfigurator(bad, NomadBridgeConfig(ipv4_subnet="a.b.c.d/z"), node, host_netns=other.path)
    with pytest.raises(ForwardingRulesError) as info:
        broken.setup(alloc, "/run/netns/x", created=True)
    assert str(info.value) == 'failed to initialize table forwarding rules: invalid IPv4 subnet "a.b.c.d/z"'
    assert bad.calls == []
    assert "pycni" not in nft(other.path, "list ruleset")


def test_for_alloc_adds_consul_cni_only_for_transparent_proxy() -> None:
    node = Node.from_json(fixture_json("node.json"))
    tproxy = Allocation.from_json(fixture_json("connect_tproxy_alloc.json"))
    plain = Allocation.from_json(fixture_json("bridge_ports_alloc.json"))
    with_tproxy = BridgeNetworkConfigurator.for_alloc(RecordingClient(), tproxy, node)
    without = BridgeNetworkConfigurator.for_alloc(
        RecordingClient(), plain, node, bridge_name="br9", subnet="10.9.0.0/24"
    )
    assert b'"type": "consul-cni"' in with_tproxy.conf.list_bytes
    assert b"consul-cni" not in without.conf.list_bytes
    assert (without.bridge.bridge_name, without.bridge.ipv4_subnet) == ("br9", "10.9.0.0/24")

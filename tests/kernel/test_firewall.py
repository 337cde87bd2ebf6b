"""firewall: forward-accept sets, admin chains first, ingress policy, CHECK and DEL."""

from __future__ import annotations

import pytest

from pycni.errors import CNIError
from pycni.sdk import Attachment
from pycni_plugins.firewall import FirewallPlugin

pytestmark = pytest.mark.privileged

PREV = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "pbr0"}, {"name": "veth01234567"}, {"name": "eth0", "sandbox": "/x"}],
    "ips": [{"interface": 2, "address": "10.77.0.2/24"}, {"interface": 2, "address": "fd77::2/64"}],
}


def _fw(**extra) -> dict:
    return {"cniVersion": "1.0.0", "name": "testnet", "type": "firewall", "prevResult": PREV, **extra}


def _forward_rules(kit) -> list[str]:
    return [
        str(obj["rule"]["expr"])
        for obj in kit.nft_ruleset()["nftables"]
        if "rule" in obj and obj["rule"]["chain"] == "forward"
    ]


def test_add_check_del(host, kit):
    plugin = FirewallPlugin()
    out = plugin.handle(kit.request("ADD", _fw(), "a", "/x"))
    assert out == PREV
    elements = kit.nft_elements()
    assert [e["elem"]["val"] for e in elements["firewall4"]] == ["10.77.0.2"]
    assert [e["elem"]["val"] for e in elements["firewall6"]] == ["fd77::2"]
    assert "CNI-ADMIN" in _forward_rules(kit)[0]
    plugin.handle(kit.request("CHECK", _fw(), "a", "/x"))
    for _ in range(2):
        plugin.handle(kit.request("DEL", _fw(), "a", "/x"))
    assert not kit.nft_elements()["firewall4"]
    with pytest.raises(CNIError, match="expected firewall element 10.77.0.2 not found"):
        plugin.handle(kit.request("CHECK", _fw(), "a", "/x"))


def test_admin_chains_come_first_and_are_configurable(host, kit):
    plugin = FirewallPlugin()
    plugin.handle(kit.request("ADD", _fw(), "a", "/x"))
    other = {**PREV, "ips": [{"interface": 2, "address": "10.77.0.3/24"}]}
    conf = _fw(iptablesAdminChainName="NOMAD-ADMIN", backend="iptables", prevResult=other)
    plugin.handle(kit.request("ADD", conf, "b", "/x"))
    rules = _forward_rules(kit)
    assert "NOMAD-ADMIN" in rules[0] and "CNI-ADMIN" in rules[1]
    assert all("ADMIN" not in r for r in rules[2:])
    chains = {o["chain"]["name"] for o in kit.nft_ruleset()["nftables"] if "chain" in o}
    assert {"CNI-ADMIN", "NOMAD-ADMIN"} <= chains


def test_ingress_policy(host, kit):
    plugin = FirewallPlugin()
    plugin.handle(kit.request("ADD", _fw(ingressPolicy="isolated"), "a", "/x"))
    elements = kit.nft_elements()
    assert [e["elem"]["val"] if isinstance(e, dict) else e for e in elements["isolation_bridges"]] == ["pbr0"]
    assert elements["isolated_self"]
    plugin.handle(kit.request("DEL", _fw(ingressPolicy="isolated"), "a", "/x"))
    assert kit.nft_elements()["isolation_bridges"]  # bridge-level: kept, as the reference keeps its rules
    with pytest.raises(CNIError, match='unknown ingress policy: "bogus"'):
        plugin.handle(kit.request("ADD", _fw(ingressPolicy="bogus"), "a", "/x"))
    with pytest.raises(CNIError, match="missing prevResult from earlier plugin"):
        plugin.handle(kit.request("ADD", {"cniVersion": "1.0.0", "name": "n", "type": "firewall"}, "a", "/x"))
    with pytest.raises(CNIError, match="incompatible CNI versions"):
        plugin.handle(kit.request("ADD", _fw(cniVersion="0.3.1"), "a", "/x"))


def test_iptables_compat_takes_auto_or_always(host, kit):
    plugin = FirewallPlugin()
    with pytest.raises(CNIError, match='unknown iptablesCompat: "sometimes"'):
        plugin.handle(kit.request("ADD", _fw(iptablesCompat="sometimes"), "a", "/x"))
    plugin.handle(kit.request("ADD", _fw(iptablesCompat="auto", backend="iptables"), "a", "/x"))
    plugin.handle(kit.request("DEL", _fw(iptablesCompat="auto", backend="iptables"), "a", "/x"))


def test_an_add_presenting_another_attachments_address_is_refused_and_its_del_keeps_the_element(host, kit):
    """Elements are keyed by address: an ADD whose prevResult claims an address another
    attachment holds must not take its element over (nor its DEL delete it)."""
    plugin = FirewallPlugin()
    plugin.handle(kit.request("ADD", _fw(), "victim", "/x"))
    before = kit.nft_elements()
    with pytest.raises(CNIError, match=r"10.77.0.2 .*belongs to another attachment \(testnet victim eth0\)") as e:
        plugin.handle(kit.request("ADD", _fw(), "thief", "/x"))
    assert e.value.code == 999
    assert kit.nft_elements() == before
    plugin.handle(kit.request("DEL", _fw(), "thief", "/x"))
    assert kit.nft_elements() == before
    plugin.handle(kit.request("CHECK", _fw(), "victim", "/x"))


def test_a_del_after_an_add_killed_before_its_commit_keeps_the_holders_element(host, kit, state_dir):
    """The record is written (the new elements pending) before the commit: if that ADD never
    committed, its DEL must not delete the element another attachment holds for the address."""
    import ipaddress

    from pycni_plugins.kernel import layout
    from pycni_plugins.kernel.nft import ownership

    plugin = FirewallPlugin()
    plugin.handle(kit.request("ADD", _fw(), "victim", "/x"))
    before = kit.nft_elements()
    thief = Attachment("testnet", "thief", "eth0")
    ownership.save(
        ownership.records(state_dir),
        thief,
        "firewall",
        [],
        [layout.firewall_element(ipaddress.ip_address("10.77.0.2"))],
    )
    plugin.handle(kit.request("DEL", _fw(), "thief", "/x"))
    assert kit.nft_elements() == before
    plugin.handle(kit.request("CHECK", _fw(), "victim", "/x"))

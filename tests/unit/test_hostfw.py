"""The host-firewall judge on rulesets as the kernel lists them (no kernel needed)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from pycni_plugins.kernel import hostfw
from tests.hosts.profiles import DOCKER_20_10 as DOCKER_SAVE

NOMAD = hostfw.Target("nomad", (ipaddress.ip_network("198.18.64.0/20"),))
WITH_PORTS = hostfw.Target("nomad", (ipaddress.ip_network("198.18.64.0/20"),), ("8080/tcp",))
BOTH = {4: True, 6: True}
NONE = {4: False, 6: False}
UP = {4: ("eth0",), 6: ("eth0",)}
EGRESS = "forwarded traffic from 198.18.64.0/20 on bridge nomad"


def _legacy(extra_user: str = "") -> hostfw.Filter:
    text = DOCKER_SAVE.replace("-A DOCKER-USER -j RETURN", extra_user + "-A DOCKER-USER -j RETURN")
    parsed = hostfw.parse_legacy(text, 4)
    assert parsed is not None
    return parsed


def _messages(findings: list[hostfw.Finding]) -> list[tuple[str, str]]:
    return [(f.flow, f.message) for f in findings]


def test_docker_legacy_forward_policy_drops_every_flow() -> None:
    found = hostfw.judge([_legacy()], WITH_PORTS, BOTH, UP)
    assert [f.flow for f in found] == ["egress", "replies", "bridged", "inbound"]
    assert all(f.certain for f in found)
    assert found[0].message == (
        "iptables-legacy table filter chain FORWARD (policy DROP) drops forwarded traffic"
        " from 198.18.64.0/20 on bridge nomad"
    )


def test_bridged_traffic_is_judged_only_with_br_netfilter() -> None:
    assert "bridged" not in [f.flow for f in hostfw.judge([_legacy()], NOMAD, NONE, UP)]


def test_docker_user_accepts_clear_the_docker_host() -> None:
    user = (
        "-A DOCKER-USER -i nomad -j ACCEPT\n"
        "-A DOCKER-USER -o nomad -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
        "-A DOCKER-USER -o nomad -m conntrack --ctstate DNAT -j ACCEPT\n"
    )
    assert hostfw.judge([_legacy(user)], WITH_PORTS, BOTH, UP) == []


def test_an_accept_it_cannot_evaluate_makes_the_drop_uncertain() -> None:
    found = hostfw.judge([_legacy("-A DOCKER-USER -m physdev --physdev-in veth1 -j ACCEPT\n")], NOMAD, NONE, UP)
    assert found and not found[0].certain
    assert "may drop" in found[0].message and "DOCKER-USER rule 1" in found[0].message


def test_a_port_accept_leaves_the_rest_dropped() -> None:
    found = hostfw.judge([_legacy("-A DOCKER-USER -i nomad -p tcp --dport 80 -j ACCEPT\n")], NOMAD, NONE, UP)
    assert found[0].flow == "egress" and found[0].certain


def test_a_drop_it_cannot_evaluate_is_may_drop_naming_the_rule() -> None:
    found = hostfw.judge([_legacy("-A DOCKER-USER -m addrtype --src-type LOCAL -j DROP\n")], NOMAD, NONE, UP)
    assert not found[0].certain and "rule 1" in found[0].where


def _nft(policy: str, *rules: list[dict[str, Any]], family: str = "inet") -> hostfw.Filter:
    objs: list[dict[str, Any]] = [
        {
            "chain": {
                "family": family,
                "table": "filter",
                "name": "forward",
                "handle": 1,
                "type": "filter",
                "hook": "forward",
                "prio": 0,
                "policy": policy,
            }
        }
    ]
    for i, expr in enumerate(rules):
        objs.append({"rule": {"family": family, "table": "filter", "chain": "forward", "handle": 10 + i, "expr": expr}})
    return hostfw.filter_from_json(family, "filter", objs, {})


def _m(key: str, right: Any, op: str = "==", kind: str = "meta") -> dict[str, Any]:
    left: dict[str, Any] = {"meta": {"key": key}} if kind == "meta" else {kind: {"key": key}}
    return {"match": {"op": op, "left": left, "right": right}}


ACCEPT = {"accept": None}


def test_hardened_inet_filter_policy_drop() -> None:
    found = hostfw.judge([_nft("drop", [_m("state", ["established", "related"], "in", "ct"), ACCEPT])], NOMAD, NONE, UP)
    assert _messages(found) == [
        (
            "egress",
            "table inet filter chain forward (policy drop) drops forwarded traffic from 198.18.64.0/20 on bridge nomad",
        )
    ]


def test_the_admin_rule_clears_the_hardened_host() -> None:
    fixed = _nft(
        "drop",
        [_m("iifname", "nomad"), ACCEPT],
        [_m("oifname", "nomad"), _m("state", ["established", "related"], "in", "ct"), ACCEPT],
        [_m("oifname", "nomad"), _m("status", "dnat", "in", "ct"), ACCEPT],
    )
    assert hostfw.judge([fixed], WITH_PORTS, BOTH, UP) == []


def test_an_accept_policy_and_no_drop_is_clean() -> None:
    assert hostfw.judge([_nft("accept", [_m("iifname", "eth9"), {"drop": None}])], WITH_PORTS, BOTH, UP) == []


def test_an_interface_drop_is_judged_against_the_uplinks() -> None:
    rule = [_m("iifname", "eth9"), {"drop": None}]
    unknown = hostfw.judge([_nft("accept", rule)], NOMAD, NONE)
    assert [(f.flow, f.certain) for f in unknown] == [("replies", False)]
    uplink = hostfw.judge([_nft("accept", rule)], NOMAD, NONE, {4: ("eth9",)})
    assert [(f.flow, f.certain) for f in uplink] == [("replies", True)]


def test_a_saddr_drop_of_the_subnet_is_certain() -> None:
    prefix = {
        "match": {
            "op": "==",
            "left": {"payload": {"protocol": "ip", "field": "saddr"}},
            "right": {"prefix": {"addr": "198.18.64.0", "len": 20}},
        }
    }
    found = hostfw.judge([_nft("accept", [prefix, {"drop": None}])], NOMAD, NONE, UP)
    assert _messages(found) == [
        (
            "egress",
            "table inet filter chain forward rule handle 10 (drop) drops " + EGRESS,
        )
    ]


def test_an_ip6_table_does_not_judge_ipv4() -> None:
    assert hostfw.judge([_nft("drop", family="ip6")], NOMAD, NONE, UP) == []


def test_ipv6_subnets_meet_the_inet_chain() -> None:
    v6 = hostfw.Target("nomad", (ipaddress.ip_network("fd00:18::/64"),))
    found = hostfw.judge([_nft("drop")], v6, NONE, UP)
    assert [f.flow for f in found] == ["egress", "replies"]


def test_admin_rule_text() -> None:
    assert hostfw.admin_rule("nomad") == (
        'iifname "nomad" accept; oifname "nomad" ct state established,related accept; '
        'oifname "nomad" ct status dnat accept'
    )


@pytest.mark.parametrize("pattern,hit", [("nom*", True), ("nomad", True), ("no", False), ("docker*", False)])
def test_interface_wildcards(pattern: str, hit: bool) -> None:
    found = hostfw.judge([_nft("accept", [_m("iifname", pattern), {"drop": None}])], NOMAD, NONE, UP)
    assert [f.flow for f in found] == (["egress"] if hit else [])


def test_only_the_inbound_flow_when_egress_is_let_through() -> None:
    egress_only = _nft(
        "drop",
        [_m("iifname", "nomad"), ACCEPT],
        [_m("oifname", "nomad"), _m("state", ["established", "related"], "in", "ct"), ACCEPT],
    )
    found = hostfw.judge([egress_only], WITH_PORTS, BOTH, UP, only=("inbound",))
    assert [(f.flow, f.certain) for f in found] == [("inbound", True)]
    assert "connections DNAT'd to 198.18.64.0/20 on bridge nomad (host ports 8080/tcp)" in found[0].message
    assert hostfw.judge([egress_only], WITH_PORTS, BOTH, UP, only=("egress", "replies", "bridged")) == []


def _firewalld(zone: str) -> hostfw.Filter:
    """Debian firewalld 1.3.3's ``table inet firewalld`` (nftables backend, default zone public),
    as ``nft -j list table`` printed it in a private namespace; ``trusted``: after
    ``firewall-cmd --zone=trusted --add-source=198.18.64.0/20``."""
    import json
    from pathlib import Path

    path = Path(__file__).parent / "data" / f"firewalld-1.3-{zone}.json"
    return hostfw.filter_from_json("inet", "firewalld", json.loads(path.read_text())["nftables"], {})


def test_firewalld_public_zone_rejects_the_bridge() -> None:
    """The uplink eth0 is in zone public, whose intra-zone forwarding (``oifname "eth0" accept``)
    lets out what the catch-all default zone public takes in, the bridge included; an uplink in
    no zone gets firewalld's reject."""
    inside = hostfw.judge([_firewalld("public")], WITH_PORTS, BOTH, UP)
    assert [(f.flow, f.certain) for f in inside] == [("bridged", True)]
    found = hostfw.judge([_firewalld("public")], WITH_PORTS, BOTH, {4: ("eth1",)})
    assert [(f.flow, f.certain) for f in found] == [("egress", True), ("bridged", True)]
    assert found[0].where == "table inet firewalld chain filter_FWD_public rule handle 101 (reject)"
    # never a rule in firewalld's table (a reload rewrites it): zone sources, or the bridge in a zone
    assert "sources of a firewalld zone" in found[0].remedy
    assert found[0].remedy.endswith("--zone=trusted --add-interface=nomad; firewall-cmd --reload")


def test_firewalld_trusted_source_clears_the_bridge() -> None:
    assert hostfw.judge([_firewalld("trusted")], WITH_PORTS, BOTH, UP) == []


def test_goto_return_and_named_sets() -> None:
    objs: list[dict[str, Any]] = [
        {"set": {"family": "inet", "table": "t", "name": "bridges", "type": "ifname", "elem": ["nomad", "cni0"]}},
        {"chain": {"family": "inet", "table": "t", "name": "fwd", "hook": "forward", "prio": 5, "policy": "drop"}},
        {"chain": {"family": "inet", "table": "t", "name": "mine"}},
        {"rule": {"chain": "fwd", "handle": 3, "expr": [{"goto": {"target": "mine"}}]}},
        {"rule": {"chain": "fwd", "handle": 4, "expr": [ACCEPT]}},  # never reached: goto does not come back
        {"rule": {"chain": "mine", "handle": 5, "expr": [_m("oifname", "docker0"), {"return": None}]}},
        {"rule": {"chain": "mine", "handle": 6, "expr": [_m("iifname", "@bridges"), ACCEPT]}},
    ]
    f = hostfw.filter_from_json("inet", "t", objs, {})
    found = hostfw.judge([f], NOMAD, NONE, UP)
    assert [(x.flow, x.where) for x in found] == [("replies", "table inet t chain fwd (policy drop)")]


def test_iptables_nft_conntrack_is_read_from_the_text_line() -> None:
    objs: list[dict[str, Any]] = [
        {
            "chain": {
                "family": "ip",
                "table": "filter",
                "name": "FORWARD",
                "hook": "forward",
                "prio": 0,
                "policy": "drop",
            }
        },
        {"rule": {"chain": "FORWARD", "handle": 7, "expr": [_m("iifname", "nomad"), ACCEPT]}},
        {"rule": {"chain": "FORWARD", "handle": 8, "expr": [{"xt": {"type": "match", "name": "conntrack"}}, ACCEPT]}},
    ]
    lines = {8: "\t\tct state related,established counter packets 0 bytes 0 accept # handle 8"}
    f = hostfw.filter_from_json("ip", "filter", objs, lines)
    assert f.iptables
    assert hostfw.judge([f], NOMAD, NONE, UP) == []
    unread = hostfw.judge([hostfw.filter_from_json("ip", "filter", objs, {})], NOMAD, NONE, UP)
    assert [(x.flow, x.certain) for x in unread] == [("replies", False)]
    assert "rule handle 8 may accept it first" in unread[0].message
    assert unread[0].remedy.startswith("iptables -I FORWARD 1 -i nomad -j ACCEPT")


def test_legacy_negation_goto_and_reject() -> None:
    save = """*filter
:FORWARD ACCEPT [0:0]
:CHECKS - [0:0]
-A FORWARD ! -i nomad -j ACCEPT
-A FORWARD -g CHECKS
-A CHECKS -s 198.18.64.0/20 -j REJECT --reject-with icmp-port-unreachable
COMMIT
"""
    f = hostfw.parse_legacy(save, 4)
    assert f is not None
    found = hostfw.judge([f], NOMAD, NONE, UP)
    assert [(x.flow, x.certain, x.where) for x in found] == [
        (
            "egress",
            True,
            "iptables-legacy table filter chain CHECKS rule 1"
            " (iptables -A CHECKS -s 198.18.64.0/20 -j REJECT --reject-with icmp-port-unreachable) (reject)",
        )
    ]

"""What makes the daemon's watcher heal (issue 20, point 5): which transactions of another
process call for pycni's nftables tables to be checked, which for the iptables compatibility
step's rules in iptables-nft's tables; and what an iptables record alone says to put back."""

from __future__ import annotations

import ipaddress

from pycni_plugins.kernel import iptables
from pycni_plugins.kernel.iptables import recorded
from pycni_plugins.kernel.nfnl import Batch
from pycni_plugins.serve.heal import IPTABLES_NFT, NFT, _what


def _batch(
    removed: set[tuple[str, str, str]] | None = None,
    chains: set[tuple[str, str, str]] | None = None,
    created: set[tuple[str, str]] | None = None,
    lost: bool = False,
) -> Batch:
    b = Batch()
    b.removed, b.chains, b.created, b.lost = set(removed or ()), set(chains or ()), set(created or ()), lost
    return b


def test_iptables_f_forward_and_a_docker_restart_call_for_the_iptables_step() -> None:
    flush_forward = _batch({("rule", "ip", "filter")}, {("ip", "filter", "FORWARD")})
    assert _what(flush_forward) == {IPTABLES_NFT}
    restart = _batch({("table", "ip", "filter"), ("chain", "ip", "filter")}, {("ip", "filter", "PYCNI-FORWARD")})
    assert _what(restart) == {IPTABLES_NFT}
    ip6 = _batch({("rule", "ip6", "filter")}, {("ip6", "filter", "PYCNI-FORWARD")})
    assert _what(ip6) == {IPTABLES_NFT}
    remade = _batch(created={("ip", "filter")})  # after a flushed ruleset, Docker makes it again
    assert _what(remade) == {IPTABLES_NFT}


def test_nft_flush_ruleset_calls_for_both() -> None:
    flush = _batch(
        {("table", "inet", "pycni"), ("table", "ip", "filter"), ("chain", "ip", "filter")},
        {("ip", "filter", "FORWARD"), ("inet", "pycni", "forward")},
    )
    assert _what(flush) == {NFT, IPTABLES_NFT}
    assert _what(_batch(lost=True)) == {NFT, IPTABLES_NFT}


def test_what_docker_or_a_del_does_day_to_day_calls_for_nothing() -> None:
    # Docker's own chains and nat table change with every container; a DEL deletes elements.
    assert _what(_batch({("rule", "ip", "filter")}, {("ip", "filter", "DOCKER")})) == set()
    assert _what(_batch({("rule", "ip", "nat")}, {("ip", "nat", "FORWARD")})) == set()
    assert _what(_batch({("element", "inet", "pycni")})) == set()
    assert _what(_batch({("rule", "inet", "filter")}, {("inet", "filter", "FORWARD")})) == set()
    assert _what(_batch(created={("inet", "filter")})) == set()


def test_a_record_alone_says_what_to_put_back() -> None:
    place = iptables.Place(4, "nft")
    rec = recorded.record(
        ("nomad", "c1", "eth0"),
        "k1 firewall nomad c1 eth0",
        [place, iptables.Place(6, "legacy")],
        ["198.18.64.2/20", "fd00::2/64"],
        [("nomad", "198.18.64.0/20", "NOMAD-ADMIN")],
        42,
    )
    assert rec["netns"] == 42 and recorded.places_of(rec) == [place, iptables.Place(6, "legacy")]
    rules = recorded.rules_of(rec, place)
    assert rules[0] == iptables.admin_tokens("nomad", ipaddress.ip_network("198.18.64.0/20"), "NOMAD-ADMIN")
    assert rules[1:] == iptables.attachment_rules([ipaddress.ip_network("198.18.64.2/32")], "k1 firewall nomad c1 eth0")
    six = recorded.rules_of(rec, iptables.Place(6, "legacy"))
    assert six == iptables.attachment_rules([ipaddress.ip_network("fd00::2/128")], "k1 firewall nomad c1 eth0")

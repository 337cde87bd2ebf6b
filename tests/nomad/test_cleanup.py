"""Forced cleanup of an allocation's NAT leftovers (Nomad's forceCleanup, fixed for #16455)."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from pycni.nomad.cleanup import (
    CleanupReport,
    dnat_chain,
    dnat_comment,
    force_cleanup,
    masquerade_chain,
    masquerade_comment,
    remove_nat_leftovers,
)
from pycni.nomad.errors import CleanupError

ALLOC = "2dd71cac-2b1e-ff08-167c-735f7f9f4964"

# Nomad's TestCNI_forceCleanup rule list ("iptables -t nat -S POSTROUTING" lines).
NOMAD_RULES = [
    '-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ',
    "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
    "-A POSTROUTING -s 172.26.64.216/32 -m comment --comment "
    '"name: \\"nomad\\" id: \\"79e8bf2e-a9c8-70ac-8d4e-fa5c4da99fbf\\"" -j CNI-f2338c31d4de44472fe99c43',
    "-A POSTROUTING -s 172.26.64.217/32 -m comment --comment "
    '"name: \\"nomad\\" id: \\"2dd71cac-2b1e-ff08-167c-735f7f9f4964\\"" -j CNI-5d36f286cfbb35c5776509ec',
    "-A POSTROUTING -s 172.26.64.218/32 -m comment --comment "
    '"name: \\"nomad\\" id: \\"5ff6deb7-9bc1-1491-f20c-e87b15de501d\\"" -j CNI-2fe7686eac2fe43714a7b850',
    "-A POSTROUTING -m mark --mark 0x2000/0x2000 -j MASQUERADE",
    '-A POSTROUTING -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000',
]


def nft_table(family: str, rules: Sequence[str], *, comments: bool = True) -> list[dict[str, Any]]:
    """An nft JSON listing of ``<family> nat`` holding iptables-style ``rules`` (handles from 100).

    ``comments=False`` is how iptables-nft 1.8 rules look: the comment is an opaque xt match.
    """
    objects: list[dict[str, Any]] = [{"table": {"family": family, "name": "nat", "handle": 1}}]
    chains: list[str] = []
    for handle, line in enumerate(rules, start=100):
        argv = shlex.split(line)
        chain = argv[1]
        for name in (chain, argv[argv.index("-j") + 1] if "-j" in argv else ""):
            if name.startswith("CNI-") or name == "POSTROUTING":
                chains.append(name) if name not in chains else None
        expr: list[dict[str, Any]] = []
        if "-s" in argv:
            src = argv[argv.index("-s") + 1]
            right = {"prefix": {"addr": src.split("/")[0], "len": int(src.split("/")[1])}} if "/" in src else src
            expr.append(
                {"match": {"op": "==", "left": {"payload": {"protocol": family, "field": "saddr"}}, "right": right}}
            )
        target = argv[argv.index("-j") + 1] if "-j" in argv else ""
        rule: dict[str, Any] = {"family": family, "table": "nat", "chain": chain, "handle": handle}
        if "--comment" in argv:
            if comments:
                rule["comment"] = argv[argv.index("--comment") + 1]
            else:
                expr.append({"xt": {"type": "match", "name": "comment"}})
        expr.append({"counter": {"packets": 0, "bytes": 0}})
        expr.append({"jump": {"target": target}} if target.startswith("CNI-") else {"masquerade": None})
        rule["expr"] = expr
        objects.append({"rule": rule})
    for i, name in enumerate(chains):
        objects.insert(1 + i, {"chain": {"family": family, "table": "nat", "name": name, "handle": 10 + i}})
    return objects


class FakeNat:
    def __init__(
        self,
        tables: Mapping[str, list[dict[str, Any]] | None],
        list_error: Mapping[str, str] | None = None,
        apply_error: str | None = None,
    ) -> None:
        self.tables = tables
        self.list_error = list_error or {}
        self.apply_error = apply_error
        self.listed: list[str] = []
        self.applied: list[list[dict[str, Any]]] = []

    def list_nat(self, family: str) -> list[dict[str, Any]] | None:
        self.listed.append(family)
        if family in self.list_error:
            raise CleanupError(f"failed to list iptables rules: {self.list_error[family]}")
        return self.tables.get(family)

    def apply(self, commands: Sequence[Mapping[str, Any]]) -> None:
        self.applied.append([dict(c) for c in commands])
        if self.apply_error is not None:
            raise CleanupError("nftables transaction failed", self.apply_error)


def commands_of(nat: FakeNat) -> list[tuple[str, str, Any]]:
    """(verb, kind, chain or handle) of the one transaction."""
    assert len(nat.applied) == 1
    out = []
    for cmd in nat.applied[0]:
        ((verb, body),) = cmd.items()
        ((kind, ref),) = body.items()
        out.append((verb, kind, f"{ref['family']} {ref.get('chain', ref.get('name'))} {ref.get('handle', '')}".strip()))
    return out


def family_of(command: Mapping[str, Any]) -> str:
    """The family one ``{verb: {kind: ref}}`` command acts on."""
    ((ref,),) = (list(body.values()) for body in command.values())
    return str(ref["family"])


# -- Nomad's TestCNI_forceCleanup -------------------------------------------------------------------


def test_ok_removes_the_postrouting_rule_and_clears_its_chain() -> None:
    nat = FakeNat({"ip": nft_table("ip", NOMAD_RULES)})
    removed = remove_nat_leftovers(nat, "nomad", ALLOC)
    assert nat.listed == ["ip6", "ip"]
    assert commands_of(nat) == [
        ("delete", "rule", "ip POSTROUTING 103"),
        ("flush", "chain", "ip CNI-5d36f286cfbb35c5776509ec"),
        ("delete", "chain", "ip CNI-5d36f286cfbb35c5776509ec"),
    ]
    assert removed == (
        "ip nat POSTROUTING rule handle 103 (jump CNI-5d36f286cfbb35c5776509ec)",
        "ip nat chain CNI-5d36f286cfbb35c5776509ec (0 rules)",
    )


def test_missing_allocation_is_not_an_error() -> None:
    rules = [r.replace(ALLOC, "262d57a7-8f85-f3a4-9c3b-120c00ccbff1") for r in NOMAD_RULES]
    nat = FakeNat({"ip": nft_table("ip", rules)})
    assert remove_nat_leftovers(nat, "nomad", ALLOC) == ()
    assert nat.applied == []


def test_list_error() -> None:
    nat = FakeNat({}, list_error={"ip": "list error"})
    with pytest.raises(CleanupError) as info:
        remove_nat_leftovers(nat, "nomad", ALLOC)
    assert str(info.value) == "failed to list iptables rules: list error"


@pytest.mark.parametrize("failure", ["delete error", "clear error"])
def test_delete_or_clear_error(failure: str) -> None:
    # One transaction: a failed delete or flush/delete-chain fails (and undoes) everything.
    nat = FakeNat({"ip": nft_table("ip", [NOMAD_RULES[3]])}, apply_error=failure)
    with pytest.raises(CleanupError) as info:
        remove_nat_leftovers(nat, "nomad", ALLOC)
    assert info.value.msg == f"failed to cleanup iptables rules for alloc {ALLOC}"
    assert failure in str(info.value)


# -- beyond Nomad ----------------------------------------------------------------------------------


def test_rule_with_the_comment_that_nomads_regex_cannot_parse_is_an_error() -> None:
    odd = f'-A POSTROUTING -m comment --comment "name: \\"nomad\\" id: \\"{ALLOC}\\"" -j CNI-5d36f286cfbb35c5776509ec'
    with pytest.raises(CleanupError, match=f"^failed to parse postrouting rule for alloc {ALLOC}$"):
        remove_nat_leftovers(FakeNat({"ip": nft_table("ip", [odd])}), "nomad", ALLOC)


def plugin_rules(network: str, alloc: str, ip: str) -> list[str]:
    """What the reference bridge (ipMasq) and portmap plugins add for one container, iptables-save style."""
    chain, dn = masquerade_chain(network, alloc), dnat_chain(network, alloc)
    comment = masquerade_comment(network, alloc).replace('"', '\\"')
    dnat = dnat_comment(network, alloc).replace('"', '\\"')
    return [
        f'-A {chain} -d {ip}/20 -m comment --comment "{comment}" -j ACCEPT',
        f'-A {chain} ! -d 224.0.0.0/4 -m comment --comment "{comment}" -j MASQUERADE',
        f'-A POSTROUTING -s {ip}/32 -m comment --comment "{comment}" -j {chain}',
        f'-A CNI-HOSTPORT-DNAT -m comment --comment "{dnat}" -m multiport -p tcp --destination-ports 8080 -j {dn}',
        f"-A {dn} -p tcp --dport 8080 -j DNAT --to-destination {ip}:80",
    ]


@pytest.mark.parametrize("comments", [False, True], ids=["iptables-nft (opaque comments)", "visible comments"])
def test_chains_named_for_the_alloc_are_found_with_or_without_visible_comments(comments: bool) -> None:
    other = "5ff6deb7-9bc1-1491-f20c-e87b15de501d"
    rules = plugin_rules("nomad", other, "172.26.64.6") + plugin_rules("nomad", ALLOC, "172.26.64.5")
    nat = FakeNat({"ip": nft_table("ip", rules, comments=comments)})
    removed = remove_nat_leftovers(nat, "nomad", ALLOC)
    chain, dn = masquerade_chain("nomad", ALLOC), dnat_chain("nomad", ALLOC)
    assert sorted(commands_of(nat)) == sorted(
        [
            ("delete", "rule", "ip POSTROUTING 107"),
            ("delete", "rule", "ip CNI-HOSTPORT-DNAT 108"),
            ("flush", "chain", f"ip {chain}"),
            ("delete", "chain", f"ip {chain}"),
            ("flush", "chain", f"ip {dn}"),
            ("delete", "chain", f"ip {dn}"),
        ]
    )
    assert f"ip nat chain {chain} (2 rules)" in removed and f"ip nat chain {dn} (1 rule)" in removed


def test_network_name_is_a_parameter_for_cni_networks() -> None:
    # Nomad issue #16455: cni/<name> networks leaked because "nomad" was hard-coded.
    rules = plugin_rules("mynet", ALLOC, "10.10.0.5") + plugin_rules("nomad", ALLOC, "172.26.64.5")
    nat = FakeNat({"ip": nft_table("ip", rules, comments=False)})
    remove_nat_leftovers(nat, "mynet", ALLOC)
    touched = {c[2].split()[1] for c in commands_of(nat)}
    assert touched == {"POSTROUTING", "CNI-HOSTPORT-DNAT", masquerade_chain("mynet", ALLOC), dnat_chain("mynet", ALLOC)}


def test_orphan_chain_without_its_postrouting_rule_is_removed() -> None:
    rules = plugin_rules("nomad", ALLOC, "172.26.64.5")[:2]
    nat = FakeNat({"ip": nft_table("ip", rules, comments=False)})
    assert remove_nat_leftovers(nat, "nomad", ALLOC) == (f"ip nat chain {masquerade_chain('nomad', ALLOC)} (2 rules)",)


def test_a_visible_foreign_comment_vetoes_a_rule() -> None:
    chain = masquerade_chain("nomad", ALLOC)
    rules = [f'-A POSTROUTING -s 10.0.0.1/32 -m comment --comment "someone else" -j {chain}']
    nat = FakeNat({"ip": nft_table("ip", rules)})
    remove_nat_leftovers(nat, "nomad", ALLOC)
    assert ("delete", "rule", "ip POSTROUTING 100") not in commands_of(nat)


def test_each_family_is_cleaned_in_its_own_transaction_ipv6_first() -> None:
    v4 = nft_table("ip", plugin_rules("nomad", ALLOC, "172.26.64.5"), comments=False)
    v6 = nft_table("ip6", plugin_rules("nomad", ALLOC, "fd00::5")[:3], comments=False)
    nat = FakeNat({"ip": v4, "ip6": v6})
    removed = remove_nat_leftovers(nat, "nomad", ALLOC)
    assert [{family_of(c) for c in transaction} for transaction in nat.applied] == [{"ip6"}, {"ip"}]
    assert any(r.startswith("ip6 nat chain") for r in removed) and any(r.startswith("ip nat chain") for r in removed)

    failing_v6 = FakeNat({"ip": v4}, list_error={"ip6": "ip6tables missing"})
    assert all(r.startswith("ip ") for r in remove_nat_leftovers(failing_v6, "nomad", ALLOC))


def test_an_unparsable_ipv6_rule_is_logged_and_ipv4_is_still_cleaned(caplog: pytest.LogCaptureFixture) -> None:
    # Nomad: an ip6 nat POSTROUTING rule with the alloc's comment but no source fails its regex;
    # Teardown logs that and still removes the IPv4 rule and chain.
    chain = masquerade_chain("nomad", ALLOC)
    no_source = f'-A POSTROUTING -m comment --comment "name: \\"nomad\\" id: \\"{ALLOC}\\"" -j {chain}'
    v4 = f'-A POSTROUTING -s 172.26.64.5/32 -m comment --comment "name: \\"nomad\\" id: \\"{ALLOC}\\"" -j {chain}'
    nat = FakeNat({"ip6": nft_table("ip6", [no_source]), "ip": nft_table("ip", [v4])})
    with caplog.at_level("WARNING", logger="pycni.nomad"):
        removed = remove_nat_leftovers(nat, "nomad", ALLOC)
    assert removed == (f"ip nat POSTROUTING rule handle 100 (jump {chain})", f"ip nat chain {chain} (0 rules)")
    assert commands_of(nat)[0] == ("delete", "rule", "ip POSTROUTING 100")
    assert f"failed to parse postrouting rule for alloc {ALLOC}" in caplog.text


def test_a_failed_ipv6_transaction_does_not_block_ipv4() -> None:
    class V6Fails(FakeNat):
        def apply(self, commands: Sequence[Mapping[str, Any]]) -> None:
            self.applied.append([dict(c) for c in commands])
            if family_of(commands[0]) == "ip6":
                raise CleanupError("nftables transaction failed", "EBUSY")

    v4 = nft_table("ip", plugin_rules("nomad", ALLOC, "172.26.64.5"), comments=False)
    v6 = nft_table("ip6", plugin_rules("nomad", ALLOC, "fd00::5"), comments=False)
    removed = remove_nat_leftovers(V6Fails({"ip": v4, "ip6": v6}), "nomad", ALLOC)
    assert removed and all(r.startswith("ip ") for r in removed)


@pytest.mark.parametrize("alloc", ["alloc-1", "2dd71cac 2b1e", "", "..", "2dd71cac-2b1e-ff08-167c-735f7f9f496g"])
def test_alloc_ids_that_are_not_uuids_are_refused_as_nomads_regex_refuses_them(alloc: str) -> None:
    nat = FakeNat({"ip": nft_table("ip", plugin_rules("nomad", alloc, "172.26.64.5"), comments=False)})
    with pytest.raises(CleanupError, match="failed to parse postrouting rule"):
        remove_nat_leftovers(nat, "nomad", alloc)
    assert nat.listed == [] and nat.applied == []


def test_no_nat_tables_at_all_is_nothing_to_do() -> None:
    nat = FakeNat({"ip": None, "ip6": None})
    assert remove_nat_leftovers(nat, "nomad", ALLOC) == () and nat.applied == []


def test_force_cleanup_adds_the_own_state_hook() -> None:
    nat = FakeNat({"ip": nft_table("ip", [NOMAD_RULES[3]])})
    report = force_cleanup("nomad", ALLOC, nat=nat, own_state=lambda net, cid: [f"pycni {net} {cid} elements"])
    assert isinstance(report, CleanupReport)
    assert report.removed[-1] == f"pycni nomad {ALLOC} elements"
    assert report.to_json()["allocID"] == ALLOC


def test_force_cleanup_runs_both_parts_and_reports_partial_success() -> None:
    nat = FakeNat({"ip": nft_table("ip", [NOMAD_RULES[3]])}, apply_error="EBUSY")
    with pytest.raises(CleanupError) as info:
        force_cleanup("nomad", ALLOC, nat=nat, own_state=lambda net, cid: ["pycni element"])
    assert info.value.removed == ("pycni element",)
    assert str(info.value).startswith(f"failed to cleanup iptables rules for alloc {ALLOC}")

    def broken(net: str, cid: str) -> list[str]:
        raise CleanupError("own state failed")

    with pytest.raises(CleanupError, match="own state failed") as info2:
        force_cleanup("nomad", ALLOC, nat=FakeNat({"ip": nft_table("ip", [NOMAD_RULES[3]])}), own_state=broken)
    assert len(info2.value.removed) == 2


@pytest.mark.parametrize(
    ("network", "alloc", "chain", "dn"),
    [
        # The reference plugins' names: sha512(network + id), "CNI-" + 24 hex / "CNI-DN-" + 21 hex.
        ("nomad", "79e8bf2e-a9c8-70ac-8d4e-fa5c4da99fbf", "CNI-f2338c31d4de44472fe99c43", None),
        ("nomad", "5ff6deb7-9bc1-1491-f20c-e87b15de501d", "CNI-2fe7686eac2fe43714a7b850", None),
    ],
)
def test_chain_names_match_the_reference_plugins(network: str, alloc: str, chain: str, dn: str | None) -> None:
    assert masquerade_chain(network, alloc) == chain
    assert re.fullmatch(r"CNI-DN-[0-9a-f]{21}", dnat_chain(network, alloc))


def test_comments_match_the_reference_plugins() -> None:
    assert masquerade_comment("nomad", ALLOC) == f'name: "nomad" id: "{ALLOC}"'
    assert masquerade_comment('we"ird', "x\\y") == 'name: "we\\"ird" id: "x\\\\y"'  # Go %q
    assert dnat_comment("nomad", ALLOC) == f'dnat name: "nomad" id: "{ALLOC}"'
    assert dnat_comment("n" * 300, "x").endswith("...") and len(dnat_comment("n" * 300, "x")) == 256


# -- the real thing: iptables-nft rules in a throwaway host namespace -------------------------------


def _ipt(ns: str, binary: str, *args: str) -> None:
    done = subprocess.run(["ip", "netns", "exec", ns, binary, "-w", "-t", "nat", *args], capture_output=True, text=True)
    assert done.returncode == 0, f"{binary} {args}: {done.stderr}"


def _save(ns: str, binary: str) -> str:
    save = "iptables-save" if binary == "iptables" else "ip6tables-save"
    return subprocess.run(
        ["ip", "netns", "exec", ns, save, "-t", "nat"], check=True, capture_output=True, text=True
    ).stdout


def _plant(ns: str, binary: str, network: str, alloc: str, ip: str, prefix: int, multicast: str) -> None:
    """Exactly the commands the reference bridge (ipMasq) and portmap plugins run for one container."""
    chain, dn = masquerade_chain(network, alloc), dnat_chain(network, alloc)
    comment = masquerade_comment(network, alloc)
    _ipt(ns, binary, "-N", chain)
    _ipt(ns, binary, "-A", chain, "-d", f"{ip}/{prefix}", "-j", "ACCEPT", "-m", "comment", "--comment", comment)
    _ipt(ns, binary, "-A", chain, "!", "-d", multicast, "-j", "MASQUERADE", "-m", "comment", "--comment", comment)
    _ipt(ns, binary, "-A", "POSTROUTING", "-s", ip, "-j", chain, "-m", "comment", "--comment", comment)
    _ipt(ns, binary, "-N", dn)
    dest = f"{ip}:80" if binary == "iptables" else f"[{ip}]:80"
    _ipt(ns, binary, "-A", dn, "-p", "tcp", "--dport", "8080", "-j", "DNAT", "--to-destination", dest)
    entry = ["-m", "comment", "--comment", dnat_comment(network, alloc), "-m", "multiport", "-p", "tcp"]
    _ipt(ns, binary, "-A", "CNI-HOSTPORT-DNAT", *entry, "--destination-ports", "8080", "-j", dn)


@pytest.mark.privileged
def test_forced_cleanup_removes_only_the_target_allocs_iptables_nft_state(host_ns: Any) -> None:
    other = "5ff6deb7-9bc1-1491-f20c-e87b15de501d"
    for binary, ips, prefix, multicast in (
        ("iptables", ("172.26.64.5", "172.26.64.6"), 20, "224.0.0.0/4"),
        ("ip6tables", ("fd00:a110::5", "fd00:a110::6"), 120, "ff00::/8"),
    ):
        _ipt(host_ns.name, binary, "-N", "CNI-HOSTPORT-DNAT")
        _plant(host_ns.name, binary, "nomad", ALLOC, ips[0], prefix, multicast)
        _plant(host_ns.name, binary, "nomad", other, ips[1], prefix, multicast)
        _plant(host_ns.name, binary, "mynet", ALLOC, ips[0], prefix, multicast)  # same alloc, other network

    report = force_cleanup("nomad", ALLOC, host_netns=host_ns.path)

    mine = {masquerade_chain("nomad", ALLOC), dnat_chain("nomad", ALLOC)}
    kept = {masquerade_chain("nomad", other), dnat_chain("nomad", other)}
    kept |= {masquerade_chain("mynet", ALLOC), dnat_chain("mynet", ALLOC)}
    for binary in ("iptables", "ip6tables"):
        saved = _save(host_ns.name, binary)
        for chain in mine:
            assert chain not in saved, f"{binary}: {chain} left behind:\n{saved}"
        for chain in kept:
            assert f":{chain} " in saved and f"-j {chain}" in saved, f"{binary}: {chain} was removed:\n{saved}"
        assert saved.count("-A POSTROUTING") == 2 and saved.count("-A CNI-HOSTPORT-DNAT") == 2
    assert len(report.removed) == 8  # per family: 2 entry rules + 2 chains
    assert {line.split()[0] for line in report.removed} == {"ip", "ip6"}

    # Nothing left for this alloc: a second run is a no-op; the other network still has its state.
    assert force_cleanup("nomad", ALLOC, host_netns=host_ns.path).removed == ()
    assert len(force_cleanup("mynet", ALLOC, host_netns=host_ns.path).removed) == 8

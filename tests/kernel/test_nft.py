"""The nftables layer: sections, one-transaction apply/release, records, GC listing."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import os
import shutil
import stat
import subprocess

import pytest

from pycni import netns
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import Attachment
from pycni_plugins.kernel import layout, nfnl, nft
from pycni_plugins.kernel.nft import skeleton, transport

pytestmark = pytest.mark.privileged

A4 = ipaddress.ip_interface("10.88.0.5/16")
ATT = Attachment("net1", "c1", "eth0")
SECTIONS = (layout.PORTMAP, layout.hairpin_subnet(A4.network))


def _elements(port: int = 8080, addr=A4) -> list[nft.Element]:
    return [layout.hostport_element("tcp", port, addr.ip, 80, None), layout.hairpin_element(addr)]


def test_sections_are_created_once_even_concurrently(host, kit):
    def ensure() -> None:
        with netns.entered(host.path):
            nft.ensure(SECTIONS)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: ensure(), range(16)))
    rules = kit.nft_rule_count()
    nft.ensure(SECTIONS, force=True)
    assert kit.nft_rule_count() == rules


def _counting_dumps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    dumps: list[str] = []
    real = skeleton._netlink_dump

    def counting(family: str):
        dumps.append(family)
        return real(family)

    monkeypatch.setattr(skeleton, "_netlink_dump", counting)
    return dumps


def test_a_verification_serves_every_thread_of_the_namespace(host, monkeypatch):
    nft.ensure(SECTIONS)
    dumps = _counting_dumps(monkeypatch)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: netns.run_in(host.path, nft.ensure, SECTIONS), range(8)))
    assert dumps == []


def test_a_new_namespace_never_inherits_the_verification_of_a_dead_one(make_netns, kit, monkeypatch):
    """The kernel reuses a dead namespace's inode number for a new one (often at once); the memo
    is keyed by the netns cookie, so even an inode collision cannot make it skip a verification."""
    first = make_netns("host")
    st = os.stat(first.path)
    netns.run_in(first.path, nft.ensure, SECTIONS)
    first.__exit__(None, None, None)
    second = make_netns("host")
    monkeypatch.setattr(transport, "_netns_ident", lambda: (st.st_dev, st.st_ino))  # as if the inode was reused
    dumps = _counting_dumps(monkeypatch)
    netns.run_in(second.path, nft.ensure, SECTIONS)
    assert dumps
    with netns.entered(second.path):
        assert kit.nft_rule_count() > 0


def _counting_rule_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = nfnl.Reader.rules

    def counting(self: nfnl.Reader, table: str) -> list[nfnl.Rule]:
        reads.append(table)
        return real(self, table)

    monkeypatch.setattr(nfnl.Reader, "rules", counting)
    return reads


def test_checks_of_an_unchanged_ruleset_read_its_rules_once_whichever_thread_asks(host, monkeypatch, state_dir):
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    reads = _counting_rule_reads(monkeypatch)
    for _ in range(3):
        assert nft.check(ATT, _elements(), SECTIONS) is None
        assert netns.run_in(host.path, nft.check, ATT, _elements(), SECTIONS) is None
    assert len(reads) <= 1


def _nft_elsewhere(host: netns.Throwaway, command: str) -> None:
    """``command`` by another process (the nft CLI), behind pycni's back."""
    subprocess.run(["ip", "netns", "exec", host.name, "nft", command], check=True, capture_output=True)


def _handle(kit, chain: str) -> int:
    return next(o["rule"]["handle"] for o in kit.nft_ruleset()["nftables"] if o.get("rule", {}).get("chain") == chain)


def test_a_check_after_another_process_changed_the_ruleset_sees_the_change(host, kit, state_dir):
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert nft.check(ATT, _elements(), SECTIONS) is None
    _nft_elsewhere(host, f"delete rule inet pycni hostports_output handle {_handle(kit, 'hostports_output')}")
    assert nft.check(ATT, _elements(), SECTIONS) == "chain hostports_output of table inet pycni has 0 of its 1 rules"
    nft.repair(SECTIONS)
    assert nft.check(ATT, _elements(), SECTIONS) is None
    hairpin = _elements()[1]
    _nft_elsewhere(host, f"delete element inet pycni {hairpin.set} {{ {hairpin.key} }}")
    assert nft.check(ATT, _elements(), SECTIONS) == (
        f"element {hairpin.key} is missing from map {hairpin.set} of table inet pycni"
    )
    _nft_elsewhere(host, "delete table inet pycni")
    assert nft.check(ATT, _elements(), SECTIONS) == "table inet pycni is missing"


def test_the_rule_dump_is_not_kept_when_the_ruleset_changed_during_it(host, kit, monkeypatch, state_dir):
    """A dump that a transaction overtook is read again: neither this check nor the next one
    sees the state from before the transaction."""
    nft.ensure(SECTIONS)
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)  # a new generation: the next check dumps
    real = nfnl.Reader.rules
    reads: list[str] = []

    def overtaken(self: nfnl.Reader, table: str) -> list[nfnl.Rule]:
        rules = real(self, table)
        if not reads:
            _nft_elsewhere(host, f"delete rule inet pycni hostports_output handle {_handle(kit, 'hostports_output')}")
        reads.append(table)
        return rules

    monkeypatch.setattr(nfnl.Reader, "rules", overtaken)
    lost = ["chain hostports_output of table inet pycni has 0 of its 1 rules"]
    assert nft.skeleton_problems(SECTIONS) == lost
    assert len(reads) == 2  # the overtaken dump, then one of the state after the transaction
    assert nft.skeleton_problems(SECTIONS) == lost
    assert len(reads) == 2


def test_the_probe_answers_as_pyroute2s_requests(host):
    probe = nfnl.Probe()
    try:
        with nfnl.reading("inet") as decoded:
            before = probe.generation()
            assert before == decoded.generation()
            assert not probe.has_table("inet", "pycni")
            nft.run(["add table inet pycni"])
            assert probe.generation() == decoded.generation() == before + 1
            assert probe.has_table("inet", "pycni") and decoded.has_table("pycni")
            assert not probe.has_table("ip", "pycni") and not probe.has_table("bridge", "pycni")
    finally:
        probe.close()


def test_the_next_apply_heals_a_chain_flushed_by_another_process_at_once(host, kit, monkeypatch, state_dir):
    """The skeleton's verification is keyed by the ruleset generation, not by a timer: the
    very next ADD after someone else's change verifies and repairs, with no wait."""
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    rules = kit.nft_rule_count()
    _nft_elsewhere(host, "flush chain inet pycni hostports")
    dumps = _counting_dumps(monkeypatch)
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert dumps, "the foreign flush was seen"
    assert kit.nft_rule_count() == rules
    assert nft.skeleton_problems(SECTIONS) == []
    _nft_elsewhere(host, "delete table inet pycni")
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert kit.nft_rule_count() == rules
    assert nft.check(ATT, _elements(), SECTIONS) is None


def test_our_own_element_transactions_keep_the_verification(host, monkeypatch, state_dir):
    """ADDs and DELs of elements, in any thread, bump the generation by one each: nothing to
    verify again. A transaction that removes more than elements (here: a chain) forgets it."""
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    dumps = _counting_dumps(monkeypatch)
    other = Attachment("net1", "c2", "eth0")
    addr = ipaddress.ip_interface("10.88.0.6/16")
    for _ in range(3):
        netns.run_in(host.path, nft.apply, "portmap", other, _elements(8081, addr), SECTIONS, state_dir=state_dir)
        nft.release("portmap", other, state_dir=state_dir)
        nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert dumps == []
    nft.run(["add chain inet pycni unrelated"])
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert dumps == []
    nft.run(["delete chain inet pycni unrelated"])
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert dumps == ["inet"]


def test_a_map_found_bare_is_listed_again_only_after_a_change_to_it(host, monkeypatch, state_dir):
    """portmap's look at the host-IP map costs no listing while the map is known to hold no
    commented element: our own transactions touching the map, and anyone else's change, make
    the next look list it again."""
    nft.ensure(SECTIONS)
    listings: list[str] = []
    real = transport._LoggedNftables.json_cmd

    def counting(self, command):
        if "'map'" in str(command):
            listings.append(str(command))
        return real(self, command)

    monkeypatch.setattr(transport._LoggedNftables, "json_cmd", counting)
    specific = layout.hostport_element("tcp", 8080, A4.ip, 80, ipaddress.ip_address("198.18.0.1"))
    assert nft.map_elements("inet", specific.set) == []
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)  # leaves the map alone
    assert nft.map_elements("inet", specific.set) == []
    assert len(listings) == 1
    nft.apply("portmap", ATT, [*_elements(), specific], SECTIONS, state_dir=state_dir)
    assert [f.parsed.names(ATT) for f in nft.map_elements("inet", specific.set)] == [True]
    nft.release("portmap", ATT, state_dir=state_dir)
    assert nft.map_elements("inet", specific.set) == []
    assert len(listings) == 3
    _nft_elsewhere(
        host, f'add element inet pycni {specific.set} {{ 198.18.0.2 . tcp . 81 comment "x y" : 10.88.0.9 . 80 }}'
    )
    assert [f.comment for f in nft.map_elements("inet", specific.set)] == ["x y"]


def test_apply_release_and_record(host, kit, state_dir):
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    record = os.path.join(state_dir, "nft", f"{ATT.key}.portmap")
    assert stat.S_IMODE(os.stat(record).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(record)).st_mode) == 0o700
    comment = kit.nft_elements()["hostports4"][0][0]["elem"]["comment"]
    assert comment == f"{ATT.key} portmap net1 c1 eth0"
    nft.release("portmap", ATT, state_dir=state_dir)
    nft.release("portmap", ATT, state_dir=state_dir)
    assert not os.path.exists(record)
    assert not kit.nft_elements()["hostports4"]


def test_applies_look_for_the_state_dirs_epoch_once_a_second_and_the_first_one_claims_the_table(
    host, kit, state_dir, monkeypatch
):
    from pycni_plugins.kernel.nft import ownership
    from pycni_plugins.kernel.state import Records

    looked: list[str] = []
    real_load = Records.load
    monkeypatch.setattr(Records, "load", lambda self, name, **kw: (looked.append(name), real_load(self, name, **kw))[1])
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert ownership.authoritative(ownership.records(state_dir))
    looked.clear()
    for port in (9090, 9091):
        other = Attachment("net1", f"c{port}", "eth0")
        nft.apply(
            "portmap",
            other,
            _elements(port, ipaddress.ip_interface(f"10.88.{port % 100}.6/16")),
            SECTIONS,
            state_dir=state_dir,
        )
    assert looked.count("epoch") == 0, looked
    ownership._epoch_seen[state_dir] -= transport.VERIFY_EVERY  # a second later
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert looked.count("epoch") == 1, looked


def test_conflict_changes_nothing(host, kit, state_dir):
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    before = kit.nft_ruleset()
    other = Attachment("net1", "c2", "eth0")
    with pytest.raises(nft.ElementConflict):
        b = ipaddress.ip_interface("10.88.0.6/16")
        nft.apply(
            "portmap",
            other,
            [*_elements(9090, b), layout.hostport_element("tcp", 8080, b.ip, 80, None)],
            state_dir=state_dir,
        )
    assert kit.nft_ruleset() == before
    assert nft.holder(_elements()[0]).startswith(ATT.key)


def test_lost_state_dir_falls_back_to_comments(host, kit, state_dir):
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    shutil.rmtree(state_dir)
    nft.release("portmap", ATT, state_dir=state_dir)
    assert not kit.nft_elements()["hostports4"]


def test_listing_and_removal_by_attachment_for_gc(host, kit, state_dir):
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    nft.apply(
        "masq", ATT, [layout.masq_element(A4)], (layout.MASQ, layout.masq_subnet(A4.network)), state_dir=state_dir
    )
    groups = nft.attachments(state_dir=state_dir)
    assert set(groups) == {ATT.key}
    assert set(groups[ATT.key]["elements"]) == {"portmap", "masq"}
    assert groups[ATT.key]["record"] == {"network": "net1", "container_id": "c1", "ifname": "eth0"}
    nft.remove(ATT.key, state_dir=state_dir)
    assert nft.attachments(state_dir=state_dir) == {}
    assert not any(v for k, v in kit.nft_elements().items() if k != "epoch")


def test_symlinked_state_dir_is_refused(host, state_dir, tmp_path):
    os.makedirs(state_dir, mode=0o700)
    os.symlink(str(tmp_path), os.path.join(state_dir, "nft"))
    with pytest.raises(CNIError, match=r"refusing state dir .*/nft: it is a symlink") as info:
        nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    assert info.value.code == ErrorCode.IO_FAILURE


def test_restore_all_rebuilds_everything_recorded_from_the_records_alone(host, make_netns, state_dir):
    isolation = layout.isolation_elements("br-heal", isolated=True)
    fw = [layout.firewall_element(A4.ip)]
    fw_sections = [layout.FIREWALL, layout.admin_section("NOMAD-ADMIN"), layout.ISOLATION]
    nft.apply("firewall", ATT, fw, fw_sections, isolation, state_dir=state_dir)
    nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
    gone = Attachment("net1", "c2", "eth0")
    nft.apply("portmap", gone, _elements(9090, ipaddress.ip_interface("10.88.0.6/16")), SECTIONS, state_dir=state_dir)
    nft.release("portmap", gone, state_dir=state_dir)
    # Another host namespace sharing the state dir: its records are not this table's.
    other, elsewhere = make_netns("other"), Attachment("net2", "c3", "eth0")
    apply = nft.apply
    netns.run_in(
        other.path,
        lambda: apply(
            "firewall",
            elsewhere,
            [layout.firewall_element(ipaddress.ip_address("10.88.0.9"))],
            fw_sections[:1],
            state_dir=state_dir,
        ),
    )
    assert nft.restore_all(state_dir, layout.record_sections) == []  # nothing missing: nothing done

    _nft_elsewhere(host, "flush ruleset")
    done = nft.restore_all(state_dir, layout.record_sections)
    assert "repaired: table inet pycni is missing" in done
    assert sum(d.startswith("restored ") for d in done) == 3, done
    assert nft.skeleton_problems([*fw_sections, *SECTIONS]) == []
    assert nft.missing(ATT, [*fw, *_elements()]) == []
    assert all(nft.holder(e) == "" for e in isolation)  # the shared elements, uncommented
    assert {k for k, g in nft.attachments(state_dir).items() if g["elements"]} == {ATT.key}  # nor c2 nor c3
    assert nft.restore_all(state_dir, layout.record_sections) == []


def test_the_watcher_sees_who_removed_what(host, state_dir):
    with nfnl.watching() as watcher:
        nft.apply("portmap", ATT, _elements(), SECTIONS, state_dir=state_dir)
        nft.release("portmap", ATT, state_dir=state_dir)
        _nft_elsewhere(host, "flush ruleset")
        batches: list[nfnl.Batch] = []
        while len(batches) < 4:
            more = watcher.batches(2.0)
            assert more, batches
            batches += more
    structural = ("table", "chain", "rule", "set")
    mine = [b for b in batches if b.pid == os.getpid()]
    assert mine and not any(b.removes(nft.TABLE, structural) for b in mine)
    assert any(b.removes(nft.TABLE, ("element",)) for b in mine)  # the release
    flush = batches[-1]
    assert flush.pid not in (None, os.getpid()) and flush.removes(nft.TABLE, structural), batches
    assert ("table", "inet", "pycni") in flush.removed
    assert [b.generation for b in batches] == sorted(b.generation for b in batches)

"""GC and STATUS of the built-in plugins, and the nftables layer's GC, repair and epoch rules.

GC (spec 1.1): everything of the network whose (containerID, ifname) is not in
``cni.dev/valid-attachments`` goes; ``pycni.dev/dry-run`` only reports; a built-in plugin
returns ``{"removed": [...]}``. Other networks' state is never touched.
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
import shutil
import subprocess

import pytest

from pycni import netns
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import Attachment, PluginRequest, builtin_plugin
from pycni.sdk.invoke import exec_plugin
from pycni.sdk.skel import run as skel_run
from pycni_plugins.bridge import BridgePlugin
from pycni_plugins.firewall import FirewallPlugin
from pycni_plugins.host_local import HostLocalPlugin
from pycni_plugins.host_local import lease_cache as hl_cache
from pycni_plugins.install import install
from pycni_plugins.kernel import layout, nft
from pycni_plugins.kernel.nft import listing, ownership, transport
from pycni_plugins.portmap import PortmapPlugin
from tests.conftest import TEST_NS_PREFIX

pytestmark = pytest.mark.privileged

V4 = [{"subnet": "198.18.70.0/24"}]


def _gc(conf: dict, valid: list[tuple[str, str]] | None, *, dry: bool = False) -> PluginRequest:
    config = {k: v for k, v in conf.items() if k not in ("prevResult", "runtimeConfig")}
    config["cniVersion"] = "1.1.0"
    if valid is not None:
        config["cni.dev/valid-attachments"] = [{"containerID": c, "ifname": i} for c, i in valid]
    if dry:
        config["pycni.dev/dry-run"] = True
    return PluginRequest("GC", config, path=("/usr/lib/cni",))


def _lease_files(tmp_path, network: str = "testnet") -> dict[str, bytes]:
    d = tmp_path / "ipam" / network
    return {p.name: p.read_bytes() for p in d.iterdir() if p.name[0].isdigit()} if d.exists() else {}


def _ipam(tmp_path, network: str = "testnet") -> dict:
    return {
        "cniVersion": "1.1.0",
        "name": network,
        "ipam": {"type": "host-local", "ranges": [V4], "dataDir": str(tmp_path / "ipam")},
    }


# -- host-local --------------------------------------------------------------------------------


def test_host_local_gc_releases_leases_of_unknown_attachments(host, kit, tmp_path):
    plugin = HostLocalPlugin()
    conf = _ipam(tmp_path)
    for cid, ifname in (("a", "eth0"), ("a", "eth1"), ("b", "eth0"), ("c", "eth0")):
        plugin.handle(kit.request("ADD", conf, cid, "", ifname))
    d = tmp_path / "ipam" / "testnet"
    (d / "198.18.70.99").write_bytes(b"legacy")  # a bare-ID lease (old Go format)
    (d / "198.18.70.98").write_bytes(b"a")  # a bare-ID lease of a container that is still valid
    (d / "notes.txt").write_bytes(b"not a lease")  # not named by an IP: never touched

    before = _lease_files(tmp_path)
    dry = plugin.handle(_gc(conf, [("a", "eth0"), ("c", "eth0")], dry=True))
    assert _lease_files(tmp_path) == before
    out = plugin.handle(_gc(conf, [("a", "eth0"), ("c", "eth0")]))
    assert out == dry
    assert sorted(out["removed"]) == [
        "host-local lease 198.18.70.3 of a/eth1 (network testnet)",
        "host-local lease 198.18.70.4 of b/eth0 (network testnet)",
        "host-local lease 198.18.70.99 of legacy (legacy lease) (network testnet)",
    ]
    assert sorted(_lease_files(tmp_path)) == ["198.18.70.2", "198.18.70.5", "198.18.70.98"]
    assert (d / "notes.txt").exists()
    # Absent valid-attachments: none is valid (cnitool's GC, after it DEL'd every cached one).
    plugin.handle(_gc(conf, None))
    assert _lease_files(tmp_path) == {}


def test_host_local_gc_keeps_the_lease_cache_coherent(host, kit, tmp_path, monkeypatch):
    """In a long-lived process the leases are cached (inotify); GC's unlinks reach the cache, so
    a GC'd attachment can be added again (no "duplicate allocation") and its address reused."""
    monkeypatch.setattr(hl_cache, "_stores_opened", 10)  # the cache is on from the first store
    plugin = HostLocalPlugin()
    conf = _ipam(tmp_path) | {"ipam": _ipam(tmp_path)["ipam"] | {"ranges": [[{"subnet": "198.18.71.0/30"}]]}}
    first = plugin.handle(kit.request("ADD", conf, "a", ""))["ips"][0]["address"]
    with pytest.raises(CNIError, match="no IP addresses available"):
        plugin.handle(kit.request("ADD", conf, "b", ""))  # a /30 holds one address
    plugin.handle(kit.request("CHECK", conf, "a", ""))
    assert plugin.handle(_gc(conf, []))["removed"] == ["host-local lease 198.18.71.2 of a/eth0 (network testnet)"]
    with pytest.raises(CNIError, match="Failed to find address added by container a"):
        plugin.handle(kit.request("CHECK", conf, "a", ""))
    assert plugin.handle(kit.request("ADD", conf, "a", ""))["ips"][0]["address"] == first


# -- bridge ----------------------------------------------------------------------------------------


def _attach(kit, make_netns, conf: dict, cid: str) -> tuple[object, dict]:
    ns = make_netns("c")
    return ns, BridgePlugin().handle(kit.request("ADD", conf, cid, ns.path))


def test_bridge_gc_collects_veths_elements_records_and_leases(host, make_netns, kit, tmp_path, state_dir):
    conf = kit.bridge_conf(tmp_path, V4, macspoofchk=True)
    conf["cniVersion"] = "1.1.0"
    other = kit.bridge_conf(tmp_path, [{"subnet": "198.18.73.0/24"}], macspoofchk=True)
    other.update(cniVersion="1.1.0", name="othernet", isGateway=False, isDefaultGateway=False)  # same bridge
    ns_a, ra = _attach(kit, make_netns, conf, "a")
    ns_b, rb = _attach(kit, make_netns, conf, "b")
    ns_o, ro = _attach(kit, make_netns, other, "b")  # same container ID, other network
    foreign = make_netns("c")  # a veth pycni has no record of, on the same bridge
    ip = ["ip", "-n", host.name, "link"]
    subprocess.run(
        [*ip, "add", "vethforeign", "type", "veth", "peer", "name", "eth9", "netns", foreign.name], check=True
    )
    subprocess.run([*ip, "set", "vethforeign", "master", "pbr0", "up"], check=True)
    veth_b = rb["interfaces"][1]["name"]

    dry = BridgePlugin().handle(_gc(conf, [("a", "eth0")], dry=True))
    assert veth_b in kit.links_in(host.path)
    removed = BridgePlugin().handle(_gc(conf, [("a", "eth0")]))["removed"]
    assert removed == dry["removed"]
    text = "\n".join(removed)
    assert f"host veth {veth_b} of b/eth0 on bridge pbr0" in text
    assert "masq4 element 198.18.70.3" in text and f"spoofchk_ports element {veth_b}" in text
    assert "host-local lease 198.18.70.3 of b/eth0 (network testnet)" in text
    assert "othernet" not in text and ra["interfaces"][1]["name"] not in text

    left = kit.links_in(host.path)
    assert veth_b not in left and "vethforeign" in left
    assert ra["interfaces"][1]["name"] in left and ro["interfaces"][1]["name"] in left
    assert "eth0" not in kit.links_in(ns_b.path)  # the container end went with it
    assert sorted(_lease_files(tmp_path)) == ["198.18.70.2"]
    assert sorted(_lease_files(tmp_path, "othernet")) == ["198.18.73.2"]
    assert {e[0]["elem"]["val"] for e in kit.nft_elements()["masq4"]} == {"198.18.70.2", "198.18.73.2"}
    BridgePlugin().handle(kit.request("CHECK", conf | {"prevResult": ra}, "a", ns_a.path))
    BridgePlugin().handle(kit.request("CHECK", other | {"prevResult": ro}, "b", ns_o.path))
    assert not [r for r in os.listdir(os.path.join(state_dir, "bridge")) if "b" == r]


def test_bridge_status_is_its_ipam_status(host, kit, tmp_path):
    conf = kit.bridge_conf(tmp_path, V4)
    conf["cniVersion"] = "1.1.0"
    BridgePlugin().handle(PluginRequest("STATUS", conf, path=("/usr/lib/cni",)))
    BridgePlugin().handle(PluginRequest("STATUS", dict(conf, ipam={}), path=("/usr/lib/cni",)))  # no IPAM: ready
    bad = dict(conf, ipam=dict(conf["ipam"], type="no-such-ipam"))
    with pytest.raises(CNIError, match='failed to find plugin "no-such-ipam"'):
        BridgePlugin().handle(PluginRequest("STATUS", bad, path=("/usr/lib/cni",)))


# -- portmap and firewall --------------------------------------------------------------------------

PREV = {
    "cniVersion": "1.1.0",
    "interfaces": [{"name": "pbr0"}, {"name": "veth01234567"}, {"name": "eth0", "sandbox": "/x"}],
    "ips": [{"interface": 2, "address": "198.18.70.2/24"}],
}


def _prev(addr: str) -> dict:
    return dict(PREV, ips=[{"interface": 2, "address": addr}])


@pytest.mark.parametrize("plugin_type", ["portmap", "firewall"])
def test_portmap_and_firewall_gc(host, kit, plugin_type):
    plugin = PortmapPlugin() if plugin_type == "portmap" else FirewallPlugin()

    def conf(network: str, addr: str, port: int) -> dict:
        out = {"cniVersion": "1.1.0", "name": network, "type": plugin_type, "prevResult": _prev(addr)}
        if plugin_type == "portmap":
            out["runtimeConfig"] = {"portMappings": [{"hostPort": port, "containerPort": 80}]}
        return out

    plugin.handle(kit.request("ADD", conf("testnet", "198.18.70.2/24", 8080), "keep", "/x"))
    plugin.handle(kit.request("ADD", conf("testnet", "198.18.70.3/24", 8081), "stale", "/x"))
    plugin.handle(kit.request("ADD", conf("othernet", "198.18.71.3/24", 8082), "stale", "/x"))
    before = kit.nft_elements()
    dry = plugin.handle(_gc(conf("testnet", "198.18.70.2/24", 0), [("keep", "eth0")], dry=True))
    assert kit.nft_elements() == before
    out = plugin.handle(_gc(conf("testnet", "198.18.70.2/24", 0), [("keep", "eth0")]))
    assert out == dry and out["removed"] and all("of stale/eth0" in r for r in out["removed"])
    assert any(r.startswith("pycni state record nft/") for r in out["removed"])
    for network, cid, addr, port in (
        ("testnet", "keep", "198.18.70.2/24", 8080),
        ("othernet", "stale", "198.18.71.3/24", 8082),
    ):
        plugin.handle(kit.request("CHECK", conf(network, addr, port), cid, "/x"))
    with pytest.raises(CNIError):
        plugin.handle(kit.request("CHECK", conf("testnet", "198.18.70.3/24", 8081), "stale", "/x"))


@pytest.mark.parametrize("plugin_type", ["portmap", "firewall"])
def test_nftables_status(host, plugin_type, monkeypatch):
    plugin = PortmapPlugin() if plugin_type == "portmap" else FirewallPlugin()
    conf = {"cniVersion": "1.1.0", "name": "testnet", "type": plugin_type}
    plugin.handle(PluginRequest("STATUS", conf))

    class Broken:
        def cmd(self, text):
            return 1, "", "Error: Could not process rule: Operation not permitted"

    monkeypatch.setattr(transport, "context", Broken)
    with pytest.raises(CNIError) as e:
        plugin.handle(PluginRequest("STATUS", conf))
    assert e.value.code == ErrorCode.PLUGIN_NOT_AVAILABLE == 50
    assert e.value.msg == "nftables is not usable" and "Operation not permitted" in e.value.details


def test_exec_d_gc_prints_nothing(host, kit, tmp_path):
    conf = _ipam(tmp_path)
    HostLocalPlugin().handle(kit.request("ADD", conf, "a", ""))
    out = io.StringIO()
    env = {"CNI_COMMAND": "GC", "CNI_PATH": "/usr/lib/cni"}
    assert skel_run(HostLocalPlugin(), env, json.dumps(_gc(conf, []).config).encode(), out) == 0
    assert out.getvalue() == "" and _lease_files(tmp_path) == {}


# -- the nftables layer ---------------------------------------------------------------------------

A = Attachment("net1", "a", "eth0")
B = Attachment("net1", "b", "eth0")
ADDR = ipaddress.ip_interface("198.18.72.5/24")
SECTIONS = (layout.MASQ, layout.masq_subnet(ADDR.network))


def test_a_lost_state_dir_does_not_make_a_new_one_trusted(host, kit, state_dir):
    """The first record of a new state dir must not claim a table holding elements recorded in a
    lost one: a DEL without a record would then skip the search and leak them."""
    nft.apply("masq", A, [layout.masq_element(ADDR)], SECTIONS, state_dir=state_dir)
    shutil.rmtree(state_dir)
    nft.apply("masq", B, [layout.masq_element(ipaddress.ip_interface("198.18.72.6/24"))], SECTIONS, state_dir=state_dir)
    nft.release("masq", A, state_dir=state_dir)  # no record: found by its comment
    assert {e[0]["elem"]["val"] for e in kit.nft_elements()["masq4"]} == {"198.18.72.6"}


def test_a_rebuilt_table_is_claimed_again(host, kit, state_dir):
    nft.apply("masq", A, [layout.masq_element(ADDR)], SECTIONS, state_dir=state_dir)
    assert ownership.authoritative(ownership.records(state_dir))
    nft.run(["delete table inet pycni"])
    nft.apply("masq", B, [layout.masq_element(ipaddress.ip_interface("198.18.72.6/24"))], SECTIONS, state_dir=state_dir)
    assert ownership.authoritative(ownership.records(state_dir)), "the first commit into the new table claimed it back"


def test_an_epoch_a_power_cut_left_torn_is_claimed_anew_in_the_new_table(host, kit, state_dir):
    # State records are not fsync'd (kernel/state.py): after a power cut the epoch may be empty,
    # and the table it named is gone with the reboot (here: deleted).
    nft.apply("masq", A, [layout.masq_element(ADDR)], SECTIONS, state_dir=state_dir)
    nft.run(["delete table inet pycni"])
    epoch = os.path.join(state_dir, "nft", "epoch")
    with open(epoch, "wb"):
        pass
    ownership._epoch_seen.clear()  # what this process saw before the reboot
    nft.apply("masq", B, [layout.masq_element(ipaddress.ip_interface("198.18.72.6/24"))], SECTIONS, state_dir=state_dir)
    assert ownership.authoritative(ownership.records(state_dir))
    with open(epoch, "rb") as f:
        assert len(f.read()) > 2


def test_a_del_whose_record_a_power_cut_left_torn_searches_for_its_elements(host, kit, state_dir):
    """The state dir still claims the table, so a missing record would mean "no elements"; a
    torn one lists elements nobody can read: they are searched for, and the record goes."""
    nft.apply("masq", A, [layout.masq_element(ADDR)], SECTIONS, state_dir=state_dir)
    nft.apply("masq", B, [layout.masq_element(ipaddress.ip_interface("198.18.72.6/24"))], SECTIONS, state_dir=state_dir)
    record = os.path.join(state_dir, "nft", f"{A.key}.masq")
    with open(record, "r+b") as f:
        f.truncate(7)
    assert ownership.authoritative(ownership.records(state_dir))
    nft.release("masq", A, state_dir=state_dir)
    assert {e[0]["elem"]["val"] for e in kit.nft_elements()["masq4"]} == {"198.18.72.6"}
    assert not os.path.exists(record)


def test_only_the_state_dir_that_claimed_the_table_is_authoritative_in_one_process(host, kit, tmp_path):
    """Two state dirs in one namespace (two runtimes in one process): the answer is remembered
    per state dir, so the second never borrows the first one's authority."""
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    nft.apply("masq", A, [layout.masq_element(ADDR)], SECTIONS, state_dir=first)
    assert ownership.authoritative(ownership.records(first))
    nft.apply("masq", B, [layout.masq_element(ipaddress.ip_interface("198.18.72.6/24"))], SECTIONS, state_dir=second)
    assert not ownership.authoritative(ownership.records(second))
    assert ownership.authoritative(ownership.records(first))


def test_an_element_left_by_a_stale_attachment_is_not_taken_over_until_gc_collects_it(host, kit, state_dir):
    """Same address, same data, stale comment (its owner's DEL never ran): the new owner's ADD
    is refused naming the holder (it could as well be a live attachment), nothing changed; a
    GC that does not list the stale one collects its element, then the ADD succeeds."""
    element = layout.masq_element(ADDR)
    nft.apply("masq", A, [element], SECTIONS, state_dir=state_dir)
    ownership.records(state_dir).remove(f"{A.key}.masq")  # A is forgotten
    with pytest.raises(nft.ElementConflict, match=r"belongs to another attachment \(net1 a eth0\)"):
        nft.apply("masq", B, [element], SECTIONS, state_dir=state_dir)
    assert nft.holder(element).startswith(A.key)
    assert ownership.records(state_dir).load(f"{B.key}.masq") is None
    assert len(nft.collect("net1", [("b", "eth0")], ("masq",), state_dir=state_dir)) == 1
    nft.apply("masq", B, [element], SECTIONS, state_dir=state_dir)
    assert nft.check(B, [element], SECTIONS) is None
    assert nft.holder(element).startswith(B.key)


def test_forced_cleanup_lists_the_tables_once_and_removes_only_what_it_matched(host, kit, state_dir, monkeypatch):
    nft.apply("masq", A, [layout.masq_element(ADDR)], SECTIONS, state_dir=state_dir)
    nft.apply("masq", B, [layout.masq_element(ipaddress.ip_interface("198.18.72.6/24"))], SECTIONS, state_dir=state_dir)
    listings = []
    real = listing._listing
    monkeypatch.setattr(listing, "_listing", lambda: listings.append(1) or real())
    removed = nft.remove_attachments(lambda key, group: key == A.key, "a", state_dir=state_dir)
    assert listings == [1]
    assert removed == [
        "pycni inet pycni masq4 element 198.18.72.5 : goto masq-198_18_72_0_nm24 (masq)",
        f"pycni state record nft/{A.key}.masq",
    ]
    assert {e[0]["elem"]["val"] for e in kit.nft_elements()["masq4"]} == {"198.18.72.6"}
    assert ownership.records(state_dir).load(f"{B.key}.masq") is not None


def test_forced_cleanup_leaves_alone_a_key_another_attachment_took_over_since_the_listing(
    host, kit, state_dir, monkeypatch
):
    nft.apply("masq", A, [layout.masq_element(ADDR)], SECTIONS, state_dir=state_dir)
    stale = listing._listing()
    nft.release("masq", A, state_dir=state_dir)
    other = ipaddress.ip_interface("198.18.72.5/16")  # the same address, other data: B's now
    nft.apply(
        "masq", B, [layout.masq_element(other)], (layout.MASQ, layout.masq_subnet(other.network)), state_dir=state_dir
    )
    monkeypatch.setattr(listing, "_listing", lambda: stale)
    nft.remove_attachments(lambda key, group: key == A.key, "a", state_dir=state_dir)  # no error
    assert nft.holder(layout.masq_element(other)).startswith(B.key)


def test_flushed_rules_are_put_back_keeping_other_admin_jumps(host, kit):
    sections = [layout.FIREWALL, layout.admin_section("CNI-ADMIN"), layout.admin_section("NOMAD-ADMIN")]
    nft.ensure(sections)
    rules = kit.nft_rule_count()
    nft.run(["flush chain inet pycni forward"])
    assert nft.skeleton_problems(sections[:2]) == [
        "chain forward of table inet pycni has 0 of its 4 rules",
        "chain forward of table inet pycni has lost its jump to CNI-ADMIN",
    ]
    nft.repair(sections[:2])  # knows one admin chain; the other's jump is gone too
    assert nft.skeleton_problems(sections) == ["chain forward of table inet pycni has lost its jump to NOMAD-ADMIN"]
    nft.repair(sections)
    assert nft.skeleton_problems(sections) == [] and kit.nft_rule_count() == rules
    nft.run(["delete rule inet pycni forward handle " + _first_handle(kit, "forward", "accept")])
    nft.repair(sections)  # the jumps survive a refill of the chain
    assert nft.skeleton_problems(sections) == [] and kit.nft_rule_count() == rules


def _first_handle(kit, chain: str, verdict: str) -> str:
    for obj in kit.nft_ruleset()["nftables"]:
        rule = obj.get("rule")
        if rule and rule["chain"] == chain and any(verdict in e for e in rule["expr"]):
            return str(rule["handle"])
    raise AssertionError(f"no {verdict} rule in {chain}")


def test_bridge_del_without_the_netns_path_removes_the_veth_from_its_record(host, make_netns, kit, tmp_path):
    """The namespace lives on but DEL gets no (or a dead) CNI_NETNS: the host end, known from
    the record, is deleted, and the container end goes with it."""
    conf = kit.bridge_conf(tmp_path, V4)
    ns, result = _attach(kit, make_netns, conf, "a")
    veth = result["interfaces"][1]["name"]
    BridgePlugin().handle(kit.request("DEL", conf, "a", ""))
    assert veth not in kit.links_in(host.path)
    assert "eth0" not in kit.links_in(ns.path)
    assert _lease_files(tmp_path) == {}


# -- macvlan, ipvlan, vlan and host-device -----------------------------------------------------

LINK_NET = "linknet"


def _link_conf(tmp_path, plugin_type: str, network: str = LINK_NET, **extra) -> dict:
    ipam = {"type": "host-local", "ranges": [[{"subnet": "198.18.74.0/24"}]], "dataDir": str(tmp_path / "ipam")}
    return {"cniVersion": "1.1.0", "name": network, "type": plugin_type, "ipam": ipam, **extra}


def _veth(name: str, addr: str = "") -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("add", ifname=name, kind="veth", peer=f"{name}p", state="up")
        if addr:
            ipr.addr("add", index=ipr.link_lookup(ifname=name)[0], address=addr, prefixlen=24)


def _replace_eth0() -> None:
    """The recorded eth0 renamed away (``old0``), another eth0 in its place."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="eth0")[0], ifname="old0")
        ipr.link("add", ifname="eth0", kind="veth", peer="eth0p")


def _records(state_dir: str, kind: str) -> list[str]:
    d = os.path.join(state_dir, kind)
    return sorted(n for n in os.listdir(d) if not n.startswith(".")) if os.path.isdir(d) else []


def test_macvlan_gc_deletes_the_recorded_links_of_stale_attachments_only(host, make_netns, kit, tmp_path, state_dir):
    """Stale attachments: b (its macvlan still in its namespace), c (its namespace gone), r (its
    recorded link renamed away and another eth0 made: the recorded one goes, by ifindex and
    MAC, never the eth0 by name). The valid attachment a, attachment b of another network on
    the same master, and their leases stay."""
    _veth("gcm0")
    plugin = builtin_plugin("macvlan")
    conf = _link_conf(tmp_path, "macvlan", master="gcm0")
    other = _link_conf(tmp_path, "macvlan", network="othernet", master="gcm0")
    spaces = {cid: make_netns(cid) for cid in ("a", "b", "r", "o")}
    for cid in ("a", "b", "r"):
        plugin.handle(kit.request("ADD", conf, cid, spaces[cid].path))
    plugin.handle(kit.request("ADD", other, "b", spaces["o"].path))
    gone = netns.Throwaway(prefix=f"{TEST_NS_PREFIX}-gcgone")
    with gone:
        plugin.handle(kit.request("ADD", conf, "c", gone.path))
    netns.run_in(spaces["r"].path, _replace_eth0)
    newcomer = kit.links_in(spaces["r"].path)["eth0"]
    assert len(_records(state_dir, "macvlan")) == 5

    before = {cid: kit.links_in(ns.path) for cid, ns in spaces.items()}
    dry = plugin.handle(_gc(conf, [("a", "eth0")], dry=True))
    assert {cid: kit.links_in(ns.path) for cid, ns in spaces.items()} == before
    assert len(_records(state_dir, "macvlan")) == 5
    out = plugin.handle(_gc(conf, [("a", "eth0")]))
    assert out == dry
    removed = out["removed"]
    assert f"macvlan link eth0 of b/eth0 in {spaces['b'].path}" in removed
    assert f"macvlan link old0 of r/eth0 in {spaces['r'].path}" in removed
    assert not [r for r in removed if r.startswith("macvlan link") and "of c/eth0" in r]
    assert sum(r.startswith("pycni state record macvlan/") for r in removed) == 3  # b, c, r
    assert {r for r in removed if r.startswith("host-local")} == {
        "host-local lease 198.18.74.3 of b/eth0 (network linknet)",
        "host-local lease 198.18.74.4 of r/eth0 (network linknet)",
        "host-local lease 198.18.74.5 of c/eth0 (network linknet)",
    }
    assert "othernet" not in "\n".join(removed)

    assert set(kit.links_in(spaces["b"].path)) == {"lo"}
    left = kit.links_in(spaces["r"].path)
    assert "old0" not in left and (left["eth0"].index, left["eth0"].mac) == (newcomer.index, newcomer.mac)
    assert kit.links_in(spaces["a"].path)["eth0"].kind == "macvlan"
    assert kit.links_in(spaces["o"].path)["eth0"].kind == "macvlan"
    assert len(_records(state_dir, "macvlan")) == 2
    assert sorted(_lease_files(tmp_path, LINK_NET)) == ["198.18.74.2"]
    assert sorted(_lease_files(tmp_path, "othernet")) == ["198.18.74.2"]
    # The survivors are intact: their CHECK passes, their DEL still takes their link.
    for cid, c, ns in (("a", conf, spaces["a"]), ("b", other, spaces["o"])):
        plugin.handle(kit.request("DEL", c, cid, ns.path))
        assert set(kit.links_in(ns.path)) == {"lo"}
    assert plugin.handle(_gc(conf, []))["removed"] == []


def test_host_device_gc_gives_stale_devices_back_to_the_host(host, make_netns, kit, tmp_path, state_dir):
    """b's device comes back as DEL would bring it (host name, address, up); a's (valid) and
    the other network's stay in their containers."""
    for name, addr in (("hdv0", "198.18.75.1"), ("hds0", "198.18.76.1"), ("hdo0", "")):
        _veth(name, addr)
    plugin = builtin_plugin("host-device")
    ns_a, ns_b, ns_o = make_netns("a"), make_netns("b"), make_netns("o")
    plugin.handle(kit.request("ADD", _link_conf(tmp_path, "host-device", device="hdv0"), "a", ns_a.path))
    plugin.handle(kit.request("ADD", _link_conf(tmp_path, "host-device", device="hds0"), "b", ns_b.path))
    other = _link_conf(tmp_path, "host-device", network="othernet", device="hdo0")
    plugin.handle(kit.request("ADD", other, "b", ns_o.path))
    assert not {"hdv0", "hds0", "hdo0"} & set(kit.links_in(None))

    conf = _link_conf(tmp_path, "host-device", device="hdv0")
    dry = plugin.handle(_gc(conf, [("a", "eth0")], dry=True))
    assert "eth0" in kit.links_in(ns_b.path)
    out = plugin.handle(_gc(conf, [("a", "eth0")]))
    assert out == dry
    assert f"host-device link eth0 of b/eth0 in {ns_b.path}" in out["removed"]
    assert "host-local lease 198.18.74.3 of b/eth0 (network linknet)" in out["removed"]
    back = kit.links_in(None)["hds0"]
    assert back.up and set(kit.links_in(ns_b.path)) == {"lo"}
    from pycni_plugins.kernel import addressing
    from pycni_plugins.kernel import links as kernel_links

    with kernel_links.iproute() as ipr:
        assert "198.18.76.1/24" in {str(a) for a, _ in addressing.addresses(ipr, back.index)}
        assert ipr.link("get", index=back.index)[0].get("ifalias") in (None, "")
    assert "eth0" in kit.links_in(ns_a.path) and "eth0" in kit.links_in(ns_o.path)
    assert len(_records(state_dir, "host-device")) == 2
    plugin.handle(kit.request("DEL", conf, "a", ns_a.path))
    assert "hdv0" in kit.links_in(None)


def _record_veth_as(kind: str, ns: netns.Throwaway, network: str, cid: str, state_dir: str) -> None:
    """What ``kind``'s ADD records, for a link this kernel can make (it has no ipvlan or vlan
    driver): the eth0 of a veth in ``ns``."""
    from pycni_plugins.kernel import links as kernel_links
    from pycni_plugins.kernel import owned

    netns.run_in(ns.path, _veth, "eth0")

    def get():
        with kernel_links.iproute() as ipr:
            return kernel_links.get_link(ipr, "eth0")

    fd = os.open(ns.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        records = owned.LinkRecords(kind, state_dir)
        records.made(Attachment(network, cid, "eth0"), fd, ns.path, netns.run_in(ns.path, get))
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["ipvlan", "vlan"])
def test_ipvlan_and_vlan_gc_take_recorded_links_of_stale_attachments_only(
    host, make_netns, kit, tmp_path, state_dir, kind
):
    """Their GC is macvlan's (shared in _sublink); this kernel has no driver for them, so the
    records name veths: the stale attachment's link and record go, a failed ADD's record (naming
    no link) goes, the valid attachment's and the other network's stay."""
    ns_a, ns_b, ns_o = make_netns("a"), make_netns("b"), make_netns("o")
    _record_veth_as(kind, ns_a, LINK_NET, "a", state_dir)
    _record_veth_as(kind, ns_b, LINK_NET, "b", state_dir)
    _record_veth_as(kind, ns_o, "othernet", "b", state_dir)
    from pycni_plugins.kernel import owned

    owned.LinkRecords(kind, state_dir).nothing_created(Attachment(LINK_NET, "f", "eth0"))
    conf = {"cniVersion": "1.1.0", "name": LINK_NET, "type": kind, "master": "gcm0"}
    out = builtin_plugin(kind).handle(_gc(conf, [("a", "eth0")]))
    removed = out["removed"]
    links_removed = [r for r in removed if not r.startswith("pycni state record")]
    assert links_removed == [f"{kind} link eth0 of b/eth0 in {ns_b.path}"]
    assert sorted(r.split(" of ")[1] for r in removed if r not in links_removed) == ["b/eth0", "f/eth0"]
    assert set(kit.links_in(ns_b.path)) == {"lo"}
    assert "eth0" in kit.links_in(ns_a.path) and "eth0" in kit.links_in(ns_o.path)
    assert len(_records(state_dir, kind)) == 2


def test_exec_d_link_plugin_gc_collects_and_prints_nothing(host, make_netns, kit, tmp_path, state_dir):
    """The installed macvlan binary (the shim, no daemon) collects what the in-process ADD made."""
    _veth("gcm0")
    bindir = tmp_path / "bin"
    install(str(bindir))
    conf = _link_conf(tmp_path, "macvlan", master="gcm0")
    ns_a, ns_b = make_netns("a"), make_netns("b")
    plugin = builtin_plugin("macvlan")
    plugin.handle(kit.request("ADD", conf, "a", ns_a.path))
    plugin.handle(kit.request("ADD", conf, "b", ns_b.path))
    request = _gc(conf, [("a", "eth0")])
    request = PluginRequest("GC", request.config, path=(str(bindir),))
    assert exec_plugin("macvlan", request, timeout=60) is None
    assert set(kit.links_in(ns_b.path)) == {"lo"} and "eth0" in kit.links_in(ns_a.path)
    assert len(_records(state_dir, "macvlan")) == 1
    assert sorted(_lease_files(tmp_path, LINK_NET)) == ["198.18.74.2"]

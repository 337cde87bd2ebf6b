"""bridge: result shape, kernel state, CHECK, DEL edge cases, rollback, dual stack, concurrency."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import os
import re
import subprocess
import threading

import pytest

from pycni import netns
from pycni.errors import CNIError
from pycni_plugins.bridge import BridgePlugin

pytestmark = pytest.mark.privileged

V4 = [{"subnet": "10.77.0.0/24"}]
V6 = [{"subnet": "fd77::/64"}]


def _leases(tmp_path) -> list[str]:
    d = tmp_path / "ipam" / "testnet"
    return (
        sorted(p.name for p in d.iterdir() if p.name != "lock" and not p.name.startswith("last_")) if d.exists() else []
    )


def test_dual_stack_add_result_and_kernel_state(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    conf = kit.bridge_conf(tmp_path, V4, V6)
    out = BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))

    br, veth, eth0 = out["interfaces"]
    assert br["name"] == "pbr0" and "sandbox" not in br
    assert veth["name"].startswith("veth") and len(veth["name"]) == 12
    assert eth0["name"] == "eth0" and eth0["sandbox"] == ctr.path
    assert out["ips"] == [
        {"interface": 2, "address": "10.77.0.2/24", "gateway": "10.77.0.1"},
        {"interface": 2, "address": "fd77::2/64", "gateway": "fd77::1"},
    ]
    assert out["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.77.0.1"}, {"dst": "::/0", "gw": "fd77::1"}]

    host_links = kit.links_in(host.path)
    assert host_links["pbr0"].kind == "bridge" and host_links["pbr0"].mac == br["mac"]
    assert host_links[veth["name"]].master == host_links["pbr0"].index
    assert host_links[veth["name"]].mac == veth["mac"] and host_links[veth["name"]].operstate == "UP"
    ctr_links = kit.links_in(ctr.path)
    assert ctr_links["eth0"].kind == "veth" and ctr_links["eth0"].up and ctr_links["eth0"].mac == eth0["mac"]

    assert kit.sysctl_in(None, "net/ipv6/conf/pbr0/accept_ra") == "0"
    assert kit.sysctl_in(None, f"net/ipv6/conf/{veth['name']}/accept_ra") == "0"
    assert kit.sysctl_in(None, "net/ipv4/ip_forward") == "1"
    assert kit.sysctl_in(None, "net/ipv6/conf/all/forwarding") == "1"
    for name, value in (("ipv6/conf/eth0/accept_dad", "0"), ("ipv4/conf/eth0/arp_notify", "1")):
        assert kit.sysctl_in(ctr.path, f"net/{name}") == value
    assert kit.sysctl_in(ctr.path, "net/ipv6/conf/eth0/keep_addr_on_down") == "1"

    def addrs_and_routes():
        from pycni_plugins.kernel import addressing, links, routing

        with links.iproute() as ipr:
            idx = links.get_link(ipr, "eth0").index
            addrs = {str(a) for a, _ in addressing.addresses(ipr, idx)}
            v4 = routing.has_route(ipr, idx, ipaddress.ip_network("0.0.0.0/0"), "10.77.0.1")
            v6 = routing.has_route(ipr, idx, ipaddress.ip_network("::/0"), "fd77::1")
        return addrs, v4, v6

    addrs, v4, v6 = netns.run_in(ctr.path, addrs_and_routes)
    assert {"10.77.0.2/24", "fd77::2/64"} <= addrs and v4 and v6

    masq = kit.nft_elements()
    assert len(masq["masq4"]) == 1 and len(masq["masq6"]) == 1

    BridgePlugin().handle(kit.request("CHECK", {**conf, "prevResult": out}, "c1", ctr.path))


def test_del_is_idempotent_and_releases_everything(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    conf = kit.bridge_conf(tmp_path, V4, V6)
    plugin = BridgePlugin()
    plugin.handle(kit.request("ADD", conf, "c1", ctr.path))
    assert _leases(tmp_path) == ["10.77.0.2", "fd77::2"]
    for _ in range(2):
        plugin.handle(kit.request("DEL", conf, "c1", ctr.path))
    assert "eth0" not in kit.links_in(ctr.path)
    assert [n for n in kit.links_in(host.path) if n.startswith("veth")] == []
    assert _leases(tmp_path) == []
    assert all(not v for k, v in kit.nft_elements().items() if k.startswith("masq"))


def test_del_returns_with_the_link_gone_and_leaves_no_thread_or_socket(host, make_netns, kit, tmp_path):
    conf = kit.bridge_conf(tmp_path, V4)
    plugin = BridgePlugin()
    warm = make_netns("c")  # a first cycle creates what lives as long as the process (caches)
    plugin.handle(kit.request("ADD", conf, "warm", warm.path))
    plugin.handle(kit.request("DEL", conf, "warm", warm.path))
    ctr = make_netns("c")
    veth = plugin.handle(kit.request("ADD", conf, "c1", ctr.path))["interfaces"][1]["name"]
    kit.join_delete_helpers()  # earlier tests' (and the warm-up's) helpers may still be finishing
    fds, threads = sorted(os.listdir("/proc/self/fd")), set(threading.enumerate())
    plugin.handle(kit.request("DEL", conf, "c1", ctr.path))
    # Unlisted when DEL returns (the kernel may still be finishing the delete in the helper).
    assert "eth0" not in kit.links_in(ctr.path) and veth not in kit.links_in(None)
    kit.join_delete_helpers()
    assert set(threading.enumerate()) == threads
    assert sorted(os.listdir("/proc/self/fd")) == fds
    plugin.handle(kit.request("DEL", conf, "c1", ctr.path))  # nothing left to delete: fine


@pytest.mark.parametrize("how", ["empty-netns", "gone-netns", "gone-link"])
def test_del_removes_masquerade_even_without_the_link(host, make_netns, kit, tmp_path, how):
    ctr = make_netns("c")
    conf = kit.bridge_conf(tmp_path, V4)
    plugin = BridgePlugin()
    plugin.handle(kit.request("ADD", conf, "c1", ctr.path))
    assert len(kit.nft_elements()["masq4"]) == 1
    path = ctr.path
    if how == "empty-netns":
        path = ""
    elif how == "gone-netns":
        path = str(tmp_path / "nonexistent")
    else:
        from pycni_plugins.kernel import links

        netns.run_in(ctr.path, links.delete_link, "eth0")
    plugin.handle(kit.request("DEL", conf, "c1", path))
    assert kit.nft_elements()["masq4"] == []
    assert _leases(tmp_path) == []
    assert not os.path.exists(str(tmp_path / "nonexistent"))


def test_ipv6_only(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    conf = kit.bridge_conf(tmp_path, V6)
    out = BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
    assert out["ips"] == [{"interface": 2, "address": "fd77::2/64", "gateway": "fd77::1"}]
    assert out["routes"] == [{"dst": "::/0", "gw": "fd77::1"}]
    assert kit.nft_elements()["masq6"] and not kit.nft_elements()["masq4"]


def test_l2_mode_without_ipam(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    conf = {"cniVersion": "1.0.0", "name": "l2", "type": "bridge", "bridge": "pbr1", "hairpinMode": True}
    out = BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
    assert "ips" not in out and len(out["interfaces"]) == 3
    assert kit.links_in(ctr.path)["eth0"].up
    shown = subprocess.run(
        ["ip", "-n", host.name, "-d", "-j", "link", "show", "dev", out["interfaces"][1]["name"]],
        capture_output=True,
        check=True,
    ).stdout
    assert json.loads(shown)[0]["linkinfo"]["info_slave_data"]["hairpin"] is True
    BridgePlugin().handle(kit.request("DEL", conf, "c1", ctr.path))
    assert "eth0" not in kit.links_in(ctr.path)


def test_040_result_has_versions_and_dns(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    conf = kit.bridge_conf(tmp_path, V4, cniVersion="0.4.0")
    out = BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
    assert out["ips"] == [{"version": "4", "interface": 2, "address": "10.77.0.2/24", "gateway": "10.77.0.1"}]
    assert out["dns"] == {}


def test_config_errors(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    plugin = BridgePlugin()
    base = kit.bridge_conf(tmp_path, V4)
    with pytest.raises(CNIError, match="^cannot set hairpin mode and promiscuous mode at the same time$"):
        plugin.handle(kit.request("ADD", {**base, "hairpinMode": True, "promiscMode": True}, "c1", ctr.path))
    with pytest.raises(CNIError, match=r"invalid VLAN ID 5000 \(must be between 0 and 4094\)"):
        plugin.handle(kit.request("ADD", {**base, "vlan": 5000}, "c1", ctr.path))
    with pytest.raises(CNIError, match="failed to open netns"):
        plugin.handle(kit.request("ADD", base, "c1", str(tmp_path / "nope")))
    assert not (tmp_path / "nope").exists()


def test_failure_after_ipam_rolls_everything_back(host, make_netns, kit, tmp_path):
    a, b = make_netns("c"), make_netns("c")
    conf = kit.bridge_conf(tmp_path, [{"subnet": "10.79.0.0/30"}])  # one usable address: .2
    plugin = BridgePlugin()
    plugin.handle(kit.request("ADD", conf, "a", a.path))
    before = kit.nft_elements()
    with pytest.raises(CNIError, match="no IP addresses available"):
        plugin.handle(kit.request("ADD", conf, "b", b.path))
    assert "eth0" not in kit.links_in(b.path)
    assert len([n for n in kit.links_in(host.path) if n.startswith("veth")]) == 1
    assert kit.nft_elements() == before
    # A gateway that clashes with the bridge's address fails after IPAM: IPAM is released too.
    other = kit.bridge_conf(tmp_path, [{"subnet": "10.80.0.0/24"}], name="other")
    with pytest.raises(CNIError, match='"pbr0" already has an IP address different from 10.80.0.1/24'):
        plugin.handle(kit.request("ADD", other, "b", b.path))
    assert not list((tmp_path / "ipam" / "other").glob("10.*"))
    assert "eth0" not in kit.links_in(b.path)


def test_existing_non_bridge_link_is_refused(host, make_netns, kit, tmp_path):
    from pycni_plugins.kernel import links

    fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        links.add_veth(
            "pbr0", links.random_mac(), peer_name="pbr0peer", peer_netns_fd=fd, peer_mac=None, mtu=0, master=None
        )
    finally:
        os.close(fd)
    ctr = make_netns("c")
    with pytest.raises(CNIError, match='failed to create bridge "pbr0": "pbr0" already exists but is not a bridge'):
        BridgePlugin().handle(kit.request("ADD", kit.bridge_conf(tmp_path, V4), "c1", ctr.path))


def test_check_reports_reference_errors(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    conf = kit.bridge_conf(tmp_path, V4)
    out = BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
    bad = json.loads(json.dumps(out))
    bad["interfaces"][2]["mac"] = "02:00:00:00:00:01"
    with pytest.raises(CNIError, match="Interface eth0 Mac 02:00:00:00:00:01 doesn't match container Mac"):
        BridgePlugin().handle(kit.request("CHECK", {**conf, "prevResult": bad}, "c1", ctr.path))
    with pytest.raises(CNIError, match="Required prevResult missing"):
        BridgePlugin().handle(kit.request("CHECK", conf, "c1", ctr.path))
    bad = json.loads(json.dumps(out))
    bad["ips"][0]["address"] = "10.77.0.99/24"
    with pytest.raises(CNIError, match="Failed to match addr 10.77.0.99/24 on interface eth0"):
        BridgePlugin().handle(kit.request("CHECK", {**conf, "prevResult": bad}, "c1", ctr.path))


def test_containers_reach_each_other(host, make_netns, kit, tmp_path):
    a, b = make_netns("c"), make_netns("c")
    conf = kit.bridge_conf(tmp_path, V4, V6)
    plugin = BridgePlugin()
    plugin.handle(kit.request("ADD", conf, "a", a.path))
    plugin.handle(kit.request("ADD", conf, "b", b.path))
    stop = kit.serve_tcp(b.path, "::", 7000)
    try:
        assert kit.tcp_get(a.path, "10.77.0.3", 7000) == b"pong"
        assert kit.tcp_get(a.path, "fd77::3", 7000) == b"pong"
        assert kit.tcp_get(None, "10.77.0.3", 7000) == b"pong"  # the host via the gateway address
    finally:
        stop()


def test_rule_count_does_not_grow_with_containers(host, make_netns, kit, tmp_path):
    conf = kit.bridge_conf(tmp_path, V4, V6)
    plugin = BridgePlugin()
    plugin.handle(kit.request("ADD", conf, "c0", make_netns("c").path))
    rules = kit.nft_rule_count()
    for i in range(1, 5):
        plugin.handle(kit.request("ADD", conf, f"c{i}", make_netns("c").path))
    assert kit.nft_rule_count() == rules
    assert len(kit.nft_elements()["masq4"]) == 5


def test_50_concurrent_adds_on_a_missing_bridge_threads(host, make_netns, kit, tmp_path):
    conf = kit.bridge_conf(tmp_path, [{"subnet": "10.81.0.0/24"}], [{"subnet": "fd81::/64"}])
    ctrs = [make_netns("c") for _ in range(50)]
    plugin = BridgePlugin()

    def add(i: int) -> dict:
        with netns.entered(host.path):
            return plugin.handle(kit.request("ADD", conf, f"c{i}", ctrs[i].path))

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        results = list(pool.map(add, range(50)))
    addrs = [r["ips"][0]["address"] for r in results]
    assert len(set(addrs)) == 50
    assert len(kit.nft_elements()["masq4"]) == 50
    assert len([n for n in kit.links_in(host.path) if n.startswith("veth")]) == 50


def test_50_concurrent_adds_on_a_missing_bridge_processes(host, make_netns, kit, tmp_path, state_dir):
    from pycni_plugins.install import install

    bindir = tmp_path / "bin"
    install(str(bindir), ["bridge", "host-local"])
    conf = json.dumps(kit.bridge_conf(tmp_path, [{"subnet": "10.82.0.0/24"}])).encode()
    ctrs = [make_netns("c") for _ in range(50)]
    env = {**os.environ, "CNI_COMMAND": "ADD", "CNI_IFNAME": "eth0", "CNI_PATH": str(bindir)}
    # Children inherit the forking thread's namespace: the test thread is in the host one. They
    # get each container namespace as an inherited fd: the /run/netns bind mounts made while this
    # thread sits in another namespace are not always visible to children.
    fds = [os.open(c.path, os.O_RDONLY) for c in ctrs]
    procs = [
        subprocess.Popen(
            [str(bindir / "bridge")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(fd,),
            env={**env, "CNI_CONTAINERID": f"p{i}", "CNI_NETNS": f"/proc/self/fd/{fd}"},
        )
        for i, fd in enumerate(fds)
    ]
    for fd in fds:
        os.close(fd)
    outs = []
    for p in procs:
        out, _ = p.communicate(conf, timeout=120)
        assert p.returncode == 0, out
        outs.append(json.loads(out))
    assert len({o["ips"][0]["address"] for o in outs}) == 50
    assert len(kit.nft_elements()["masq4"]) == 50


def test_port_options_mac_mtu_promisc_isolation_spoofchk(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    conf = {
        "cniVersion": "1.0.0",
        "name": "opts",
        "type": "bridge",
        "bridge": "pbr2",
        "mtu": 1400,
        "promiscMode": True,
        "portIsolation": True,
        "macspoofchk": True,
        "runtimeConfig": {"mac": "02:11:22:33:44:55"},
    }
    out = BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path, args="IgnoreUnknown=1;MAC=02:00:00:00:00:09"))
    veth = out["interfaces"][1]["name"]
    assert out["interfaces"][2]["mac"] == "02:11:22:33:44:55"  # runtimeConfig.mac beats CNI_ARGS MAC
    ctr_link = kit.links_in(ctr.path)["eth0"]
    assert ctr_link.mac == "02:11:22:33:44:55" and ctr_link.mtu == 1400
    host_links = kit.links_in(host.path)
    assert host_links[veth].mtu == 1400 and host_links["pbr2"].mtu == 1400 and host_links["pbr2"].promisc

    def show(*args: str):
        return json.loads(subprocess.run(["ip", "-n", host.name, "-j", *args], capture_output=True, check=True).stdout)

    assert show("-d", "link", "show", "dev", veth)[0]["linkinfo"]["info_slave_data"]["isolated"] is True
    spoof = kit.nft_elements()
    assert [e["elem"]["val"] for e in spoof["bridge:spoofchk_ports"]] == [veth]
    BridgePlugin().handle(kit.request("DEL", conf, "c1", ctr.path))
    assert not kit.nft_elements()["bridge:spoofchk_ports"]


def test_cni_args_mac_and_unknown_args(host, make_netns, kit, tmp_path):
    ctr = make_netns("c")
    conf = {"cniVersion": "1.0.0", "name": "l2", "type": "bridge", "bridge": "pbr3"}
    with pytest.raises(CNIError, match=r'ARGS: unknown args \["FOO=bar"\]'):
        BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path, args="FOO=bar"))
    out = BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path, args="MAC=02:00:00:00:00:09"))
    assert out["interfaces"][2]["mac"] == "02:00:00:00:00:09"


def _vlan_filtering_supported(make_netns) -> bool:
    from pycni_plugins.kernel import links

    def probe() -> bool:
        with links.iproute() as ipr:
            try:
                links.ensure_bridge(ipr, "probe0", vlan_filtering=True)
            except links.LinkError:
                return False
            return True

    return netns.run_in(make_netns("probe").path, probe)


VLAN_CONF = {
    "cniVersion": "1.0.0",
    "name": "v",
    "type": "bridge",
    "bridge": "pbr4",
    "vlan": 100,
    "vlanTrunk": [{"id": 200}, {"minID": 300, "maxID": 301}],
}


def test_vlan_config_is_applied_or_refused_cleanly(host, make_netns, kit, tmp_path):
    """With VLAN filtering in the kernel the port gets its VLANs; without it (this CI's kernel) the
    ADD is refused and nothing is left behind."""
    if not _vlan_filtering_supported(make_netns):
        _vlan_refused_cleanly(make_netns, kit, tmp_path)
        return
    ctr = make_netns("c")
    out = BridgePlugin().handle(kit.request("ADD", VLAN_CONF, "c1", ctr.path))
    veth = out["interfaces"][1]["name"]
    vlans = subprocess.run(["bridge", "-n", host.name, "-j", "vlan", "show", "dev", veth], capture_output=True).stdout
    entries = {v["vlan"]: v.get("flags", []) for v in json.loads(vlans)[0]["vlans"]}
    assert set(entries) == {100, 200, 300, 301}
    assert set(entries[100]) == {"PVID", "Egress Untagged"}


def _vlan_refused_cleanly(make_netns, kit, tmp_path):
    from pycni_plugins.kernel import links

    ctr = make_netns("c")
    conf = {**VLAN_CONF, "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"), "subnet": "10.77.0.0/24"}}
    before = set(kit.links_in(None))
    unsupported = re.escape("VLAN filtering is not available in this kernel (CONFIG_BRIDGE_VLAN_FILTERING)")
    with pytest.raises(CNIError, match=f'^failed to create bridge "pbr4": {unsupported}: Operation not supported$'):
        BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
    assert set(kit.links_in(None)) == before and set(kit.links_in(ctr.path)) == {"lo"}
    assert not (tmp_path / "ipam").exists() and kit.nft_elements() == {}

    # A bridge that already exists (without VLAN filtering): the port's VLANs are refused and the
    # veth pair is rolled back before IPAM runs.
    with links.iproute() as ipr:
        links.ensure_bridge(ipr, "pbr4")
    with pytest.raises(CNIError, match=f'^failed to setup port "veth[0-9a-f]{{8}}" of bridge pbr4: {unsupported}'):
        BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
    assert set(kit.links_in(None)) == before | {"pbr4"} and set(kit.links_in(ctr.path)) == {"lo"}
    assert not (tmp_path / "ipam").exists() and kit.nft_elements() == {}


@pytest.mark.reference
def test_an_add_whose_ipam_presents_another_attachments_address_is_refused_and_keeps_its_masquerade(
    host, make_netns, kit, tmp_path
):
    """Masquerade elements are keyed by address: a second attachment handed the same address
    (here by the reference static IPAM) must not take the first's element over, and neither
    its undo nor its DEL may delete it."""
    conf = {**kit.bridge_conf(tmp_path, V4), "ipam": {"type": "static", "addresses": [{"address": "10.77.0.5/24"}]}}
    plugin = BridgePlugin()
    first, second = make_netns("c"), make_netns("c")
    result = plugin.handle(kit.request("ADD", conf, "owner", first.path))
    masq = kit.nft_elements()["masq4"]
    with pytest.raises(CNIError, match=r"ipMasq|masquerade") as raised:
        plugin.handle(kit.request("ADD", conf, "thief", second.path))
    assert "belongs to another attachment (testnet owner eth0)" in raised.value.msg
    assert kit.nft_elements()["masq4"] == masq
    assert set(kit.links_in(second.path)) == {"lo"}
    plugin.handle(kit.request("DEL", conf, "thief", second.path))
    assert kit.nft_elements()["masq4"] == masq
    plugin.handle(kit.request("CHECK", {**conf, "prevResult": result}, "owner", first.path))


@pytest.mark.parametrize("force", [True, False])
def test_two_ipv4_gateways_end_as_the_reference_ends_them(host, make_netns, kit, tmp_path, force):
    """The reference adds gateways one by one: with forceAddress the second replaces the first
    (IPv4 has one gateway address per bridge), without it the second is refused."""
    from pycni_plugins.kernel import addressing, links

    ctr = make_netns("c")
    conf = kit.bridge_conf(tmp_path, V4, [{"subnet": "10.78.0.0/24"}]) | {"forceAddress": force}

    def bridge_v4() -> list[str]:
        with links.iproute() as ipr:
            return sorted(str(a) for a, _ in addressing.addresses(ipr, links.get_link(ipr, "pbr0").index, 2))

    if force:
        BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
        assert bridge_v4() == ["10.78.0.1/24"]
    else:
        with pytest.raises(CNIError, match='"pbr0" already has an IP address different from 10.78.0.1/24'):
            BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
        assert bridge_v4() == ["10.77.0.1/24"]

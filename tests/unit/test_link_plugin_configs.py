"""Config parsing of macvlan, ipvlan, vlan and host-device, and their CHECK comparisons, without a
kernel (the ipvlan and 802.1Q drivers are missing on the development machine, so this is where
their attribute checks are pinned)."""

from __future__ import annotations

import pytest

from pycni.errors import CNIError
from pycni.sdk import PluginRequest
from pycni_plugins import bridge, ipvlan, macvlan, vlan, vrf
from pycni_plugins.kernel.links import Link


def _req(config: dict, args: str = "") -> PluginRequest:
    return PluginRequest("ADD", {"cniVersion": "1.0.0", "name": "n", **config}, "c1", "/run/netns/x", "eth0", args)


def _link(kind: str, mtu: int = 1500) -> Link:
    return Link(5, "eth0", "02:00:00:00:00:01", kind, 0, mtu, 0, 0, "UP")


def test_macvlan_mac_precedence_config_then_cni_args_then_runtime_config():
    conf = {"type": "macvlan", "mac": "02:00:00:00:00:01"}
    assert macvlan.load_config(_req(conf)).mac == "02:00:00:00:00:01"
    assert macvlan.load_config(_req(conf, "MAC=02-00-00-00-00-02")).mac == "02:00:00:00:00:02"
    rc = {**conf, "runtimeConfig": {"mac": "02:00:00:00:00:03"}}
    assert macvlan.load_config(_req(rc, "MAC=02:00:00:00:00:02")).mac == "02:00:00:00:00:03"
    with pytest.raises(CNIError, match=r'ARGS: unknown args \["FOO=1"\]'):
        macvlan.load_config(_req(conf, "FOO=1"))


def test_macvlan_check_compares_the_mode():
    macvlan._verify("vepa")(_link("macvlan"), {"IFLA_MACVLAN_MODE": "vepa"})
    with pytest.raises(CNIError, match="container macvlan mode bridge does not match expected value: private"):
        macvlan._verify("private")(_link("macvlan"), {"IFLA_MACVLAN_MODE": "bridge"})


def test_ipvlan_takes_the_master_and_ips_from_a_single_interface_prev_result():
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "ens5"}],
        "ips": [{"address": "198.18.3.4/24", "interface": 0}],
    }
    conf = ipvlan.load_config(_req({"type": "ipvlan", "prevResult": prev}))
    assert conf.master == "ens5" and conf.chained and not conf.ipam_type
    two = {**prev, "interfaces": [{"name": "a"}, {"name": "b"}]}
    with pytest.raises(CNIError, match="chained master failure. PrevResult lacks a single named interface"):
        ipvlan.load_config(_req({"type": "ipvlan", "prevResult": two}))
    with pytest.raises(CNIError, match="no plugin name provided"):
        ipvlan.IpvlanPlugin().validate(_req({"type": "ipvlan", "master": "ens5"}))


def test_ipvlan_check_compares_the_mode():
    ipvlan._verify("l3")(_link("ipvlan"), {"IFLA_IPVLAN_MODE": 1})
    with pytest.raises(CNIError, match="Container IPVlan mode l2 does not match expected value: l3s"):
        ipvlan._verify("l3s")(_link("ipvlan"), {"IFLA_IPVLAN_MODE": 0})


def test_vlan_check_compares_the_vlan_id_and_mtu():
    conf = vlan.load_config(_req({"type": "vlan", "master": "ens5", "vlanId": 7, "mtu": 1400, "ipam": {"type": "x"}}))
    vlan._verify(conf)(_link("vlan", 1400), {"IFLA_VLAN_ID": 7})
    with pytest.raises(CNIError, match="configured VLAN ID is 7, current value is 8"):
        vlan._verify(conf)(_link("vlan", 1400), {"IFLA_VLAN_ID": 8})
    with pytest.raises(CNIError, match="configured MTU is 1400, current value is 1500"):
        vlan._verify(conf)(_link("vlan", 1500), {"IFLA_VLAN_ID": 7})


@pytest.mark.parametrize("name", ["brüüüüüüüüüüüüü", "a" * 16, "..", "br 0", 'br"0', "br\\0", "br/0"])
def test_bridge_and_vrf_names_follow_the_one_ifname_rule_counting_bytes(name: str) -> None:
    # 15 characters but 29 bytes: the kernel's limit is bytes, so counting characters would let it through.
    with pytest.raises(CNIError, match="invalid bridge name"):
        bridge.load_config(_req({"type": "bridge", "bridge": name}))
    with pytest.raises(CNIError, match="invalid vrf name"):
        vrf._config(_req({"type": "vrf", "vrfname": name}))


def test_a_fifteen_byte_bridge_name_is_fine() -> None:
    assert bridge.load_config(_req({"type": "bridge", "bridge": "b" * 15})).bridge == "b" * 15

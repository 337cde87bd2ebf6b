"""Allocation network status from a go-cni result (Nomad's cniToAllocNet) and Consul DNS override."""

from __future__ import annotations

import json
from ipaddress import ip_address
from typing import Any

import pytest

from pycni.gocni_result import GoCNIIPConfig, GoCNIResult, InterfaceConfig
from pycni.nomad.errors import DecodeError, StatusError
from pycni.nomad.status import AllocNetworkStatus, DNSConfig, alloc_net_status, result_from_json, with_consul_dns
from pycni.types import DNS


def iface(*ips: str, sandbox: str = "") -> InterfaceConfig:
    return InterfaceConfig(ip_configs=tuple(GoCNIIPConfig(ip_address(ip)) for ip in ips), sandbox=sandbox)


def result(interfaces: dict[str, InterfaceConfig], dns: tuple[Any, ...] = ()) -> GoCNIResult:
    return GoCNIResult(interfaces=interfaces, dns=dns)


def test_no_interfaces_is_an_error() -> None:
    with pytest.raises(StatusError, match="^failed to configure network: no interfaces found$"):
        alloc_net_status(result({}))


def test_fallback_to_first_interface_with_an_address_when_no_sandbox_has_one() -> None:
    # Nomad's TestCNI_cniToAllocNet_Fallback (Calico 3.12 output); one empty DNS entry → no DNS.
    status = alloc_net_status(result({"cali39179aa3-74": iface(), "eth0": iface("192.168.135.232")}, dns=(DNS(),)))
    assert status == AllocNetworkStatus(interface_name="eth0", address="192.168.135.232")
    assert status.dns is None


def test_no_address_anywhere_is_an_error() -> None:
    # Nomad's TestCNI_cniToAllocNet_Invalid.
    with pytest.raises(StatusError, match="^failed to configure network: no interface with an address$"):
        alloc_net_status(result({"eth0": iface(), "veth1": iface()}))


def test_dual_stack_prefers_the_sandbox_interface() -> None:
    # Nomad's TestCNI_cniToAllocNet_Dualstack: "a-…" sorts first but has no sandbox.
    status = alloc_net_status(
        result(
            {
                "eth0": iface("0.0.0.0", "::", sandbox="at-the-park"),
                "a-skippable-interface": iface("127.3.2.1"),
            }
        )
    )
    assert (status.interface_name, status.address, status.address_ipv6) == ("eth0", "0.0.0.0", "::")


@pytest.mark.parametrize(
    ("interfaces", "expected"),
    [
        pytest.param(
            {"eth0": iface("fd00:a110:c8::b", sandbox="nomad-sandbox")},
            ("eth0", "fd00:a110:c8::b", "fd00:a110:c8::b"),
            id="IPv6Only",
        ),
        pytest.param(
            {"eth0": iface("fd00:a110:c8::1", "fd00:a110:c8::2", "fd00:a110:c8::3", sandbox="nomad-sandbox")},
            ("eth0", "fd00:a110:c8::1", "fd00:a110:c8::1"),
            id="IPv6Only_MultipleAddresses",
        ),
        pytest.param(
            {
                "eth0": iface(
                    "192.168.1.10", "fd00:a110:c8::1", "192.168.1.11", "fd00:a110:c8::2", sandbox="nomad-sandbox"
                )
            },
            ("eth0", "192.168.1.10", "fd00:a110:c8::1"),
            id="Dualstack_MultipleAddresses",
        ),
        pytest.param(
            {
                "eth0": iface("fd00:a110:c8::1", sandbox="nomad-sandbox"),
                "eth1": iface("192.168.1.10", sandbox="nomad-sandbox"),
            },
            ("eth0", "fd00:a110:c8::1", "fd00:a110:c8::1"),
            id="MultipleInterfaces_IPv6First",
        ),
        pytest.param(
            {
                "eth0": iface("fd00:a110:c8::1", "fd00:a110:c8::2", sandbox="nomad-sandbox"),
                "eth1": iface("fd00:b220:c8::1", sandbox="nomad-sandbox"),
            },
            ("eth0", "fd00:a110:c8::1", "fd00:a110:c8::1"),
            id="MultipleInterfaces_IPv6OnMultiple",
        ),
        pytest.param(
            {"eth0": iface("::ffff:10.1.2.3", "2001:db8::1", sandbox="s")},
            ("eth0", "10.1.2.3", "2001:db8::1"),
            id="IPv4-mapped IPv6 counts as IPv4, dotted",
        ),
        pytest.param(
            {"eth1": iface("10.0.0.9", sandbox="s"), "eth0": iface(sandbox="s"), "Z": iface("10.9.9.9", sandbox="s")},
            ("Z", "10.9.9.9", ""),
            id="byte-wise name order: uppercase first",
        ),
        pytest.param(
            {"a": iface("2001:db8::5"), "b": iface("10.0.0.5")},
            ("a", "2001:db8::5", "2001:db8::5"),
            id="fallback also stops at the first interface with any address",
        ),
    ],
)
def test_cni_to_alloc_net_address_selection(
    interfaces: dict[str, InterfaceConfig], expected: tuple[str, str, str]
) -> None:
    status = alloc_net_status(result(interfaces))
    assert (status.interface_name, status.address, status.address_ipv6) == expected


def test_dns_comes_from_the_first_entry_only_and_only_with_nameservers() -> None:
    first = DNS(nameservers=("10.0.0.53",), search=("svc.local",), options=("ndots:5",))
    second = DNS(nameservers=("9.9.9.9",))
    status = alloc_net_status(result({"eth0": iface("10.0.0.2", sandbox="s")}, dns=(first, second)))
    assert status.dns == DNSConfig(("10.0.0.53",), ("svc.local",), ("ndots:5",))
    no_servers = DNS(search=("only.search",))
    status = alloc_net_status(result({"eth0": iface("10.0.0.2", sandbox="s")}, dns=(no_servers, second)))
    assert status.dns is None


def test_dns_without_search_or_options_serialises_them_as_null() -> None:
    status = alloc_net_status(result({"eth0": iface("10.0.0.2", sandbox="s")}, dns=(DNS(nameservers=("1.1.1.1",)),)))
    assert status.to_json()["DNS"] == {"Servers": ["1.1.1.1"], "Searches": None, "Options": None}


def test_consul_dns_replaces_servers_and_keeps_searches_and_options() -> None:
    status = AllocNetworkStatus("eth0", "10.0.0.2", "", DNSConfig(("8.8.8.8",), ("a",), ("ndots:2",)))
    assert with_consul_dns(status, "192.168.1.117").dns == DNSConfig(("192.168.1.117",), ("a",), ("ndots:2",))


def test_consul_dns_without_dns_creates_empty_lists() -> None:
    status = with_consul_dns(AllocNetworkStatus("eth0", "10.0.0.2"), "192.168.1.117")
    assert status.to_json() == {
        "InterfaceName": "eth0",
        "Address": "10.0.0.2",
        "AddressIPv6": "",
        "DNS": {"Servers": ["192.168.1.117"], "Searches": [], "Options": []},
    }


# -- result JSON input ----------------------------------------------------------------------------

GO_RESULT = {
    "Interfaces": {
        "eth0": {
            "IPConfigs": [{"IP": "172.26.64.7", "Gateway": "172.26.64.1"}, {"IP": "fd00::7", "Gateway": ""}],
            "Mac": "3a:1f:00:00:00:07",
            "Sandbox": "/var/run/netns/x",
            "PciID": "",
            "SocketPath": "",
        },
        "lo": {"IPConfigs": [{"IP": "127.0.0.1", "Gateway": None}], "Mac": "00:00:00:00:00:00", "Sandbox": ""},
        "nomad": {"IPConfigs": None, "Mac": "aa:bb:cc:dd:ee:ff", "Sandbox": ""},
    },
    "DNS": [{"nameservers": ["10.0.2.15"], "search": ["service.consul"]}, {}],
    "Routes": None,
}


def test_go_serialised_result_decodes() -> None:
    res = result_from_json(GO_RESULT)
    assert res.interfaces["eth0"].ip_configs[0] == GoCNIIPConfig(ip_address("172.26.64.7"), ip_address("172.26.64.1"))
    assert res.interfaces["eth0"].ip_configs[1].gateway is None
    assert alloc_net_status(res).to_json() == {
        "InterfaceName": "eth0",
        "Address": "172.26.64.7",
        "AddressIPv6": "fd00::7",
        "DNS": {"Servers": ["10.0.2.15"], "Searches": ["service.consul"], "Options": None},
    }


def test_go_json_round_trip_of_gocni_result() -> None:
    res = result_from_json(GO_RESULT)
    again = result_from_json(json.loads(json.dumps(res.to_go_json())))
    assert alloc_net_status(again) == alloc_net_status(res)


def test_nil_interface_entry_is_skipped() -> None:
    res = result_from_json({"Interfaces": {"eth0": None, "eth1": {"IPConfigs": [{"IP": "10.1.1.1"}], "Sandbox": "s"}}})
    assert alloc_net_status(res).interface_name == "eth1"


def test_nil_interface_entry_serialises_back_as_null() -> None:
    res = result_from_json({"Interfaces": {"eth0": None}})
    assert res.to_go_json()["Interfaces"] == {"eth0": None}


def test_plain_cni_result_goes_through_create_result() -> None:
    plain = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "nomad"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/var/run/netns/x"}],
        "ips": [{"interface": 2, "address": "172.26.64.9/20", "gateway": "172.26.64.1"}],
        "dns": {"nameservers": ["172.26.64.1"]},
    }
    assert alloc_net_status(result_from_json(plain)).to_json() == {
        "InterfaceName": "eth0",
        "Address": "172.26.64.9",
        "AddressIPv6": "",
        "DNS": {"Servers": ["172.26.64.1"], "Searches": None, "Options": None},
    }


def test_list_of_plain_results_is_one_per_network() -> None:
    res = result_from_json(
        [{"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.1/24"}}, {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}}]
    )
    assert [str(c.ip) for c in res.interfaces["eth0"].ip_configs] == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.parametrize(
    "doc",
    [
        {"Interfaces": []},
        {"Interfaces": {"eth0": {"IPConfigs": [{"IP": "nope"}]}}},
        {"Interfaces": {"eth0": {"IPConfigs": [{"IP": ""}]}}},
        {"Interfaces": {"eth0": {"IPConfigs": [{"IP": "fe80::1%eth0"}]}}},
        {"Interfaces": {"eth0": {"IPConfigs": {}}}},
        {"Interfaces": {"eth0": {"Sandbox": 5}}},
        {"Interfaces": {}, "DNS": [{"nameservers": "x"}]},
        {"cniVersion": "1.0.0", "ips": [{"interface": 3, "address": "10.0.0.1/24"}]},
        {"cniVersion": "9.9.9"},
        "text",
    ],
)
def test_malformed_results_are_decode_errors(doc: Any) -> None:
    with pytest.raises(DecodeError):
        result_from_json(doc)


def test_empty_dns_search_and_options_stay_empty_lists_as_go_keeps_decoded_empty_slices() -> None:
    plain = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
        "ips": [{"interface": 0, "address": "172.26.64.9/20"}],
        "dns": {"nameservers": ["172.26.64.1"], "search": [], "options": []},
    }
    dns = alloc_net_status(result_from_json(plain)).to_json()["DNS"]
    assert dns == {"Servers": ["172.26.64.1"], "Searches": [], "Options": []}

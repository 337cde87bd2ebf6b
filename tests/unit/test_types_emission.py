"""to_json() emits what Go's encoding/json emits for each result version (omitempty rules, key order).

Expected documents come from libcni's own type tests (pkg/types/{100,040}/types_test.go) and from
the observed output of the reference plugins' ``bridge``, ``host-local`` and ``loopback``
(containernetworking/plugins ``plugins/main/bridge/bridge.go``, ``plugins/ipam/host-local``,
``plugins/main/loopback``).
"""

from __future__ import annotations

import json
from ipaddress import ip_address, ip_interface

import pytest

from pycni.types import (
    DNS,
    Interface,
    IPConfig,
    IPConfig020,
    IPConfig040,
    Result,
    Result020,
    Result040,
    Route,
    convert,
)


def ordered(doc: dict) -> str:
    """Compare key order too: equal dicts with different order give different text."""
    return json.dumps(doc)


# libcni's testResult(): every field of the 1.1.0 types set.
FULL_DNS = DNS(["1.2.3.4", "1::cafe"], "acompany.com", ["somedomain.com", "otherdomain.net"], ["foo", "bar"])
FULL = Result(
    "1.1.0",
    interfaces=[Interface("eth0", "00:11:22:33:44:55", 1500, "/proc/3553/ns/net", "/path/to/vhost/fd", "8086:9a01")],
    ips=[
        IPConfig(ip_interface("1.2.3.30/24"), ip_address("1.2.3.1"), 0),
        IPConfig(ip_interface("abcd:1234:ffff::cdde/64"), ip_address("abcd:1234:ffff::1"), 0),
    ],
    routes=[
        Route(ip_interface("15.5.6.0/24"), ip_address("15.5.6.8")),
        Route(ip_interface("1111:dddd::/80"), ip_address("1111:dddd::aaaa")),
    ],
    dns=FULL_DNS,
)
FULL_DNS_JSON = {
    "nameservers": ["1.2.3.4", "1::cafe"],
    "domain": "acompany.com",
    "search": ["somedomain.com", "otherdomain.net"],
    "options": ["foo", "bar"],
}
ROUTES_JSON = [{"dst": "15.5.6.0/24", "gw": "15.5.6.8"}, {"dst": "1111:dddd::/80", "gw": "1111:dddd::aaaa"}]


def test_full_1_1_0_result_emits_every_field_in_go_struct_order():
    assert ordered(FULL.to_json()) == ordered(
        {
            "cniVersion": "1.1.0",
            "interfaces": [
                {
                    "name": "eth0",
                    "mac": "00:11:22:33:44:55",
                    "mtu": 1500,
                    "sandbox": "/proc/3553/ns/net",
                    "socketPath": "/path/to/vhost/fd",
                    "pciID": "8086:9a01",
                }
            ],
            "ips": [
                {"interface": 0, "address": "1.2.3.30/24", "gateway": "1.2.3.1"},
                {"interface": 0, "address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1"},
            ],
            "routes": ROUTES_JSON,
            "dns": FULL_DNS_JSON,
        }
    )


def test_full_result_as_0_4_0_has_ip_versions_and_short_interfaces():
    assert ordered(convert(FULL, "0.4.0").to_json()) == ordered(
        {
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "eth0", "mac": "00:11:22:33:44:55", "sandbox": "/proc/3553/ns/net"}],
            "ips": [
                {"version": "4", "interface": 0, "address": "1.2.3.30/24", "gateway": "1.2.3.1"},
                {"version": "6", "interface": 0, "address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1"},
            ],
            "routes": ROUTES_JSON,
            "dns": FULL_DNS_JSON,
        }
    )


def test_full_result_as_0_1_0_splits_routes_per_family():
    assert ordered(convert(FULL, "0.1.0").to_json()) == ordered(
        {
            "cniVersion": "0.1.0",
            "ip4": {"ip": "1.2.3.30/24", "gateway": "1.2.3.1", "routes": [ROUTES_JSON[0]]},
            "ip6": {"ip": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1", "routes": [ROUTES_JSON[1]]},
            "dns": FULL_DNS_JSON,
        }
    )


BRIDGE_1_0_0_AS_PRINTED = """{
    "cniVersion": "1.0.0",
    "interfaces": [
        {
            "mac": "0a:58:0a:58:00:01",
            "name": "cni-podman0"
        },
        {
            "mac": "1e:2d:3c:4b:5a:69",
            "name": "veth1a2b3c4d"
        },
        {
            "mac": "0a:58:0a:58:00:02",
            "name": "eth0",
            "sandbox": "/run/netns/x"
        }
    ],
    "ips": [
        {
            "address": "10.88.0.2/16",
            "gateway": "10.88.0.1",
            "interface": 2
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0"
        }
    ]
}"""


def test_bridge_1_0_0_result_matches_go_print_with_sorted_keys_and_no_empty_dns():
    # libcni 1.3 prints 1.x results through a map, so keys come out sorted at every level.
    result = Result(
        "1.0.0",
        interfaces=[
            Interface("cni-podman0", "0a:58:0a:58:00:01"),
            Interface("veth1a2b3c4d", "1e:2d:3c:4b:5a:69"),
            Interface("eth0", "0a:58:0a:58:00:02", sandbox="/run/netns/x"),
        ],
        ips=[IPConfig(ip_interface("10.88.0.2/16"), ip_address("10.88.0.1"), 2)],
        routes=[Route(ip_interface("0.0.0.0/0"))],
    )
    assert json.dumps(result.to_json(), indent=4, sort_keys=True) == BRIDGE_1_0_0_AS_PRINTED


def test_host_local_0_3_1_result_matches_go_byte_for_byte():
    result = Result040("0.3.1", ips=[IPConfig040("4", ip_interface("203.0.113.2/24"), ip_address("203.0.113.1"))])
    expected = (
        '{"cniVersion":"0.3.1","ips":[{"version":"4","address":"203.0.113.2/24","gateway":"203.0.113.1"}],"dns":{}}'
    )
    assert json.dumps(result.to_json(), separators=(",", ":")) == expected


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(Result("1.1.0"), {"cniVersion": "1.1.0"}, id="1.x-empty-lists-and-dns-omitted"),
        pytest.param(Result040("0.4.0"), {"cniVersion": "0.4.0", "dns": {}}, id="040-dns-always-emitted"),
        pytest.param(Result020("0.2.0"), {"cniVersion": "0.2.0", "dns": {}}, id="020-dns-always-emitted"),
        pytest.param(Result(""), {}, id="1.x-empty-cniVersion-omitted"),
        pytest.param(Result040(""), {"dns": {}}, id="040-empty-cniVersion-omitted"),
        pytest.param(
            Result("1.0.0", dns=DNS(domain="x")),
            {"cniVersion": "1.0.0", "dns": {"domain": "x"}},
            id="1.x-dns-kept-if-any",
        ),
    ],
)
def test_result_omission_rules_per_version(result, expected):
    assert result.to_json() == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        pytest.param(Interface(""), {"name": ""}, id="interface-name-always"),
        pytest.param(Interface("a", mtu=0, mac=""), {"name": "a"}, id="interface-zero-mtu-dropped"),
        pytest.param(Interface("a", mtu=-1), {"name": "a", "mtu": -1}, id="interface-negative-mtu-kept"),
        pytest.param(
            IPConfig(ip_interface("10.1.2.3/24")), {"address": "10.1.2.3/24"}, id="ip-no-interface-no-gateway"
        ),
        pytest.param(
            IPConfig(ip_interface("10.1.2.3/24"), interface=0),
            {"interface": 0, "address": "10.1.2.3/24"},
            id="ip-interface-0-emitted",
        ),
        pytest.param(
            IPConfig(ip_interface("10.1.2.3/24"), interface=-1),
            {"interface": -1, "address": "10.1.2.3/24"},
            id="ip-interface-minus-1-emitted",
        ),
        pytest.param(
            IPConfig040("6", ip_interface("fd00::1/64")),
            {"version": "6", "address": "fd00::1/64"},
            id="040-ip-version-always",
        ),
        pytest.param(
            IPConfig040("", ip_interface("fd00::1/64")),
            {"version": "", "address": "fd00::1/64"},
            id="040-ip-empty-version-still-emitted",
        ),
        pytest.param(Route(ip_interface("10.0.0.0/8")), {"dst": "10.0.0.0/8"}, id="route-dst-only"),
        pytest.param(
            Route(ip_interface("10.0.0.0/8"), table=0, scope=0),
            {"dst": "10.0.0.0/8", "table": 0, "scope": 0},
            id="route-table-scope-0-emitted",
        ),
        pytest.param(
            Route(ip_interface("10.0.0.0/8"), ip_address("10.0.0.1"), 1400, 1360, 10, 100, 253),
            {
                "dst": "10.0.0.0/8",
                "gw": "10.0.0.1",
                "mtu": 1400,
                "advmss": 1360,
                "priority": 10,
                "table": 100,
                "scope": 253,
            },
            id="route-every-field-in-order",
        ),
        pytest.param(
            Route(ip_interface("10.0.0.0/8"), mtu=0, advmss=0, priority=0),
            {"dst": "10.0.0.0/8"},
            id="route-zero-ints-dropped",
        ),
        pytest.param(DNS(), {}, id="dns-empty"),
        pytest.param(DNS(nameservers=[""]), {"nameservers": [""]}, id="dns-list-with-empty-string-kept"),
        pytest.param(IPConfig020(ip_interface("10.1.2.3/24")), {"ip": "10.1.2.3/24"}, id="020-ip-only"),
    ],
)
def test_sub_model_omission_rules(model, expected):
    assert ordered(model.to_json()) == ordered(expected)


def test_040_interfaces_emit_only_name_mac_sandbox():
    result = Result040("0.4.0", interfaces=[Interface("eth0", "m", 9000, "/ns", "/sock", "pci")])
    assert result.to_json()["interfaces"] == [{"name": "eth0", "mac": "m", "sandbox": "/ns"}]


def test_040_and_020_routes_keep_the_shared_go_route_fields():
    route = Route(ip_interface("10.0.0.0/8"), mtu=1400, table=0)
    expected = {"dst": "10.0.0.0/8", "mtu": 1400, "table": 0}
    assert Result040("0.4.0", routes=[route]).to_json()["routes"] == [expected]
    config = IPConfig020(ip_interface("10.0.0.2/8"), routes=[route])
    assert Result020("0.2.0", ip4=config).to_json()["ip4"]["routes"] == [expected]


@pytest.mark.parametrize(
    ("text", "emitted"),
    [
        ("FD00:0:0:0:0:0:0:1/64", "fd00::1/64"),
        ("fd00:0:0:1:0:0:0:1/64", "fd00:0:0:1::1/64"),  # leftmost of equal zero runs is compressed
        ("fd00:0:1:2:3:4:5:6/64", "fd00:0:1:2:3:4:5:6/64"),  # a single zero group is not
        ("10.1.2.3/24", "10.1.2.3/24"),  # host bits kept
    ],
)
def test_addresses_are_emitted_canonical_with_host_bits(text, emitted):
    assert IPConfig(ip_interface(text)).to_json()["address"] == emitted


def test_sequences_become_tuples_so_models_are_hashable():
    result = Result("1.1.0", interfaces=[Interface("a")], ips=[], routes=[], dns=DNS(["1.1.1.1"]))
    assert result.interfaces == (Interface("a"),)
    assert hash(result) == hash(Result("1.1.0", interfaces=(Interface("a"),), dns=DNS(("1.1.1.1",))))

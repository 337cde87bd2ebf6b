"""convert(): libcni's converter for every ordered pair of the seven versions, losses included."""

from __future__ import annotations

import copy
from ipaddress import ip_address, ip_interface

import pytest

from pycni.errors import ResultError
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

VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
FAMILY = {"0.1.0": "020", "0.2.0": "020", "0.3.0": "040", "0.3.1": "040", "0.4.0": "040", "1.0.0": "1x", "1.1.0": "1x"}

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
    dns=DNS(["1.2.3.4"], "acompany.com", ["somedomain.com"], ["foo"]),
)
DNS_JSON = {"nameservers": ["1.2.3.4"], "domain": "acompany.com", "search": ["somedomain.com"], "options": ["foo"]}
ROUTES_JSON = [{"dst": "15.5.6.0/24", "gw": "15.5.6.8"}, {"dst": "1111:dddd::/80", "gw": "1111:dddd::aaaa"}]
IPS_JSON = [
    {"interface": 0, "address": "1.2.3.30/24", "gateway": "1.2.3.1"},
    {"interface": 0, "address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1"},
]
SHORT_INTERFACE_JSON = {"name": "eth0", "mac": "00:11:22:33:44:55", "sandbox": "/proc/3553/ns/net"}
FULL_INTERFACE_JSON = {
    **SHORT_INTERFACE_JSON,
    "mtu": 1500,
    "socketPath": "/path/to/vhost/fd",
    "pciID": "8086:9a01",
}
AS_020 = {
    "ip4": {"ip": "1.2.3.30/24", "gateway": "1.2.3.1", "routes": [ROUTES_JSON[0]]},
    "ip6": {"ip": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1", "routes": [ROUTES_JSON[1]]},
    "dns": DNS_JSON,
}


def _with_versions(ips: list[dict]) -> list[dict]:
    return [{"version": "4" if "." in ip["address"] else "6", **ip} for ip in ips]


def _without_interface(ips: list[dict]) -> list[dict]:
    return [{k: v for k, v in ip.items() if k != "interface"} for ip in ips]


# What FULL looks like in the target family once it has passed through the source family.
EXPECTED: dict[tuple[str, str], dict] = {
    ("1x", "1x"): {"interfaces": [FULL_INTERFACE_JSON], "ips": IPS_JSON, "routes": ROUTES_JSON, "dns": DNS_JSON},
    ("1x", "040"): {
        "interfaces": [SHORT_INTERFACE_JSON],
        "ips": _with_versions(IPS_JSON),
        "routes": ROUTES_JSON,
        "dns": DNS_JSON,
    },
    ("1x", "020"): AS_020,
    ("040", "1x"): {"interfaces": [SHORT_INTERFACE_JSON], "ips": IPS_JSON, "routes": ROUTES_JSON, "dns": DNS_JSON},
    ("040", "020"): AS_020,
    ("020", "1x"): {"ips": _without_interface(IPS_JSON), "routes": ROUTES_JSON, "dns": DNS_JSON},
    ("020", "040"): {"ips": _with_versions(_without_interface(IPS_JSON)), "routes": ROUTES_JSON, "dns": DNS_JSON},
    ("020", "020"): AS_020,
}
EXPECTED[("040", "040")] = EXPECTED[("1x", "040")]


@pytest.mark.parametrize("to_version", VERSIONS)
@pytest.mark.parametrize("from_version", VERSIONS)
def test_every_version_pair_converts_like_libcni(from_version, to_version):
    source = convert(FULL, from_version)
    assert source.cni_version == from_version
    out = convert(source, to_version)
    expected = {"cniVersion": to_version, **EXPECTED[(FAMILY[from_version], FAMILY[to_version])]}
    assert out.to_json() == expected
    assert type(out) is {"1x": Result, "040": Result040, "020": Result020}[FAMILY[to_version]]


@pytest.mark.parametrize("version", VERSIONS)
def test_same_version_returns_the_result_itself(version):
    source = convert(FULL, version)
    assert convert(source, version) is source


def test_empty_target_version_means_0_1_0():
    assert convert(FULL, "") == convert(FULL, "0.1.0")


@pytest.mark.parametrize(
    ("result", "to_version", "message"),
    [
        (FULL, "9.9.9", "no converter for CNI result version 1.1.0 to 9.9.9"),
        (FULL, "1.0", "no converter for CNI result version 1.1.0 to 1.0"),
        (Result("0.4.0"), "1.1.0", "no converter for CNI result version 0.4.0 to 1.1.0"),
        (Result020("7"), "0.1.0", "no converter for CNI result version 7 to 0.1.0"),
    ],
)
def test_unknown_versions_have_no_converter(result, to_version, message):
    with pytest.raises(ResultError) as info:
        convert(result, to_version)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("result", "to_version", "expected"),
    [
        (Result(""), "1.1.0", Result("1.1.0")),
        (Result(""), "1.0.0", Result("1.0.0")),
        (Result040(""), "0.4.0", Result040("0.4.0")),
        (
            Result020("", ip4=IPConfig020(ip_interface("10.0.0.2/8"))),
            "0.2.0",
            Result020("0.2.0", ip4=IPConfig020(ip_interface("10.0.0.2/8"))),
        ),
    ],
)
def test_unset_version_counts_as_the_model_s_implemented_version(result, to_version, expected):
    assert convert(result, to_version) == expected


def test_1_0_0_and_1_1_0_relabel_and_keep_1_1_fields():
    as_100 = convert(FULL, "1.0.0")
    assert as_100 == Result("1.0.0", FULL.interfaces, FULL.ips, FULL.routes, FULL.dns)
    assert convert(as_100, "1.1.0") == FULL


def test_down_to_0_2_0_takes_the_first_ip_of_each_family():
    result = Result(
        "1.1.0",
        ips=[
            IPConfig(ip_interface("fd00::6/64")),
            IPConfig(ip_interface("10.0.0.4/8"), ip_address("10.0.0.1")),
            IPConfig(ip_interface("10.0.0.5/8")),
            IPConfig(ip_interface("fd00::7/64")),
        ],
    )
    out = convert(result, "0.2.0")
    assert out == Result020(
        "0.2.0",
        ip4=IPConfig020(ip_interface("10.0.0.4/8"), ip_address("10.0.0.1")),
        ip6=IPConfig020(ip_interface("fd00::6/64")),
    )


def test_down_to_0_2_0_keeps_dst_and_gw_only_and_drops_routes_of_a_family_without_ip():
    result = Result(
        "1.1.0",
        ips=[IPConfig(ip_interface("10.0.0.4/8"))],
        routes=[
            Route(ip_interface("fd00::/8"), ip_address("fd00::1")),
            Route(
                ip_interface("0.0.0.0/0"), ip_address("10.0.0.1"), mtu=1400, advmss=1300, priority=5, table=10, scope=0
            ),
        ],
    )
    out = convert(result, "0.1.0")
    assert out == Result020(
        "0.1.0",
        ip4=IPConfig020(ip_interface("10.0.0.4/8"), routes=[Route(ip_interface("0.0.0.0/0"), ip_address("10.0.0.1"))]),
    )


@pytest.mark.parametrize("to_version", ["0.1.0", "0.2.0"])
@pytest.mark.parametrize(
    "result",
    [
        pytest.param(
            Result("1.1.0", interfaces=[Interface("lo")], routes=[Route(ip_interface("0.0.0.0/0"))]), id="1x-no-ips"
        ),
        pytest.param(Result040("0.4.0"), id="040-no-ips"),
        pytest.param(
            # The reference loopback plugin's 0.4.0 output has ips without "version": libcni skips them.
            Result040("0.4.0", ips=[IPConfig040("", ip_interface("127.0.0.1/8"), interface=0)]),
            id="040-ips-without-version",
        ),
    ],
)
def test_down_to_0_2_0_without_any_usable_ip_fails(result, to_version):
    with pytest.raises(ResultError, match="^cannot convert: no valid IP addresses$"):
        convert(result, to_version)


def test_0_4_0_to_0_2_0_trusts_the_version_label_over_the_address_family():
    result = Result040(
        "0.4.0", ips=[IPConfig040("4", ip_interface("fd00::4/64")), IPConfig040("6", ip_interface("10.0.0.6/8"))]
    )
    out = convert(result, "0.2.0")
    assert (str(out.ip4.ip), str(out.ip6.ip)) == ("fd00::4/64", "10.0.0.6/8")


def test_up_from_0_2_0_puts_ip4_first_then_ip6_and_concatenates_their_routes():
    r4a, r4b = Route(ip_interface("10.1.0.0/16")), Route(ip_interface("10.2.0.0/16"), mtu=1400)
    r6 = Route(ip_interface("fd01::/16"))
    result = Result020(
        "0.2.0",
        ip4=IPConfig020(ip_interface("10.0.0.4/8"), ip_address("10.0.0.1"), [r4a, r4b]),
        ip6=IPConfig020(ip_interface("fd00::6/64"), None, [r6]),
        dns=DNS(["10.0.0.53"]),
    )
    assert convert(result, "0.3.0") == Result040(
        "0.3.0",
        ips=[
            IPConfig040("4", ip_interface("10.0.0.4/8"), ip_address("10.0.0.1")),
            IPConfig040("6", ip_interface("fd00::6/64")),
        ],
        routes=[r4a, r4b, r6],
        dns=DNS(["10.0.0.53"]),
    )
    assert convert(result, "1.0.0") == Result(
        "1.0.0",
        ips=[IPConfig(ip_interface("10.0.0.4/8"), ip_address("10.0.0.1")), IPConfig(ip_interface("fd00::6/64"))],
        routes=[r4a, r4b, r6],
        dns=DNS(["10.0.0.53"]),
    )


def test_1_x_to_0_4_0_labels_each_ip_by_address_family_and_keeps_route_fields():
    route = Route(ip_interface("0.0.0.0/0"), mtu=9000, table=0)
    result = Result(
        "1.1.0",
        ips=[IPConfig(ip_interface("fd00::6/64"), interface=-1), IPConfig(ip_interface("10.0.0.4/8"))],
        routes=[route],
    )
    out = convert(result, "0.4.0")
    assert out.ips == (
        IPConfig040("6", ip_interface("fd00::6/64"), interface=-1),
        IPConfig040("4", ip_interface("10.0.0.4/8")),
    )
    assert out.routes == (route,)


def test_0_4_0_to_1_x_drops_version_keeps_interface_index_and_short_interfaces():
    result = Result040(
        "0.3.1",
        interfaces=[Interface("eth0", "m", sandbox="/ns")],
        ips=[IPConfig040("4", ip_interface("10.0.0.4/8"), ip_address("10.0.0.1"), 0)],
    )
    assert convert(result, "1.1.0") == Result(
        "1.1.0",
        interfaces=[Interface("eth0", "m", sandbox="/ns")],
        ips=[IPConfig(ip_interface("10.0.0.4/8"), ip_address("10.0.0.1"), 0)],
    )


def test_conversion_never_changes_its_input():
    before = copy.deepcopy(FULL)
    for version in VERSIONS:
        convert(FULL, version)
    assert FULL == before


def test_converting_something_else_is_a_type_error():
    with pytest.raises(TypeError):
        convert({"cniVersion": "1.0.0"}, "1.0.0")  # type: ignore[arg-type]

"""CONSUL_IPTABLES_CONFIG: Nomad's setupTransparentProxyArgs and dnsFromAttrs, byte-exact JSON."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from pycni.nomad.errors import TransparentProxyError
from pycni.nomad.models import Allocation, Node
from pycni.nomad.ports import port_mappings
from pycni.nomad.tproxy import dns_from_attrs, parse_uint16, transparent_proxy_config
from pycni.types.consul import IptablesConfig

from .conftest import group, mock_connect_alloc

NETNS = "/var/run/docker/netns/a2ece01ea7bc"
NODE_META = {
    "connect.transparent_proxy.default_outbound_port": "15001",
    "connect.transparent_proxy.default_uid": "101",
}
NODE_ATTRS = {"unique.consul.dns.addr": "192.168.1.117", "consul.dns.port": "8600"}


def tproxy_test_doc(
    tproxy: dict[str, Any] | None, expose: dict[str, Any] | None = None, cluster: str = ""
) -> dict[str, Any]:
    """The allocation of Nomad's TestCNI_setupTproxyArgs."""
    doc = mock_connect_alloc()
    doc["AllocatedResources"]["Shared"]["Networks"] = [
        {
            "Mode": "bridge",
            "IP": "10.0.0.1",
            "ReservedPorts": [
                {"Label": "http", "Value": 9002, "To": 9002},
                {"Label": "health", "Value": 9001, "To": 9000},
            ],
            "DynamicPorts": [{"Label": "connect-proxy-testconnect", "Value": 25018, "To": 25018}],
        }
    ]
    tg = group(doc)
    tg["Networks"] = [
        {
            "Mode": "bridge",
            "DNS": {},
            "ReservedPorts": [{"Label": "http", "Value": 9002, "To": 9002, "HostNetwork": "default"}],
            "DynamicPorts": [
                {"Label": "connect-proxy-count-dashboard", "Value": 0, "To": -1, "HostNetwork": "default"},
                {"Label": "health", "Value": 0, "To": 9000, "HostNetwork": "default"},
            ],
        }
    ]
    svc = tg["Services"][0]
    svc["PortLabel"] = "9002"
    svc["Cluster"] = cluster
    svc["Connect"]["SidecarService"]["Proxy"] = {
        "LocalServiceAddress": "",
        "LocalServicePort": 0,
        "Upstreams": [],
        "Expose": expose if expose is not None else {},
        "Config": {},
        "TransparentProxy": tproxy,
    }
    return doc


def tproxy_test_alloc(
    tproxy: dict[str, Any] | None, expose: dict[str, Any] | None = None, cluster: str = ""
) -> Allocation:
    return Allocation.from_json(tproxy_test_doc(tproxy, expose, cluster))


def config_for(alloc: Allocation, node_attrs: dict[str, str] | None = None, meta: dict[str, str] | None = None) -> Any:
    node = Node(attributes=NODE_ATTRS if node_attrs is None else node_attrs, meta=NODE_META if meta is None else meta)
    return transparent_proxy_config(alloc, node, NETNS, port_mappings(alloc, ignore_host_ip=False))


# -- Nomad's TestCNI_setupTproxyArgs table ---------------------------------------------------------

DEFAULTS = IptablesConfig(
    consul_dns_ip="192.168.1.117",
    consul_dns_port=8600,
    proxy_user_id="101",
    proxy_inbound_port=25018,
    proxy_outbound_port=15001,
    exclude_inbound_ports=("9002",),
    netns=NETNS,
)
NO_DNS = IptablesConfig(
    proxy_user_id="101",
    proxy_inbound_port=25018,
    proxy_outbound_port=15001,
    exclude_inbound_ports=("9002",),
    netns=NETNS,
)


@pytest.mark.parametrize(
    ("tproxy", "expose", "cluster", "node_attrs", "expected"),
    [
        pytest.param(None, None, "", None, None, id="nil tproxy spec returns no error or iptables config"),
        pytest.param({}, None, "", None, DEFAULTS, id="minimal empty tproxy spec returns defaults"),
        pytest.param(
            {
                "UID": "1001",
                "OutboundPort": 16001,
                "ExcludeInboundPorts": ["http", "9000"],
                "ExcludeOutboundPorts": [443, 80],
                "ExcludeOutboundCIDRs": ["10.0.0.1/8"],
                "ExcludeUIDs": ["10", "42"],
                "NoDNS": True,
            },
            None,
            "",
            None,
            IptablesConfig(
                proxy_user_id="1001",
                proxy_inbound_port=25018,
                proxy_outbound_port=16001,
                exclude_inbound_ports=("9000", "9002"),
                exclude_outbound_ports=("443", "80"),
                exclude_outbound_cidrs=("10.0.0.1/8",),
                exclude_uids=("10", "42"),
                netns=NETNS,
            ),
            id="tproxy spec with overrides",
        ),
        pytest.param(
            {},
            {"Paths": [{"Path": "/v1/example", "Protocol": "http", "LocalPathPort": 9000, "ListenerPort": "health"}]},
            "",
            None,
            attrs.evolve(DEFAULTS, exclude_inbound_ports=("9000", "9002")),
            id="tproxy with exposed checks",
        ),
        pytest.param({}, None, "", {}, NO_DNS, id="tproxy with no consul dns fingerprint"),
        pytest.param(
            {},
            None,
            "",
            {"consul.dns.port": "-1", "unique.consul.dns.addr": "192.168.1.117"},
            NO_DNS,
            id="tproxy with consul dns disabled",
        ),
        pytest.param(
            {},
            None,
            "infra",
            {
                "consul.dns.port": "-1",
                "unique.consul.dns.addr": "192.168.1.110",
                "consul.infra.dns.port": "8600",
                "unique.consul.infra.dns.addr": "192.168.1.117",
            },
            DEFAULTS,
            id="tproxy for other cluster with default consul dns disabled",
        ),
    ],
)
def test_nomad_setup_tproxy_args_table(
    tproxy: dict[str, Any] | None,
    expose: dict[str, Any] | None,
    cluster: str,
    node_attrs: dict[str, str] | None,
    expected: IptablesConfig | None,
) -> None:
    assert config_for(tproxy_test_alloc(tproxy, expose, cluster), node_attrs) == expected


# -- beyond Nomad's table ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({}, 'could not parse default_outbound_port "" as port number: strconv.ParseUint: parsing "": invalid syntax'),
        (
            {"connect.transparent_proxy.default_outbound_port": "abc"},
            'could not parse default_outbound_port "abc" as port number: strconv.ParseUint: parsing "abc": '
            "invalid syntax",
        ),
        (
            {"connect.transparent_proxy.default_outbound_port": "70000"},
            'could not parse default_outbound_port "70000" as port number: strconv.ParseUint: parsing "70000": '
            "value out of range",
        ),
        (
            {"connect.transparent_proxy.default_outbound_port": "-1"},
            'could not parse default_outbound_port "-1" as port number: strconv.ParseUint: parsing "-1": '
            "invalid syntax",
        ),
        (
            {"connect.transparent_proxy.default_outbound_port": "1\n"},
            'could not parse default_outbound_port "1\\n" as port number: strconv.ParseUint: parsing "1\\n": '
            "invalid syntax",
        ),
    ],
)
def test_unparsable_default_outbound_port_is_an_error(meta: dict[str, str], message: str) -> None:
    with pytest.raises(TransparentProxyError) as info:
        config_for(tproxy_test_alloc({}), meta=meta)
    assert str(info.value) == message


def test_explicit_outbound_port_skips_the_node_default() -> None:
    config = config_for(tproxy_test_alloc({"OutboundPort": 15555}), meta={})
    assert config.proxy_outbound_port == 15555
    assert config.proxy_user_id == ""  # neither tproxy UID nor node meta: consul-cni will refuse it


def test_inbound_exclusions_are_numbers_verbatim_or_labels_mapped_to_container_ports() -> None:
    config = config_for(tproxy_test_alloc({"ExcludeInboundPorts": ["0080", "65536", "health", "nope", ""]}))
    # "0080" is a uint16 and kept as written; "65536" is not, so it is looked up as a label (absent);
    # "health" maps to its container port 9000; unknown labels (and "") are ignored.
    assert config.exclude_inbound_ports == ("0080", "9000", "9002")


def test_inbound_exclusions_sort_as_strings() -> None:
    config = config_for(tproxy_test_alloc({"ExcludeInboundPorts": ["10000", "9000", "20", "9000"]}))
    assert config.exclude_inbound_ports == ("10000", "20", "9000", "9002")


def test_reserved_ports_are_excluded_by_their_jobspec_to_even_zero_or_negative() -> None:
    doc = tproxy_test_doc({})
    group(doc)["Networks"][0]["ReservedPorts"] = [{"Label": "a", "Value": 7000, "To": 0}, {"Label": "b", "To": -1}]
    assert config_for(Allocation.from_json(doc)).exclude_inbound_ports == ("-1", "0")


def test_outbound_exclusions_keep_order_and_duplicates() -> None:
    config = config_for(tproxy_test_alloc({"ExcludeOutboundPorts": [443, 80, 443]}))
    assert config.exclude_outbound_ports == ("443", "80", "443")


def test_empty_lists_serialise_as_null_except_explicit_empty_cidrs() -> None:
    config = config_for(
        tproxy_test_alloc({"ExcludeOutboundPorts": [], "ExcludeOutboundCIDRs": [], "ExcludeUIDs": None})
    )
    assert config.exclude_outbound_ports is None
    assert '"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":[],"ExcludeUIDs":null' in config.to_json()


def test_first_transparent_proxy_service_wins() -> None:
    doc = mock_connect_alloc()
    services = group(doc)["Services"]
    services.insert(0, {"Name": "plain", "Connect": {"SidecarService": {"Proxy": {}}}})
    services.append({"Name": "second", "Connect": {"SidecarService": {"Proxy": {"TransparentProxy": {"UID": "7"}}}}})
    services[1]["Connect"]["SidecarService"] = {"Proxy": {"TransparentProxy": {"UID": "5"}}}
    config = config_for(Allocation.from_json(doc))
    assert (config.proxy_user_id, config.proxy_inbound_port) == ("5", 9999)  # connect-proxy-testconnect


def test_no_envoy_port_means_inbound_port_zero() -> None:
    doc = mock_connect_alloc()
    group(doc)["Services"][0]["Connect"]["SidecarService"] = {"Proxy": {"TransparentProxy": {}}}
    doc["AllocatedResources"] = None
    assert config_for(Allocation.from_json(doc)).proxy_inbound_port == 0


def test_connect_fixture_end_to_end(tproxy_alloc: Allocation, node: Node) -> None:
    config = transparent_proxy_config(tproxy_alloc, node, "/var/run/netns/x", port_mappings(tproxy_alloc, True))
    assert config is not None
    assert config.to_json() == (
        '{"ConsulDNSIP":"10.0.2.15","ConsulDNSPort":8600,"ProxyUserID":"101","ProxyInboundPort":28734,'
        '"ProxyOutboundPort":15001,"ExcludeInboundPorts":["25318","9102","9999"],'
        '"ExcludeOutboundPorts":["8500","443"],"ExcludeOutboundCIDRs":["10.0.0.0/8"],"ExcludeUIDs":["1000"],'
        '"NetNS":"/var/run/netns/x","IptablesProvider":null}'
    )


# -- JSON exactly as Go marshals consul/sdk iptables.Config ----------------------------------------


def test_json_matches_nomads_test_setup_expectation() -> None:
    config = IptablesConfig(
        consul_dns_ip="192.168.1.117",
        consul_dns_port=8600,
        proxy_user_id="101",
        proxy_inbound_port=9999,
        proxy_outbound_port=15001,
        exclude_inbound_ports=("9002",),
        netns="/var/run/docker/netns/nonsense-ns",
    )
    assert config.to_json() == (
        '{"ConsulDNSIP":"192.168.1.117","ConsulDNSPort":8600,"ProxyUserID":"101","ProxyInboundPort":9999,'
        '"ProxyOutboundPort":15001,"ExcludeInboundPorts":["9002"],"ExcludeOutboundPorts":null,'
        '"ExcludeOutboundCIDRs":null,"ExcludeUIDs":null,"NetNS":"/var/run/docker/netns/nonsense-ns",'
        '"IptablesProvider":null}'
    )


def test_json_escapes_strings_like_go() -> None:
    config = IptablesConfig(netns='<a&b>"\\\x00\x08\x0c\n\x1f\x7f\u2028\u2029é')
    assert config.to_json().endswith(
        '"NetNS":"\\u003ca\\u0026b\\u003e\\"\\\\\\u0000\\b\\f\\n\\u001f\x7f\\u2028\\u2029é","IptablesProvider":null}'
    )


# -- dnsFromAttrs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_attrs", "cluster", "expected"),
    [
        ({"unique.consul.dns.addr": "10.0.0.1", "consul.dns.port": "8600"}, "", ("10.0.0.1", 8600)),
        ({"unique.consul.dns.addr": "10.0.0.1", "consul.dns.port": "8600"}, "default", ("10.0.0.1", 8600)),
        ({"unique.consul.dns.addr": "10.0.0.1", "consul.dns.port": "8600"}, "infra", ("", 0)),
        ({"unique.consul.infra.dns.addr": "10.0.0.9", "consul.infra.dns.port": "53"}, "infra", ("10.0.0.9", 53)),
        ({"unique.consul.dns.addr": "", "consul.dns.port": "8600"}, "", ("", 0)),
        ({"consul.dns.port": "8600"}, "", ("", 0)),
        ({"unique.consul.dns.addr": "10.0.0.1"}, "", ("", 0)),
        ({"unique.consul.dns.addr": "10.0.0.1", "consul.dns.port": "0"}, "", ("", 0)),
        ({"unique.consul.dns.addr": "10.0.0.1", "consul.dns.port": "-1"}, "", ("", 0)),
        ({"unique.consul.dns.addr": "10.0.0.1", "consul.dns.port": "abc"}, "", ("", 0)),
        ({"unique.consul.dns.addr": "10.0.0.1", "consul.dns.port": "70000"}, "", ("", 0)),
        # "00" is not the "0" sentinel and parses as port 0: Nomad passes it on.
        ({"unique.consul.dns.addr": "10.0.0.1", "consul.dns.port": "00"}, "", ("10.0.0.1", 0)),
        # The address is not validated.
        ({"unique.consul.dns.addr": "not-an-ip", "consul.dns.port": "53"}, "", ("not-an-ip", 53)),
    ],
)
def test_dns_from_attrs(node_attrs: dict[str, str], cluster: str, expected: tuple[str, int]) -> None:
    assert dns_from_attrs(node_attrs, cluster) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("65535", 65535), ("00080", 80), ("0" * 30 + "1", 1)],
)
def test_parse_uint16_accepts(text: str, value: int) -> None:
    assert parse_uint16(text) == value


@pytest.mark.parametrize("text", ["", "+1", "-0", " 1", "1_000", "0x10", "٣", "65536", "9" * 5000])
def test_parse_uint16_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="^strconv.ParseUint: parsing "):
        parse_uint16(text)

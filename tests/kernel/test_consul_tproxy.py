"""consul-cni in process: Consul's transparent-proxy rules as one nftables table in the container.

Config errors carry consul-cni's texts; the rules are checked as installed (order, sets) and by
real traffic between a container namespace and a peer namespace joined by a veth (no bridge):
outbound TCP of an ordinary UID lands on the proxy's outbound listener, the proxy UID, excluded
UIDs, ports and CIDRs go direct; inbound TCP lands on the inbound port except excluded ports;
DNS is DNAT'ed to Consul DNS.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pycni import netns
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import PluginRequest
from pycni.types.consul import IptablesConfig
from pycni_plugins.consul_tproxy import ConsulTproxyPlugin, decode_config, ruleset, verify
from tests.helpers.traffic import listening, tcp_as, udp_query, veth

PLUGIN = ConsulTproxyPlugin()
CID = "5b6a4d3e-9f0c-2a7e-bb1d-7c0e4f2a9d31"
CONTAINER_IP, PEER_IP, PEER_EXCLUDED_IP = "198.18.0.1", "198.18.0.2", "198.18.0.3"
PROXY_UID, ORDINARY_UID, EXCLUDED_UID, RANGE_UID = 101, 65534, 1000, 2050

# consul-k8s's "Parsing iptables from CNI_ARGs as in Nomad" config.
K8S_TEST_CONFIG = {
    "ConsulDNSIP": "127.0.0.1",
    "ConsulDNSPort": 8600,
    "ProxyUserID": "101",
    "ProxyInboundPort": 20000,
    "ProxyOutboundPort": 15001,
    "ExcludeInboundPorts": ["9000"],
    "ExcludeOutboundPorts": ["15002"],
    "ExcludeOutboundCIDRs": ["10.0.0.0/24"],
    "ExcludeUIDs": ["1", "42"],
    "NetNS": "/some/netns/path",
}


def conf(prev: dict[str, Any] | None = None, version: str = "0.4.0") -> dict[str, Any]:
    out: dict[str, Any] = {"cniVersion": version, "name": "nomad", "type": "consul-cni", "log_level": "debug"}
    if prev is not None:
        out["prevResult"] = prev
    return out


def prev_result(sandbox: str = "/var/run/netns/16c", ips: bool = True) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": sandbox}],
        "ips": [{"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}] if ips else [],
    }


def args(config: Any, *extra: str) -> str:
    value = config if isinstance(config, str) else json.dumps(config, separators=(",", ":"))
    return ";".join(["IgnoreUnknown=true", *extra, f"CONSUL_IPTABLES_CONFIG={value}"])


def request(command: str, path: str, cni_args: str, config: dict[str, Any] | None = None) -> PluginRequest:
    return PluginRequest(command, config if config is not None else conf(prev_result()), CID, path, "eth0", cni_args)


def error_of(req: PluginRequest) -> CNIError:
    with pytest.raises(CNIError) as info:
        PLUGIN.handle(req)
    return info.value


# -- config errors (nothing touches a namespace before these) ------------------------------------

NOWHERE = "/run/netns/pycni-does-not-exist"
SETUP = "could not apply iptables setup: "
UNMARSHAL = "could not unmarshal CNI args: json: cannot unmarshal "


@pytest.mark.parametrize(
    ("cni_args", "message"),
    [
        ("", "not running in a pod, namespace and pod should have values"),
        ("IgnoreUnknown=true;K8S_POD_NAME=web", "not running in a pod, namespace and pod should have values"),
        ("IgnoreUnknown=1;NOMAD_JOB_ID=x", "not running in a pod, namespace and pod should have values"),
        (args("{foo}"), "could not unmarshal CNI args: "),
        (
            args("[1]"),
            UNMARSHAL + "array into Go value of type iptables.Config",
        ),
        (
            args({"ProxyInboundPort": "20000"}),
            UNMARSHAL + "string into Go struct field Config.ProxyInboundPort of type int",
        ),
        (
            args({"ProxyInboundPort": 1.5, "ProxyUserID": 101}),  # the earliest type error is reported
            UNMARSHAL + "number 1.5 into Go struct field Config.ProxyInboundPort of type int",
        ),
        (
            args({"ExcludeUIDs": [1000]}),
            UNMARSHAL + "number into Go struct field Config.ExcludeUIDs of type string",
        ),
        (
            args({"ExcludeUIDs": "1000"}),
            UNMARSHAL + "string into Go struct field Config.ExcludeUIDs of type []string",
        ),
        (
            args({"IptablesProvider": {}}),
            UNMARSHAL + "object into Go struct field Config.IptablesProvider of type iptables.Provider",
        ),
        (
            args({"ProxyInboundPort": 20000}),
            SETUP + "ProxyUserID is required to set up traffic redirection",
        ),
        (
            args({"ProxyUserID": "101"}),
            SETUP + "ProxyInboundPort is required to set up traffic redirection",
        ),
        (
            args({"ConsulDNSIP": "consul", "ProxyUserID": "101"}),
            SETUP + "unable to parse consulDNSIP",
        ),
        (
            args({"ConsulDNSIP": "fd00::53", "ProxyUserID": "101", "ProxyInboundPort": 1}),
            SETUP + "for non dual stack setup ipv4 consulDNSIP required",
        ),
        (
            args({"ProxyUserID": "101", "ProxyInboundPort": 20000, "ExcludeInboundPorts": ["-1"]}),
            SETUP + "ExcludeInboundPorts: invalid port/service `-1' specified",
        ),
        (
            args({"ProxyUserID": "101", "ProxyInboundPort": 20000, "ExcludeOutboundCIDRs": ["fd00::/8"]}),
            SETUP + "ExcludeOutboundCIDRs: host/network `fd00::' not found",
        ),
        (
            args({"ProxyUserID": "no-such-user-here", "ProxyInboundPort": 20000}),
            SETUP + 'ProxyUserID: owner: Bad value for "--uid-owner" option: "no-such-user-here"',
        ),
        ("CONSUL_IPTABLES_CONFIG={}=", 'ARGS: invalid pair "CONSUL_IPTABLES_CONFIG={}="'),
        ("NOMAD_JOB_ID=x;CONSUL_IPTABLES_CONFIG={}", 'ARGS: unknown args ["NOMAD_JOB_ID=x"]'),
        (
            "IP=10.0.0.300;CONSUL_IPTABLES_CONFIG={}",
            'ARGS: error parsing value of pair "IP=10.0.0.300": invalid IP address',
        ),
        (
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
            "pycni's consul-cni serves only Nomad (CONSUL_IPTABLES_CONFIG in CNI_ARGS): "
            "Kubernetes pod default/web is not supported",
        ),
    ],
)
def test_config_errors_are_consul_cnis(cni_args: str, message: str) -> None:
    err = error_of(request("ADD", NOWHERE, cni_args))
    assert err.code == ErrorCode.INTERNAL
    assert str(err).startswith(message), str(err)


def test_prev_result_without_ips_is_refused_before_the_config_is_read() -> None:
    err = error_of(request("ADD", NOWHERE, args("{bad json"), conf(prev_result(ips=False))))
    assert str(err) == "got no container IPs"


def test_plugin_config_types_are_checked() -> None:
    bad = {**conf(prev_result()), "log_level": 5}
    err = error_of(request("ADD", NOWHERE, args(K8S_TEST_CONFIG), bad))
    assert str(err) == (
        "failed to parse network configuration: json: cannot unmarshal number into Go struct field "
        "PluginConf.log_level of type string"
    )


def test_add_needs_a_netns() -> None:
    err = error_of(request("ADD", "", args(K8S_TEST_CONFIG)))
    assert err.code == ErrorCode.INVALID_ENVIRONMENT_VARIABLES


def test_decoding_follows_go() -> None:
    # Case-insensitive keys, unknown keys ignored, null = zero value, null list items = "".
    cfg = decode_config(
        '{"proxyuserid":"101","PROXYINBOUNDPORT":1,"Other":true,"ExcludeUIDs":null,"ExcludeOutboundPorts":[null]}'
    )
    assert cfg == IptablesConfig(proxy_user_id="101", proxy_inbound_port=1, exclude_outbound_ports=("",))
    assert decode_config("null") == IptablesConfig()
    assert decode_config(json.dumps(K8S_TEST_CONFIG)).exclude_uids == ("1", "42")


# -- the rule set --------------------------------------------------------------------------------


def chain(rules: Any, name: str) -> list[str]:
    return rules.chain_rules(name)


def test_rules_follow_consuls_effective_order() -> None:
    rules = ruleset(decode_config(json.dumps(K8S_TEST_CONFIG)))
    assert chain(rules, "OUTPUT") == [
        "-A OUTPUT -p udp -d 127.0.0.1 --dport 53 -j CONSUL_DNS_REDIRECT",
        "-A OUTPUT -p tcp -d 127.0.0.1 --dport 53 -j CONSUL_DNS_REDIRECT",
        "-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT",
    ]
    assert chain(rules, "CONSUL_PROXY_OUTPUT") == [
        "-I CONSUL_PROXY_OUTPUT -m owner --uid-owner <ExcludeUIDs> -j RETURN",
        "-I CONSUL_PROXY_OUTPUT -d <ExcludeOutboundCIDRs> -j RETURN",
        "-I CONSUL_PROXY_OUTPUT -p tcp --dport <ExcludeOutboundPorts> -j RETURN",
        "-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 101 -j RETURN",
        "-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN",
        "-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT",
    ]
    assert chain(rules, "CONSUL_PROXY_REDIRECT") == ["-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-port 15001"]
    assert chain(rules, "CONSUL_DNS_REDIRECT") == [
        "-A CONSUL_DNS_REDIRECT -p udp -d 127.0.0.1 --dport 53 -j DNAT --to-destination 127.0.0.1:8600",
        "-A CONSUL_DNS_REDIRECT -p tcp -d 127.0.0.1 --dport 53 -j DNAT --to-destination 127.0.0.1:8600",
    ]
    assert chain(rules, "PREROUTING") == ["-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND"]
    assert chain(rules, "CONSUL_PROXY_INBOUND") == [
        "-I CONSUL_PROXY_INBOUND -p tcp --dport <ExcludeInboundPorts> -j RETURN",
        "-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT",
    ]
    assert chain(rules, "CONSUL_PROXY_IN_REDIRECT") == [
        "-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-port 20000"
    ]
    sets = {s.name: s.intervals for s in rules.sets}
    assert sets["exclude_uids"] == ((1, 1), (42, 42))
    assert sets["exclude_outbound_ports"] == ((15002, 15002),)
    assert sets["exclude_inbound_ports"] == ((9000, 9000),)


OUT_UDP, TO_DNS = "-A OUTPUT -p udp", "--dport 53 -j CONSUL_DNS_REDIRECT"


@pytest.mark.parametrize(
    ("dns", "output", "dnat"),
    [
        ({}, [], []),
        (
            {"ConsulDNSPort": 8600},
            ["-A OUTPUT -p udp -d 127.0.0.1 --dport 53 -j CONSUL_DNS_REDIRECT"],
            ["127.0.0.1:8600"],
        ),
        ({"ConsulDNSIP": "10.0.2.15"}, ["-A OUTPUT -p udp --dport 53 -j CONSUL_DNS_REDIRECT"], ["10.0.2.15"]),
        (
            {"ConsulDNSIP": "::ffff:10.0.2.15", "ConsulDNSPort": 53},
            ["-A OUTPUT -p udp -d 10.0.2.15 --dport 53 -j CONSUL_DNS_REDIRECT"],
            ["10.0.2.15:53"],
        ),
    ],
)
def test_dns_variants(dns: dict[str, Any], output: list[str], dnat: list[str]) -> None:
    rules = ruleset(decode_config(json.dumps({"ProxyUserID": "101", "ProxyInboundPort": 1, **dns})))
    assert [r for r in chain(rules, "OUTPUT") if "udp" in r] == output
    assert [r.split("--to-destination ")[1] for r in chain(rules, "CONSUL_DNS_REDIRECT") if "udp" in r] == dnat


def test_values_are_parsed_as_iptables_parses_them() -> None:
    cfg = {
        "ProxyUserID": "root",  # a user name, as --uid-owner takes it
        "ProxyInboundPort": 20000,
        "ExcludeOutboundPorts": ["https", "8000:8010", "8005", ":10", "65000:"],
        "ExcludeOutboundCIDRs": ["10.1.2.3/8", "10.200.0.0/16", "192.168.0.1", "172.16.0.0/255.240.0.0"],
        "ExcludeUIDs": ["2000-2100", "2050", "3000:3001"],
    }
    rules = ruleset(decode_config(json.dumps(cfg)))
    sets = {s.name: s for s in rules.sets}
    assert sets["exclude_outbound_ports"].intervals == ((0, 10), (443, 443), (8000, 8010), (65000, 65535))
    cidrs = sets["exclude_outbound_cidrs"]
    assert [cidrs.element(iv) for iv in cidrs.intervals] == [
        "10.0.0.0-10.255.255.255",  # host bits masked; 10.200/16 merged in
        "172.16.0.0-172.31.255.255",
        "192.168.0.1",
    ]
    assert sets["exclude_uids"].intervals == ((2000, 2100), (3000, 3001))
    assert "meta skuid 0 return" in [r.body for r in rules.rules]


# -- the table in a namespace ------------------------------------------------------------------


def nft_text(path: str) -> str:
    def read() -> str:
        from pycni._libnftables import Nftables

        rc, out, err = Nftables().cmd("list ruleset")
        assert rc == 0, err
        return out

    return netns.run_in(path, read)


def nft(path: str, command: str) -> None:
    def run() -> None:
        from pycni._libnftables import Nftables

        rc, _, err = Nftables().cmd(command)
        assert rc == 0, err

    netns.run_in(path, run)


@pytest.mark.privileged
def test_add_check_del(make_netns: Callable[[str], netns.Throwaway]) -> None:
    c = make_netns("c")
    cni_args = args(K8S_TEST_CONFIG)
    result = PLUGIN.handle(request("ADD", c.path, cni_args))
    assert result == {**prev_result(), "dns": {}}  # prevResult passed through

    text = nft_text(c.path)
    assert text.count("table ") == 1 and "table ip pycni_tproxy" in text
    for line in (
        "meta skuid @exclude_uids return",
        "ip daddr 127.0.0.1 return",
        "meta l4proto tcp redirect to :15001",
        "meta l4proto tcp redirect to :20000",
        "ip daddr 127.0.0.1 udp dport 53 dnat to 127.0.0.1:8600",
        "type nat hook prerouting priority dstnat; policy accept;",
        "type nat hook output priority -100; policy accept;",
        "elements = { 1, 42 }",
        "elements = { 10.0.0.0/24 }",
    ):
        assert line in text, line

    # A repeated ADD replaces the table: same rules, no duplicates.
    PLUGIN.handle(request("ADD", c.path, cni_args))
    assert nft_text(c.path) == text
    PLUGIN.handle(request("CHECK", c.path, cni_args))

    # CHECK names the first difference.
    changed = dict(K8S_TEST_CONFIG, ProxyOutboundPort=15009)
    assert "rule 1 of chain CONSUL_PROXY_REDIRECT is" in str(error_of(request("CHECK", c.path, args(changed))))
    nft(c.path, "delete element ip pycni_tproxy exclude_uids { 42 }")
    err = error_of(request("CHECK", c.path, cni_args))
    assert str(err) == (
        f"consul-cni: table ip pycni_tproxy: set exclude_uids holds {{1}}, expected {{1, 42}} in netns {c.path}"
    )
    nft(c.path, "flush chain ip pycni_tproxy PREROUTING")
    assert 'chain PREROUTING lacks rule 1 "-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND"' in str(
        error_of(request("CHECK", c.path, cni_args))
    )

    # DEL removes the table (CHECK then says so); DEL again, and DEL of a gone netns, are fine.
    PLUGIN.handle(request("DEL", c.path, ""))
    assert "pycni_tproxy" not in nft_text(c.path)
    assert str(error_of(request("CHECK", c.path, cni_args))) == (
        f"consul-cni: table ip pycni_tproxy not found in netns {c.path}"
    )
    PLUGIN.handle(request("DEL", c.path, ""))
    PLUGIN.handle(request("DEL", NOWHERE, ""))


@pytest.mark.privileged
def test_without_prev_result_the_empty_result_is_printed(make_netns: Callable[[str], netns.Throwaway]) -> None:
    c = make_netns("c")
    assert PLUGIN.handle(request("ADD", c.path, args(K8S_TEST_CONFIG), conf(None, "0.3.1"))) == {
        "cniVersion": "0.3.1",
        "dns": {},
    }
    assert PLUGIN.handle(request("ADD", c.path, args(K8S_TEST_CONFIG), conf(None, "1.0.0"))) == {"cniVersion": "1.0.0"}


@pytest.mark.privileged
def test_check_without_the_config_checks_the_skeleton(make_netns: Callable[[str], netns.Throwaway]) -> None:
    c = make_netns("c")
    PLUGIN.handle(request("ADD", c.path, args(K8S_TEST_CONFIG)))
    PLUGIN.handle(request("CHECK", c.path, ""))
    nft(c.path, "flush chain ip pycni_tproxy OUTPUT; delete chain ip pycni_tproxy CONSUL_DNS_REDIRECT")
    assert "chain CONSUL_DNS_REDIRECT is missing" in str(error_of(request("CHECK", c.path, "")))
    assert verify(None, None) == "table ip pycni_tproxy not found"


# -- real traffic ------------------------------------------------------------------------------

TRAFFIC_CONFIG = {
    "ConsulDNSIP": PEER_IP,
    "ConsulDNSPort": 8600,
    "ProxyUserID": str(PROXY_UID),
    "ProxyInboundPort": 20000,
    "ProxyOutboundPort": 15001,
    "ExcludeInboundPorts": ["9102"],
    "ExcludeOutboundPorts": ["8500"],
    "ExcludeOutboundCIDRs": [f"{PEER_EXCLUDED_IP}/32"],
    "ExcludeUIDs": [str(EXCLUDED_UID), "2000-2100"],
}


@pytest.fixture
def pair(make_netns: Callable[[str], netns.Throwaway]) -> Iterator[tuple[str, str]]:
    """(container, peer) namespaces joined by a veth: 198.18.0.1 ↔ 198.18.0.2 and .3."""
    c, p = make_netns("c"), make_netns("p")
    veth(c.path, "eth0", [f"{CONTAINER_IP}/24"], p.path, "peer0", [f"{PEER_IP}/24", f"{PEER_EXCLUDED_IP}/24"])
    yield c.path, p.path


@pytest.mark.privileged
def test_outbound_tcp_is_redirected_except_the_exclusions(pair: tuple[str, str]) -> None:
    c, p = pair
    PLUGIN.handle(request("ADD", c, args(TRAFFIC_CONFIG)))
    with listening(
        (c, "0.0.0.0", 15001, "proxy-outbound"),
        (c, "127.0.0.1", 7000, "local"),
        (p, "0.0.0.0", 80, "peer"),
        (p, "0.0.0.0", 8500, "peer"),
    ):
        # An ordinary UID goes to the proxy, which sees where the connection was headed.
        assert tcp_as(c, ORDINARY_UID, PEER_IP, 80) == f"proxy-outbound {PEER_IP}:80"
        assert tcp_as(c, 0, PEER_IP, 80) == f"proxy-outbound {PEER_IP}:80"  # root is ordinary too
        # The proxy UID, excluded UIDs (one and a range), port and CIDR go direct.
        assert tcp_as(c, PROXY_UID, PEER_IP, 80) == "peer -"
        assert tcp_as(c, EXCLUDED_UID, PEER_IP, 80) == "peer -"
        assert tcp_as(c, RANGE_UID, PEER_IP, 80) == "peer -"
        assert tcp_as(c, ORDINARY_UID, PEER_IP, 8500) == "peer -"
        assert tcp_as(c, ORDINARY_UID, PEER_EXCLUDED_IP, 80) == "peer -"
        # Loopback is exactly 127.0.0.1/32: 127.0.0.1 is direct, 127.0.0.2 is redirected.
        assert tcp_as(c, ORDINARY_UID, "127.0.0.1", 7000) == "local -"
        assert tcp_as(c, ORDINARY_UID, "127.0.0.2", 7000) == "proxy-outbound 127.0.0.2:7000"

    # Without the table (DEL), everything is direct again.
    PLUGIN.handle(request("DEL", c, ""))
    with listening((p, "0.0.0.0", 80, "peer")):
        assert tcp_as(c, ORDINARY_UID, PEER_IP, 80) == "peer -"


@pytest.mark.privileged
def test_inbound_tcp_is_redirected_except_excluded_ports(pair: tuple[str, str]) -> None:
    c, p = pair
    PLUGIN.handle(request("ADD", c, args(TRAFFIC_CONFIG)))
    with listening(
        (c, "0.0.0.0", 20000, "proxy-inbound"),
        (c, "0.0.0.0", 8080, "service"),
        (c, "0.0.0.0", 9102, "metrics"),
    ):
        assert tcp_as(p, ORDINARY_UID, CONTAINER_IP, 8080) == f"proxy-inbound {CONTAINER_IP}:8080"
        assert tcp_as(p, ORDINARY_UID, CONTAINER_IP, 9102) == "metrics -"


@pytest.mark.privileged
def test_dns_is_dnated_to_consul_dns(pair: tuple[str, str]) -> None:
    c, p = pair
    with listening(
        (p, PEER_IP, 8600, "consul-dns", True),
        (p, PEER_IP, 8600, "consul-dns-tcp"),
        (p, PEER_IP, 53, "peer-53", True),
        (p, PEER_EXCLUDED_IP, 53, "other-53", True),
        (c, "127.0.0.1", 8600, "local-consul-dns", True),
    ):
        # IP and port (Nomad's case): only DNS to that IP, to its port; TCP 53 before the proxy.
        PLUGIN.handle(request("ADD", c, args(TRAFFIC_CONFIG)))
        assert udp_query(c, PEER_IP, 53) == "consul-dns"
        assert tcp_as(c, ORDINARY_UID, PEER_IP, 53) == "consul-dns-tcp -"  # (NAT'ed in c, not in p)
        assert udp_query(c, PEER_EXCLUDED_IP, 53) == "other-53"

        # IP only: all port-53 traffic, to that IP.
        PLUGIN.handle(request("ADD", c, args(dict(TRAFFIC_CONFIG, ConsulDNSPort=0))))
        assert udp_query(c, PEER_EXCLUDED_IP, 53) == "peer-53"

        # Port only: 127.0.0.1:53 goes to 127.0.0.1:<port>.
        PLUGIN.handle(request("ADD", c, args(dict(TRAFFIC_CONFIG, ConsulDNSIP="", ConsulDNSPort=8600))))
        assert udp_query(c, "127.0.0.1", 53) == "local-consul-dns"
        assert udp_query(c, PEER_IP, 53) == "peer-53"

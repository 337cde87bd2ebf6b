"""portmap: DNAT via map elements, reachability, conflicts refused, DEL without mappings."""

from __future__ import annotations

import pytest

from pycni.errors import CNIError
from pycni_plugins.bridge import BridgePlugin
from pycni_plugins.portmap import PortmapPlugin

pytestmark = pytest.mark.privileged

V4 = [{"subnet": "10.77.0.0/24"}]
V6 = [{"subnet": "fd77::/64"}]


def _pm(prev: dict, mappings: list | None, **extra) -> dict:
    conf = {"cniVersion": "1.0.0", "name": "testnet", "type": "portmap", "prevResult": prev, **extra}
    if mappings is not None:
        conf["runtimeConfig"] = {"portMappings": mappings}
    return conf


@pytest.fixture
def attached(host, make_netns, kit, tmp_path):
    """Two containers on one dual-stack bridge: (conf, [(netns, result), ...])."""
    conf = kit.bridge_conf(tmp_path, V4, V6, hairpinMode=True)  # a container reaching its own port
    out = []
    for name in ("a", "b"):
        ns = make_netns("c")
        out.append((ns, BridgePlugin().handle(kit.request("ADD", conf, name, ns.path))))
    return conf, out


def test_publish_and_reach_from_everywhere(attached, kit):
    _, [(a, ra), (b, rb)] = attached
    maps = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
    out = PortmapPlugin().handle(kit.request("ADD", _pm(ra, maps), "a", a.path))
    assert out == ra
    elements = kit.nft_elements()
    assert len(elements["hostports4"]) == 1 and len(elements["hostports6"]) == 1
    stop = kit.serve_tcp(a.path, "::", 80)
    try:
        assert kit.tcp_get(None, "10.77.0.1", 8080) == b"pong"  # host, on a host address
        assert kit.tcp_get(None, "127.0.0.1", 8080) == b"pong"  # host, localhost (route_localnet)
        assert kit.tcp_get(b.path, "10.77.0.1", 8080) == b"pong"  # another container, hairpin
        assert kit.tcp_get(a.path, "10.77.0.1", 8080) == b"pong"  # the container itself
        assert kit.tcp_get(b.path, "fd77::1", 8080) == b"pong"  # IPv6
    finally:
        stop()
    assert kit.sysctl_in(None, "net/ipv4/conf/pbr0/route_localnet") == "1"
    PortmapPlugin().handle(kit.request("CHECK", _pm(ra, maps), "a", a.path))


def test_conflict_is_refused_with_nothing_changed(attached, kit):
    _, [(a, ra), (b, rb)] = attached
    plugin = PortmapPlugin()
    plugin.handle(kit.request("ADD", _pm(ra, [{"hostPort": 8080, "containerPort": 80}]), "a", a.path))
    before = kit.nft_ruleset()
    maps = [{"hostPort": 9090, "containerPort": 90}, {"hostPort": 8080, "containerPort": 81, "protocol": "tcp"}]
    with pytest.raises(CNIError, match=r"host port 8080/tcp is already mapped by another container \(testnet a eth0\)"):
        plugin.handle(kit.request("ADD", _pm(rb, maps), "b", b.path))
    assert kit.nft_ruleset() == before
    # Other protocol, other host IP: fine.
    plugin.handle(
        kit.request("ADD", _pm(rb, [{"hostPort": 8080, "containerPort": 80, "protocol": "udp"}]), "b", b.path)
    )


def test_readd_is_idempotent_and_replaces(attached, kit):
    _, [(a, ra), _] = attached
    plugin = PortmapPlugin()
    for _ in range(2):
        plugin.handle(kit.request("ADD", _pm(ra, [{"hostPort": 8080, "containerPort": 80}]), "a", a.path))
    assert len(kit.nft_elements()["hostports4"]) == 1
    plugin.handle(
        kit.request("ADD", _pm(ra, [{"HostPort": 8081, "ContainerPort": 80, "Protocol": "tcp"}]), "a", a.path)
    )
    keys = [e[0]["elem"]["val"]["concat"] for e in kit.nft_elements()["hostports4"]]
    assert keys == [["tcp", 8081]]


def test_del_without_mappings_cleans_up(attached, kit):
    _, [(a, ra), _] = attached
    plugin = PortmapPlugin()
    maps = [
        {"hostPort": 8080, "containerPort": 80},
        {"hostPort": 53, "containerPort": 53, "protocol": "udp", "hostIP": "10.77.0.1"},
    ]
    plugin.handle(kit.request("ADD", _pm(ra, maps), "a", a.path))
    assert len(kit.nft_elements()["hostip_hostports4"]) == 1
    for _ in range(2):
        plugin.handle(kit.request("DEL", _pm(ra, None), "a", a.path))
    assert all(not v for k, v in kit.nft_elements().items() if k.startswith(("host", "hairpin")))


def test_check_and_errors(attached, kit):
    _, [(a, ra), _] = attached
    plugin = PortmapPlugin()
    maps = [{"hostPort": 8080, "containerPort": 80}]
    with pytest.raises(CNIError, match="missing hostport elements"):
        plugin.handle(kit.request("CHECK", _pm(ra, maps), "a", a.path))
    with pytest.raises(CNIError, match="must be called as chained plugin"):
        plugin.handle(kit.request("ADD", {"cniVersion": "1.0.0", "name": "n", "type": "portmap"}, "a", a.path))
    with pytest.raises(CNIError, match="Invalid host port number: 0"):
        plugin.handle(kit.request("ADD", _pm(ra, [{"hostPort": 0, "containerPort": 80}]), "a", a.path))
    with pytest.raises(CNIError) as err:
        plugin.handle(kit.request("ADD", _pm(ra, maps, conditionsV4=["-s", "1.2.3.4"]), "a", a.path))
    assert err.value.code == 2


def test_rule_count_constant(attached, kit):
    _, [(a, ra), (b, rb)] = attached
    plugin = PortmapPlugin()
    plugin.handle(kit.request("ADD", _pm(ra, [{"hostPort": 8080, "containerPort": 80}]), "a", a.path))
    rules = kit.nft_rule_count()
    plugin.handle(kit.request("ADD", _pm(rb, [{"hostPort": 8081, "containerPort": 80}]), "b", b.path))
    assert kit.nft_rule_count() == rules


def _udp_conntrack(port: int) -> list:
    """This namespace's conntrack entries of UDP flows to ``port``."""
    import socket

    from pyroute2 import Conntrack
    from pyroute2.conntrack import NFCTAttrTuple

    with Conntrack() as ct:
        return list(ct.dump_entries(tuple_orig=NFCTAttrTuple(proto=socket.IPPROTO_UDP, dport=port)))


def test_new_udp_host_port_flushes_stale_conntrack_entries(attached, kit):
    import socket

    from pycni import netns

    _, [(a, ra), (b, rb)] = attached

    def sender() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", 40000))  # one fixed source port: the same flow before and after
        return s

    def receiver() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", 53))
        s.settimeout(2)
        return s

    out, into = netns.run_in(b.path, sender), netns.run_in(a.path, receiver)
    try:
        out.sendto(b"early", ("10.77.0.1", 5353))  # nothing published yet: the host refuses it
        assert len(_udp_conntrack(5353)) == 1  # ... and conntrack remembers the un-NATed flow
        maps = [{"hostPort": 5353, "containerPort": 53, "protocol": "udp"}]
        PortmapPlugin().handle(kit.request("ADD", _pm(ra, maps), "a", a.path))
        assert _udp_conntrack(5353) == []
        out.sendto(b"late", ("10.77.0.1", 5353))  # the same flow is new to conntrack: DNAT'd
        assert into.recvfrom(64)[0] == b"late"
    finally:
        out.close()
        into.close()


def _refused(plugin, kit, request, match):
    before = kit.nft_ruleset()
    with pytest.raises(CNIError, match=match) as raised:
        plugin.handle(request)
    assert kit.nft_ruleset() == before
    return raised.value


def test_a_host_ip_mapping_is_refused_while_another_container_publishes_the_port_everywhere(attached, kit):
    """(proto, port) on one address would shadow another container's (proto, port) on every
    address for that address: refused, nothing changed, the holder still CHECK-clean."""
    _, [(a, ra), (b, rb)] = attached
    plugin = PortmapPlugin()
    wild = [{"hostPort": 18080, "containerPort": 80}]
    plugin.handle(kit.request("ADD", _pm(ra, wild), "a", a.path))
    one = [{"hostPort": 18080, "containerPort": 80, "hostIP": "10.77.0.1"}]
    _refused(plugin, kit, kit.request("ADD", _pm(rb, one), "b", b.path), r"host port 18080/tcp .*\(testnet a eth0\)")
    plugin.handle(kit.request("DEL", _pm(rb, one), "b", b.path))
    plugin.handle(kit.request("CHECK", _pm(ra, wild), "a", a.path))
    stop = kit.serve_tcp(a.path, "::", 80)
    try:
        assert kit.tcp_get(None, "10.77.0.1", 18080) == b"pong"  # still a's
    finally:
        stop()
    # Another port on that address is free.
    plugin.handle(
        kit.request("ADD", _pm(rb, [{"hostPort": 18081, "containerPort": 80, "hostIP": "10.77.0.1"}]), "b", b.path)
    )


def test_an_every_address_mapping_is_refused_while_another_container_publishes_the_port_on_one(attached, kit):
    _, [(a, ra), (b, rb)] = attached
    plugin = PortmapPlugin()
    one = [{"hostPort": 18080, "containerPort": 80, "hostIP": "10.77.0.1"}]
    plugin.handle(kit.request("ADD", _pm(ra, one), "a", a.path))
    wild = [{"hostPort": 18080, "containerPort": 80}]
    _refused(
        plugin,
        kit,
        kit.request("ADD", _pm(rb, wild), "b", b.path),
        r"host port 10.77.0.1:18080/tcp .*\(testnet a eth0\)",
    )
    plugin.handle(kit.request("DEL", _pm(rb, wild), "b", b.path))
    plugin.handle(kit.request("CHECK", _pm(ra, one), "a", a.path))
    # Other host IPs on the same port coexist; one container may hold both kinds of one port.
    plugin.handle(kit.request("ADD", _pm(rb, [{**one[0], "hostIP": "10.77.0.9"}]), "b", b.path))
    plugin.handle(
        kit.request(
            "ADD",
            _pm(
                ra,
                [
                    *one,
                    {"hostPort": 18090, "containerPort": 80},
                    {"hostPort": 18090, "containerPort": 80, "hostIP": "10.77.0.1"},
                ],
            ),
            "a",
            a.path,
        )
    )


def test_a_refused_mapping_says_what_the_earlier_plugins_left_and_that_del_removes_it(attached, kit):
    _, [(a, ra), (b, rb)] = attached
    plugin = PortmapPlugin()
    maps = [{"hostPort": 18080, "containerPort": 80}]
    plugin.handle(kit.request("ADD", _pm(ra, maps), "a", a.path))
    error = _refused(plugin, kit, kit.request("ADD", _pm(rb, maps), "b", b.path), "already mapped")
    assert "nothing was changed" not in error.details
    assert error.details.startswith("portmap changed nothing; what the earlier plugins set up for b/eth0")
    assert "eth0" in error.details and rb["ips"][0]["address"] in error.details
    assert "a DEL of this attachment removes it" in error.details


@pytest.mark.parametrize("host_ip", ["fd77::1%pbr0", "fe80::1%1", "10.77.0.1%x"])
def test_a_host_ip_with_a_zone_is_refused_at_validation(attached, kit, host_ip):
    _, [(a, ra), _] = attached
    maps = [{"hostPort": 18080, "containerPort": 80, "hostIP": host_ip}]
    request = kit.request("ADD", _pm(ra, maps), "a", a.path)
    with pytest.raises(CNIError, match=f'invalid host ip "{host_ip}" provided for port 18080'):
        PortmapPlugin().validate(request)
    _refused(PortmapPlugin(), kit, request, "invalid host ip")


def test_a_host_ip_mapping_committed_between_the_two_looks_still_refuses_the_every_address_one(
    attached, kit, monkeypatch
):
    """The look after the commit is skipped only when the ruleset generation shows nothing but
    this ADD's own commit since the first look: a racing host-IP ADD committed in between (here
    a's, in the middle of b's) is seen, and b's mapping is taken back."""
    from pycni_plugins import portmap

    _, [(a, ra), (b, rb)] = attached
    plugin = PortmapPlugin()
    one = [{"hostPort": 18080, "containerPort": 80, "hostIP": "10.77.0.1"}]
    wild = [{"hostPort": 18080, "containerPort": 80}]
    real = portmap.nft.apply

    def racing(*args, **kwargs):
        monkeypatch.setattr(portmap.nft, "apply", real)
        plugin.handle(kit.request("ADD", _pm(ra, one), "a", a.path))
        return real(*args, **kwargs)

    monkeypatch.setattr(portmap.nft, "apply", racing)
    with pytest.raises(CNIError, match=r"host port 10.77.0.1:18080/tcp .*\(testnet a eth0\)"):
        plugin.handle(kit.request("ADD", _pm(rb, wild), "b", b.path))
    assert not kit.nft_elements()["hostports4"]
    plugin.handle(kit.request("CHECK", _pm(ra, one), "a", a.path))

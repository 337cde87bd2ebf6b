"""kernel.batch: requests built as pyroute2's IPRoute API builds them, sent in one send, each
answered in order (a failed one does not hide the others' answers)."""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest
from pyroute2.iproute.linux import IPBatch
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from pycni import netns
from pycni_plugins.kernel import addressing, batch, links, routing, sysctl

pytestmark = pytest.mark.privileged

V4 = ipaddress.ip_interface("198.18.7.5/24")
V4_31 = ipaddress.ip_interface("198.18.7.8/31")
V6 = ipaddress.ip_interface("fd00:7::5/64")
MAC = "02:00:00:00:00:01"


def _decoded(data: bytes) -> list[tuple[Any, ...]]:
    """The messages of a buffer without what differs per send (sequence number, port id)."""
    out = []
    for msg in MarshalRtnl().parse(data):
        h = msg["header"]
        fields = tuple((name, msg[name]) for name, *_ in msg.fields)
        out.append((h["type"], h["flags"], fields, tuple(map(tuple, msg["attrs"]))))
    return out


CASES: list[tuple[str, Callable[[batch.Requests], int], Callable[[Any], None]]] = [
    ("link up", lambda r: r.link_set(5, up=True), lambda i: i.link("set", index=5, state="up")),
    (
        "link mac",
        lambda r: r.link_set(5, address="02:00:00:00:00:01"),
        lambda i: i.link("set", index=5, address="02:00:00:00:00:01"),
    ),
    ("link by index", lambda r: r.link_get(5), lambda i: i.link("get", index=5)),
    ("link by name", lambda r: r.link_get(name="veth1"), lambda i: i.link("get", ifname="veth1")),
    ("link deleted", lambda r: r.link_del("veth1"), lambda i: i.link("del", ifname="veth1")),
    (
        "route get",
        lambda r: r.route_get(ipaddress.ip_address("198.18.7.9")),
        lambda i: i.route("get", dst="198.18.7.9"),
    ),
    (
        "v6 route get",
        lambda r: r.route_get(ipaddress.ip_address("fd00:7::9")),
        lambda i: i.route("get", dst="fd00:7::9"),
    ),
    ("v4 address", lambda r: r.addr_add(5, V4), lambda i: addressing.add_address(i, 5, V4)),
    ("v4 /31 address", lambda r: r.addr_add(5, V4_31), lambda i: addressing.add_address(i, 5, V4_31)),
    (
        "v6 address, no DAD",
        lambda r: r.addr_add(5, V6, nodad=True),
        lambda i: addressing.add_address(i, 5, V6, nodad=True),
    ),
    ("v6 address", lambda r: r.addr_add(5, V6), lambda i: addressing.add_address(i, 5, V6)),
    (
        "default route via",
        lambda r: r.route_append(5, ipaddress.ip_network("0.0.0.0/0"), "198.18.7.1"),
        lambda i: routing.add_route(i, 5, ipaddress.ip_network("0.0.0.0/0"), "198.18.7.1"),
    ),
    (
        "link route, metric, table",
        lambda r: r.route_append(5, ipaddress.ip_network("10.0.0.0/8"), None, priority=7, table=300),
        lambda i: routing.add_route(i, 5, ipaddress.ip_network("10.0.0.0/8"), None, priority=7, table=300),
    ),
    (
        "v6 route with scope",
        lambda r: r.route_append(5, ipaddress.ip_network("fd00:9::/64"), "fd00:7::1", scope=0),
        lambda i: routing.add_route(i, 5, ipaddress.ip_network("fd00:9::/64"), "fd00:7::1", scope=0),
    ),
]


@pytest.mark.parametrize(("mine", "theirs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_request_is_the_message_pyroute2s_api_sends(host, mine, theirs) -> None:
    requests = batch.Requests()
    mine(requests)
    compiler = IPBatch()  # pyroute2's own: compiles its API calls into a buffer, sends nothing
    try:
        theirs(compiler)
        assert _decoded(b"".join(requests._data)) == _decoded(bytes(compiler.batch))
    finally:
        compiler.close()


def test_a_request_built_again_is_reused_bytes_identical_to_a_fresh_encoding(monkeypatch) -> None:
    """The second time a request's content is seen, pyroute2 does not encode it again: its
    bytes are the first encoding's, with the request's own sequence number."""

    def build() -> list[bytes]:
        requests = batch.Requests()
        for _, mine, _ in CASES + CASES:
            mine(requests)
        return requests._data

    monkeypatch.setattr(batch, "_ENCODED_KEPT", 0)  # nothing kept: every request encoded
    fresh = build()
    monkeypatch.setattr(batch, "_ENCODED_KEPT", 64)
    monkeypatch.setattr(batch, "_encoded", OrderedDict())
    encoded: list[str] = []
    for cls in (batch.ifinfmsg, batch.ifaddrmsg, batch.rtmsg):
        original = cls.encode
        monkeypatch.setattr(cls, "encode", lambda self, original=original: encoded.append("x") or original(self))
    reused = build()
    assert len(encoded) == len(CASES)  # each distinct request encoded once
    assert reused == fresh
    sequences = [m["header"]["sequence_number"] for m in MarshalRtnl().parse(b"".join(reused))]
    assert sequences == list(range(1, 2 * len(CASES) + 1))


def test_the_kept_encodings_are_bounded_and_the_least_recently_used_goes_first(monkeypatch) -> None:
    monkeypatch.setattr(batch, "_ENCODED_KEPT", 2)
    kept: OrderedDict[Any, bytes] = OrderedDict()
    monkeypatch.setattr(batch, "_encoded", kept)
    requests = batch.Requests()
    for index in (1, 2, 1, 3):
        requests.link_get(index)
    assert [key[3][3] for key in kept] == [1, 3]  # the fields' index; 2 was the least recently used
    assert [m["index"] for m in MarshalRtnl().parse(b"".join(requests._data))] == [1, 2, 1, 3]


def test_one_send_answers_each_request_in_order_and_a_failure_stops_nothing(make_netns) -> None:
    ns = make_netns("c")

    def body() -> tuple[list[batch.Answer], list[Any], bool]:
        requests = batch.Requests()
        requests.link_get(links.LOOPBACK_INDEX)
        requests.link_get(4242)  # no such link
        requests.addr_add(links.LOOPBACK_INDEX, ipaddress.ip_interface("198.18.9.1/32"))
        requests.addr_add(links.LOOPBACK_INDEX, ipaddress.ip_interface("198.18.9.1/32"))  # EEXIST
        requests.link_set(links.LOOPBACK_INDEX, up=True)
        requests.addr_dump()
        answers = requests.send()
        with links.iproute() as ipr:
            lo = links.get_link(ipr, index=links.LOOPBACK_INDEX)
            have = [a for a, _ in addressing.addresses(ipr, links.LOOPBACK_INDEX)]
        return answers, have, bool(lo and lo.up)

    answers, have, up = netns.run_in(ns.path, body)
    assert [a.error.errno if a.error else 0 for a in answers] == [0, errno.ENODEV, 0, errno.EEXIST, 0, 0]
    assert answers[0].messages[0]["index"] == links.LOOPBACK_INDEX
    with pytest.raises(links.LinkError) as e:
        answers[1].check()
    assert e.value.errno == errno.ENODEV
    assert up and ipaddress.ip_interface("198.18.9.1/32") in have
    listed = addressing.of_link(answers[5].check(), links.LOOPBACK_INDEX)
    assert sorted(map(str, listed)) == sorted(map(str, have))
    assert {m["family"] for m in answers[5].messages} >= {socket.AF_INET, socket.AF_INET6}


def test_fetch_link_reads_a_link_by_name_or_index_and_none_when_missing(make_netns) -> None:
    ns = make_netns("c")

    def body() -> tuple[Any, ...]:
        with links.iproute() as ipr:
            via_ipr = links.get_link(ipr, "lo")
        return via_ipr, links.fetch_link("lo"), links.fetch_link(index=1), links.fetch_link("nosuch0")

    via_ipr, by_name, by_index, missing = netns.run_in(ns.path, body)
    assert by_name == via_ipr and by_index == via_ipr and missing is None


def test_a_link_read_from_its_answers_bytes_is_what_pyroute2_decodes_of_it(make_netns) -> None:
    """fetch_link reads a few attributes of the RTM_NEWLINK answer's bytes: for every kind of
    link an ADD reads (and lo), the Link is the one pyroute2's full decoding gives."""
    ns, peer_ns = make_netns("c"), make_netns("p")

    def body() -> list[tuple[links.Link, links.Link]]:
        with links.iproute() as ipr, open(peer_ns.path) as peer:
            links.ensure_bridge(ipr, "br0", mac=lambda: MAC)
            br = links.ifindex("br0")
            links.add_veth(
                "va", "02:00:00:00:00:0a", peer_name="vb", peer_netns_fd=peer.fileno(), peer_mac=None, mtu=0, master=br
            )
            links.add_link(ipr, "vx", "veth", peer="vy")  # both ends here, down: LOWERLAYERDOWN, no netnsid
            links.add_link(ipr, "d0", "veth", peer="d1", mtu=1300, txqlen=7, up=True, address="02:00:00:00:00:0d")
        pairs = []
        for name in ("lo", "br0", "va", "vx", "vy", "d0"):
            requests = batch.Requests()
            requests.link_get(name=name)
            answer = requests.send()[0]
            assert len(answer.raw) == 1
            pairs.append((links._link_of(answer.raw[0]), links._link(answer.messages[0])))
        return pairs

    pairs = netns.run_in(ns.path, body)
    assert [mine for mine, _ in pairs] == [theirs for _, theirs in pairs]
    lo, br, va, vx, vy, d0 = (mine for mine, _ in pairs)
    # what is read is really there: none of it is a default the two decodings would share
    assert (br.kind, br.mac) == ("bridge", MAC)
    assert (va.kind, va.master) == ("veth", br.index)
    assert va.peer_netnsid is not None and va.peer_index and va.operstate in ("UP", "LOWERLAYERDOWN")
    assert vx.peer_index == vy.index and vx.peer_netnsid is None and vx.operstate == "DOWN"
    assert (d0.kind, d0.mtu, d0.txqlen, d0.mac, d0.up) == ("veth", 1300, 7, "02:00:00:00:00:0d", True)
    assert lo.name == "lo" and lo.index == links.LOOPBACK_INDEX and lo.operstate == "UNKNOWN"


def test_a_links_addresses_read_from_a_dumps_bytes_are_the_ones_pyroute2_lists(make_netns) -> None:
    """of_link reads an address dump's bytes: for each link, the addresses (a peer address's
    local end, IPv6, several per link) that addressing.addresses lists through pyroute2."""
    ns = make_netns("c")

    def body() -> list[tuple[list[str], list[str]]]:
        with links.iproute() as ipr:
            links.add_link(ipr, "a0", "veth", peer="a1", up=True)
            a0, a1 = links.ifindex("a0"), links.ifindex("a1")
            assert a0 is not None and a1 is not None
            addressing.add_address(ipr, a0, V4)
            addressing.add_address(ipr, a0, V6, nodad=True)
            addressing.add_address(ipr, a0, V4_31)
            links.call(ipr.addr, "add", index=a1, address="198.18.8.2", local="198.18.8.1", prefixlen=32)
            requests = batch.Requests()
            position = requests.addr_dump()
            raw = requests.send()[position].check()
            pairs = []
            for index in (links.LOOPBACK_INDEX, a0, a1):
                theirs = [a for a, _ in addressing.addresses(ipr, index)]
                pairs.append((sorted(map(str, addressing.of_link(raw, index))), sorted(map(str, theirs))))
            return pairs

    pairs = netns.run_in(ns.path, body)
    assert [mine for mine, _ in pairs] == [theirs for _, theirs in pairs]
    lo, a0, a1 = (mine for mine, _ in pairs)
    assert "127.0.0.1/8" in lo and {str(V4), str(V6), str(V4_31)} <= set(a0) and "198.18.8.1/32" in a1


def test_route_oif_read_from_the_answers_bytes_is_what_pyroute2_decodes(make_netns) -> None:
    ns = make_netns("c")

    def body() -> list[tuple[int | None, Any]]:
        with links.iproute() as ipr:
            links.add_link(ipr, "r0", "veth", peer="r1", up=True)
            index, peer = links.ifindex("r0"), links.ifindex("r1")
            assert index is not None and peer is not None
            links.set_up(ipr, peer)
            addressing.add_address(ipr, index, ipaddress.ip_interface("198.18.5.1/24"))
        found = []
        for dst in ("198.18.5.7", "127.0.0.9"):
            requests = batch.Requests()
            requests.route_get(ipaddress.ip_address(dst))
            answer = requests.send()[0]
            found.append((routing.route_oif(dst), answer.messages[0].get("oif")))
        return found

    found = netns.run_in(ns.path, body)
    assert [mine for mine, _ in found] == [theirs for _, theirs in found]
    assert found[1][0] == links.LOOPBACK_INDEX and found[0][0] not in (None, links.LOOPBACK_INDEX)


def test_route_oif_names_the_link_the_kernel_picks_and_none_when_unreachable(make_netns) -> None:
    ns = make_netns("c")
    local, unreachable = netns.run_in(
        ns.path, lambda: (routing.route_oif("127.0.0.5"), routing.route_oif("198.18.99.1"))
    )
    assert local == links.LOOPBACK_INDEX and unreachable is None


def test_default_routes_are_found_among_many_others_decoding_only_them(make_netns, monkeypatch) -> None:
    """A host's routes grow with its links (each veth's link-local ones); finding its uplinks
    decodes only the default routes, whatever else the tables hold."""
    from pycni_plugins.kernel import ifconfig

    ns = make_netns("c")
    decoded: list[int] = []
    parse = MarshalRtnl.parse

    def counted(self: MarshalRtnl, data: bytes, *args: Any, **kwargs: Any) -> Any:
        messages = list(parse(self, data, *args, **kwargs))
        decoded.append(len(messages))
        return messages

    monkeypatch.setattr(MarshalRtnl, "parse", counted)

    def body() -> tuple[list[int], list[int], int]:
        with links.iproute() as ipr:
            links.add_link(ipr, "up0", "veth", peer="up1")
            links.add_link(ipr, "many0", "veth", peer="many1")
            up, many = links.ifindex("up0"), links.ifindex("many0")
            assert up is not None and many is not None
            links.set_up(ipr, up)
            links.set_up(ipr, many)
            addressing.add_address(ipr, up, ipaddress.ip_interface("198.18.0.2/24"))
            for chunk in range(6):  # 50 answers at a time fit the socket's receive buffer
                requests = batch.Requests()
                for i in range(chunk * 50, chunk * 50 + 50):
                    requests.route_append(many, ipaddress.ip_network(f"198.19.{i // 250}.{i % 250}/32"), None)
                assert all(a.error is None for a in requests.send())
            routing.add_route(ipr, up, ipaddress.ip_network("0.0.0.0/0"), "198.18.0.1")
            decoded.clear()
            found = ifconfig.default_route_indexes(ipr)
            return found, [up], sum(decoded)

    found, expected, parsed = netns.run_in(ns.path, body)
    assert found == expected
    assert parsed < 20, parsed  # the default route and the routing rules, not the 300 others


@pytest.mark.parametrize(("mtu", "master", "peer_mac"), [(0, None, None), (1400, 3, "02:00:00:00:00:02")])
def test_a_veth_is_the_message_pyroute2s_api_sends(host, mtu, master, peer_mac) -> None:
    peer = {"ifname": "eth0", "net_ns_fd": 9, **({"address": peer_mac} if peer_mac else {})}
    requests = batch.Requests()
    requests.veth_add({"ifname": "vethx", "address": MAC}, peer, master=master, mtu=mtu)
    theirs = {"ifname": "vethx", "address": MAC, "state": "up", **({"master": master} if master else {})}
    if mtu:
        theirs["mtu"] = mtu
        peer = {**peer, "mtu": mtu}
    compiler = IPBatch()
    try:
        compiler.link("add", kind="veth", peer=peer, **theirs)
        assert _decoded(b"".join(requests._data)) == _decoded(bytes(compiler.batch))
    finally:
        compiler.close()


def test_a_links_ipv4_settings_set_through_netlink_are_the_ones_proc_sys_then_shows(make_netns) -> None:
    ns = make_netns("c")
    names = ("arp_notify", "route_localnet", "proxy_arp", "rp_filter")

    def body() -> tuple[list[str], list[str], Any]:
        before = [sysctl.read(f"net/ipv4/conf/lo/{name}") for name in names]
        requests = batch.Requests()
        requests.link_set(links.LOOPBACK_INDEX, inet_conf={"arp_notify": 1, "route_localnet": 1, "rp_filter": 2})
        answer = requests.send()[0]
        return before, [sysctl.read(f"net/ipv4/conf/lo/{name}") for name in names], answer.error

    before, after, error = netns.run_in(ns.path, body)
    assert error is None
    assert before[:2] == ["0", "0"] and before[3] != "2"
    # each setting lands on its own sysctl (IPV4_DEVCONF_* numbering), the others stay as they were
    assert after == ["1", "1", before[2], "2"]


def test_an_ipv4_link_setting_the_kernel_does_not_have_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="arp_nofity"):
        batch.Requests().link_set(1, inet_conf={"arp_nofity": 1})

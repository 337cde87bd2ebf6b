"""links: the main thread's kept IPRoute, per-block sockets elsewhere, delete_link."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading

import pytest

from pycni import netns
from pycni_plugins.kernel import addressing, links, routing

pytestmark = pytest.mark.privileged


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def _quiet(kit) -> None:
    """Earlier tests' delete helpers must not close their sockets while fds are compared."""
    kit.join_delete_helpers()


def test_the_main_thread_keeps_one_iproute_for_its_current_namespace(make_netns):
    a, b = make_netns("a"), make_netns("b")
    assert threading.current_thread() is threading.main_thread()
    with netns.entered(a.path), links.iproute() as first, links.iproute() as again:
        assert again is first
        fds = _fds()
    for _ in range(3):  # switching namespaces replaces it: nothing accumulates
        for ns in (b, a):
            with netns.entered(ns.path), links.iproute() as ipr:
                assert links.get_link(ipr, "lo") is not None
    with netns.entered(a.path), links.iproute() as ipr:
        assert ipr is not first and _fds() == fds
        with netns.entered(b.path), links.iproute() as nested:  # the outer one stays usable
            assert nested is not ipr and links.get_link(nested, "lo") is not None
        assert links.get_link(ipr, "lo") is not None
    with netns.entered(a.path), links.iproute() as again:
        assert again is ipr and _fds() == fds


def test_other_threads_close_theirs_after_the_block(make_netns):
    ns = make_netns("c")

    def use() -> None:
        with links.iproute() as ipr:
            links.get_link(ipr, "lo")

    netns.run_in(ns.path, use)
    fds = _fds()
    for _ in range(3):
        netns.run_in(ns.path, use)
    assert _fds() == fds


def test_kept_sockets_and_nft_contexts_name_the_namespace_however_the_thread_got_there(make_netns):
    from pycni_plugins.kernel import changes
    from pycni_plugins.kernel.nft import transport

    a, b = make_netns("a"), make_netns("b")

    def names() -> list[object]:
        key = links.namespace_key()
        return [key[0], key[1:], transport._netns_ident(), changes._netns()]

    def expected(path: str) -> list[object]:
        st = os.stat(path)
        return [os.getpid(), (st.st_dev, st.st_ino), (st.st_dev, st.st_ino), str(st.st_ino)]

    assert names() == expected("/proc/thread-self/ns/net")
    with netns.entered(a.path):
        assert names() == expected(a.path)
        with netns.entered(b.path):  # nested: the inner block's namespace, then the outer's again
            assert names() == expected(b.path)
        assert names() == expected(a.path)
        seen: list[list[object]] = []
        started = threading.Thread(target=lambda: seen.append(names()))  # born in a, no block of its own
        started.start()
        started.join()
        assert seen == [expected(a.path)]
        assert netns.run_in(b.path, names) == expected(b.path)  # a worker that setns'd without a block


def test_delete_link_returns_with_both_veth_ends_unlisted(make_netns):
    host, ctr = make_netns("h"), make_netns("c")

    def make() -> None:
        fd = os.open(ctr.path, os.O_RDONLY)
        try:
            mac = links.random_mac()
            links.add_veth("vtest0", mac, peer_name="eth9", peer_netns_fd=fd, peer_mac=None, mtu=0, master=0)
        finally:
            os.close(fd)

    netns.run_in(host.path, make)
    netns.run_in(ctr.path, links.delete_link, "eth9")
    assert netns.run_in(ctr.path, links.ifindex, "eth9") is None
    assert netns.run_in(host.path, links.ifindex, "vtest0") is None
    netns.run_in(ctr.path, links.delete_link, "eth9")  # gone already: fine
    with pytest.raises(links.LinkError) as err:  # a kernel refusal reaches the caller
        netns.run_in(ctr.path, links.delete_link, "lo")
    assert err.value.errno == errno.EOPNOTSUPP  # lo cannot be deleted
    assert netns.run_in(ctr.path, socket.if_nametoindex, "lo") == 1


def test_link_info_routes_and_rules_are_what_the_plugins_read(make_netns):
    ns = make_netns("i")

    def probe() -> None:
        with links.iproute() as ipr:
            links.call(ipr.link, "add", ifname="vi0", kind="veth", peer="vi1")
            index = links.ifindex("vi0")
            assert index is not None
            links.set_link(ipr, index, ifalias="host-name")
            # bcqueuelen is known to pyroute2 only through the kind links.py registers
            links.add_link(ipr, "mv0", "macvlan", link=index, macvlan_mode="vepa", macvlan_bc_queue_len=7)
            info = links.link_info(ipr, index=index)
            assert info is not None and info.link.name == "vi0" and info.alias == "host-name"
            mv = links.link_info(ipr, "mv0")
            assert mv is not None and mv.link.kind == "macvlan" and mv.alias == ""
            assert mv.data["IFLA_MACVLAN_MODE"] == "vepa" and mv.data["IFLA_MACVLAN_BC_QUEUE_LEN"] == 7
            assert links.link_info(ipr, "nothere") is None

            links.set_up(ipr, index)
            addressing.add_address(ipr, index, ipaddress.ip_interface("10.9.0.2/24"))
            mine = [r for r in routing.dump_routes(ipr, socket.AF_INET) if r.get("oif") == index]
            assert [(r["dst"], r["dst_len"], r["table"]) for r in mine] == [("10.9.0.0", 24, routing.RT_TABLE_MAIN)]
            copy = {**mine[0], "table": 1000}  # above 255: only RTA_TABLE holds it
            routing.route(ipr, "replace", **copy)
            assert [r["table"] for r in routing.dump_routes(ipr, socket.AF_INET, 1000)] == [1000]
            with pytest.raises(links.LinkError) as err:  # a refusal comes out translated
                routing.route(ipr, "add", **copy)
            assert err.value.errno == errno.EEXIST

            rule = {"family": socket.AF_INET, "table": 1000, "src": "10.9.0.2", "src_len": 32, "priority": 500}
            routing.rule(ipr, "add", **rule)
            assert rule in routing.dump_rules(ipr, socket.AF_INET)
            routing.rule(ipr, "del", **rule)
            assert rule not in routing.dump_rules(ipr, socket.AF_INET)

    netns.run_in(ns.path, probe)


def test_flags_of_reads_the_up_flag_netlink_reads_and_none_for_a_missing_link(make_netns):
    ns = make_netns("w")

    def probe() -> list[tuple[int | None, int]]:
        with links.iproute() as ipr:
            links.call(ipr.link, "add", ifname="vw0", kind="veth", peer="vw1")
            index = links.ifindex("vw0")
            assert index is not None
            seen = []
            for up in (False, True):
                if up:
                    links.set_up(ipr, index)
                link = links.get_link(ipr, index=index)
                assert link is not None
                seen.append((links.flags_of("vw0"), link.flags))
            assert links.flags_of("nothere") is None
            return seen

    (down, down_nl), (up, up_nl) = netns.run_in(ns.path, probe)
    assert down is not None and up is not None
    assert not down & links.IFF_UP and not down_nl & links.IFF_UP
    assert up & links.IFF_UP and up_nl & links.IFF_UP
    assert down & 0xFF0F == down_nl & 0xFF0F  # the rest alike, IFF_RUNNING (0x40) aside

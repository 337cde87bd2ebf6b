"""links: the main thread's kept IPRoute, per-block sockets elsewhere, delete_link."""

from __future__ import annotations

import errno
import os
import socket
import threading

import pytest

from pycni import netns
from pycni_plugins.kernel import links

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


def test_delete_link_returns_with_both_veth_ends_unlisted(make_netns):
    host, ctr = make_netns("h"), make_netns("c")

    def make() -> None:
        fd = os.open(ctr.path, os.O_RDONLY)
        try:
            with links.iproute() as ipr:
                mac = links.random_mac()
                links.add_veth(ipr, "vtest0", mac, peer_name="eth9", peer_netns_fd=fd, peer_mac=None, mtu=0, master=0)
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

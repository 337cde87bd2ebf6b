"""``kernel.sysctl``: every access lands in the calling thread's namespace, through directories
kept per namespace (``/proc/sys/net/ipv4`` and ``ipv6``), and never through a dead one's."""

from __future__ import annotations

import contextlib

import pytest

from pycni import netns
from pycni_plugins.kernel import sysctl

pytestmark = pytest.mark.privileged

ACCEPT_RA = "net/ipv6/conf/lo/accept_ra"
ARP_NOTIFY = "net/ipv4/conf/lo/arp_notify"


def _set_and_read(value: int) -> tuple[str, str]:
    sysctl.write(ACCEPT_RA, value)
    sysctl.write(ARP_NOTIFY, value % 2)
    return sysctl.read(ACCEPT_RA), sysctl.read(ARP_NOTIFY)


def _read() -> tuple[str, str]:
    return sysctl.read(ACCEPT_RA), sysctl.read(ARP_NOTIFY)


def test_alternating_namespaces_each_see_their_own_values() -> None:
    with netns.Throwaway() as a, netns.Throwaway() as b:
        assert netns.run_in(a.path, _set_and_read, 0) == ("0", "0")
        assert netns.run_in(b.path, _set_and_read, 2) == ("2", "0")
        assert netns.run_in(a.path, _set_and_read, 1) == ("1", "1")
        assert netns.run_in(b.path, _read) == ("2", "0")
        # ensure writes only where the value differs, in the caller's namespace
        assert netns.run_in(b.path, sysctl.ensure, ACCEPT_RA, 2) is False
        assert netns.run_in(b.path, sysctl.ensure, ACCEPT_RA, 0) is True
        assert netns.run_in(a.path, _read) == ("1", "1")


def test_a_dead_namespaces_kept_directory_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace's inode number can be reused once it is gone; forced here: one key for all."""
    monkeypatch.setattr(sysctl, "namespace_key", lambda: (0, 0, 0))
    with netns.Throwaway() as a:
        assert netns.run_in(a.path, _set_and_read, 2) == ("2", "0")  # a's directories are kept
    with netns.Throwaway() as b:
        assert netns.run_in(b.path, _read) == ("1", "0")  # a new namespace's defaults, not a's (gone)
        assert netns.run_in(b.path, _set_and_read, 0) == ("0", "0")


def test_a_missing_entry_is_still_missing() -> None:
    with netns.Throwaway() as a, pytest.raises(FileNotFoundError):
        netns.run_in(a.path, sysctl.read, "net/ipv4/conf/no-such-if/arp_notify")


def test_kept_directories_are_bounded() -> None:
    with contextlib.ExitStack() as stack:
        for _ in range(sysctl._KEPT + 5):
            ns = stack.enter_context(netns.Throwaway())
            netns.run_in(ns.path, _read)
        assert len(sysctl._dirs) <= sysctl._KEPT * len(sysctl._SPLIT)

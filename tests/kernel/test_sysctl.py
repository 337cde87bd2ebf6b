"""``kernel.sysctl``: every access lands in the calling thread's namespace, through the
directories a socket-keeping thread keeps for its current namespace (``/proc/sys/net/ipv4``
and ``ipv6``), and never through a dead namespace's."""

from __future__ import annotations

import os
import time

import pytest

from pycni import netns
from pycni_plugins.kernel import sysctl
from tests.helpers.slow import scaled

pytestmark = pytest.mark.privileged

ACCEPT_RA = "net/ipv6/conf/lo/accept_ra"
ARP_NOTIFY = "net/ipv4/conf/lo/arp_notify"


@pytest.fixture(autouse=True)
def no_kept_directories() -> None:
    """Each test starts with the main thread keeping nothing (an earlier test's are closed)."""
    if sysctl._local.dirs is not None:
        sysctl._local.dirs.close()
        sysctl._local.dirs = None


def _set_and_read(value: int) -> tuple[str, str]:
    sysctl.write(ACCEPT_RA, value)
    sysctl.write(ARP_NOTIFY, value % 2)
    return sysctl.read(ACCEPT_RA), sysctl.read(ARP_NOTIFY)


def _lookup_works(dir_fd: int) -> bool:
    try:
        os.stat("conf", dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _read() -> tuple[str, str]:
    return sysctl.read(ACCEPT_RA), sysctl.read(ARP_NOTIFY)


def _in(path: str, fn: object, *args: object) -> object:
    """``fn`` in ``path`` from the test's main thread (it keeps its sockets, so its directories)."""
    with netns.entered(path):
        return fn(*args)  # type: ignore[operator]


def _proc_sys_fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/proc/sys/"):
            found.append(target)
    return found


def test_alternating_namespaces_each_see_their_own_values() -> None:
    with netns.Throwaway() as a, netns.Throwaway() as b:
        assert _in(a.path, _set_and_read, 0) == ("0", "0")
        assert _in(b.path, _set_and_read, 2) == ("2", "0")
        assert _in(a.path, _set_and_read, 1) == ("1", "1")
        assert _in(b.path, _read) == ("2", "0")
        # ensure writes only where the value differs, in the caller's namespace
        assert _in(b.path, sysctl.ensure, ACCEPT_RA, 2) is False
        assert _in(b.path, sysctl.ensure, ACCEPT_RA, 0) is True
        assert _in(a.path, _read) == ("1", "1")
        assert netns.run_in(b.path, _read) == ("0", "0")  # a thread that keeps nothing


def test_a_dead_namespaces_kept_directory_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace's inode number can be reused once it is gone; forced here: one key for all."""
    monkeypatch.setattr(sysctl, "namespace_key", lambda: (os.getpid(), 0, 0))
    with netns.Throwaway() as a:
        assert _in(a.path, _set_and_read, 2) == ("2", "0")  # a's directories are kept
    # The kernel frees a namespace (its sysctl tables, then its inode number) in a workqueue after
    # its last reference goes: a number is reused only once that is done, so wait for it too.
    kept = sysctl._local.dirs
    assert kept is not None and kept.fds
    deadline = time.monotonic() + scaled(10)
    while _lookup_works(next(iter(kept.fds.values()))):
        assert time.monotonic() < deadline, "namespace a's sysctl tables outlived it"
        time.sleep(0.01)
    with netns.Throwaway() as b:
        assert _in(b.path, _read) == ("1", "0")  # a new namespace's defaults, not a's (gone)
        assert _in(b.path, _set_and_read, 0) == ("0", "0")


def test_a_missing_entry_is_still_missing_and_keeps_the_directories() -> None:
    with netns.Throwaway() as a, pytest.raises(FileNotFoundError):
        _in(a.path, _read)
        kept = dict(sysctl._local.dirs.fds)
        try:
            _in(a.path, sysctl.read, "net/ipv4/conf/no-such-if/arp_notify")
        finally:
            assert sysctl._local.dirs.fds == kept  # not closed and reopened for a missing key


def test_a_namespace_visited_in_the_calling_thread_leaves_the_kept_directories_alone() -> None:
    with netns.Throwaway() as host, netns.Throwaway() as container:
        _in(host.path, _read)
        dirs, kept = sysctl._local.dirs, dict(sysctl._local.dirs.fds)
        # What bridge does for a container's interface: call_in, from the host's namespace.
        assert _in(host.path, netns.call_in, container.path, _set_and_read, 0) == ("0", "0")
        assert sysctl._local.dirs is dirs and dirs.fds == kept
        assert _in(host.path, _read) == ("1", "0")  # and the host's values are the host's


def test_only_a_keeping_thread_keeps_and_only_its_current_namespaces_two_directories() -> None:
    before = _proc_sys_fds()
    with netns.Throwaway() as a:
        netns.run_in(a.path, _set_and_read, 1)
        assert _proc_sys_fds() == before
        for _ in range(3):
            with netns.Throwaway() as other:
                _in(other.path, _read)
        kept = [t for t in _proc_sys_fds() if t not in before]
        assert sorted(t.removesuffix(" (deleted)") for t in kept) == ["/proc/sys/net/ipv4", "/proc/sys/net/ipv6"]


def test_a_read_gives_the_value_the_file_holds_stripped_without_a_file_object(monkeypatch: pytest.MonkeyPatch) -> None:
    # A file object costs an fstat, an ioctl and two lseeks per read; the value is the same.
    names = ["net/ipv4/ip_local_port_range", "net/ipv4/ip_forward", ACCEPT_RA, "kernel/ostype"]

    def by_file_object() -> dict[str, str]:
        values = {}
        for name in names:
            with open(f"/proc/sys/{name}") as f:
                values[name] = f.read().strip()
        return values

    asked: list[int] = []
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        asked.append(n)
        return real_read(fd, n)

    with netns.Throwaway() as a:
        expected = _in(a.path, by_file_object)
        monkeypatch.setattr(os, "fdopen", None)
        monkeypatch.setattr(os, "read", read)
        assert _in(a.path, lambda: {name: sysctl.read(name) for name in names}) == expected
    assert "\t" in expected["net/ipv4/ip_local_port_range"]  # type: ignore[index]
    # The kernel allocates and zeroes a buffer of the size asked (5 us more for 64 KiB).
    assert asked and max(asked) <= 4096

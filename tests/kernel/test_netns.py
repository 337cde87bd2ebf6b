"""The one netns helper: entering never creates, threads come back or die, liveness is real."""

from __future__ import annotations

import os
import threading

import pytest

from pycni import netns
from tests.conftest import TEST_NS_PREFIX

pytestmark = pytest.mark.privileged


def own() -> str:
    return os.readlink("/proc/thread-self/ns/net")


def test_run_in_runs_inside_and_leaves_the_caller_alone(make_netns):
    ns = make_netns("x")
    inside = netns.run_in(ns.path, own)
    assert inside != own()
    assert netns.run_in(ns.path, own) == inside


def test_entered_switches_the_calling_thread_and_switches_back(make_netns):
    ns = make_netns("x")
    before = own()
    with netns.entered(ns.path):
        inside = own()
        assert inside != before
        seen: list[str] = []
        worker = threading.Thread(target=lambda: seen.append(own()))
        worker.start()
        worker.join()
        assert seen == [inside], "threads started inside inherit the namespace"
    assert own() == before


def test_entered_restores_even_when_the_block_fails(make_netns):
    ns = make_netns("x")
    before = own()
    with pytest.raises(RuntimeError), netns.entered(ns.path):
        raise RuntimeError("boom")
    assert own() == before


def test_exceptions_come_back_from_the_worker_thread(make_netns):
    ns = make_netns("x")

    def fail() -> None:
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        netns.run_in(ns.path, fail)


def test_a_missing_namespace_is_an_error_and_is_never_created(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(netns.NetnsError) as e:
        netns.run_in(missing, own)
    assert e.value.errno == 2 and not os.path.exists(missing)
    with pytest.raises(netns.NetnsError), netns.entered(missing):
        pass
    assert not os.path.exists(missing)


def test_a_file_that_is_not_a_network_namespace_is_refused(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(netns.NetnsError, match="not a network namespace"):
        netns.run_in(str(plain), own)
    with pytest.raises(netns.NetnsError, match="not a network namespace"):
        netns.run_in("/proc/self/ns/mnt", own)


def test_is_netns_tells_a_live_namespace_from_its_leftover_mount_point(make_netns, tmp_path):
    ns = make_netns("x")
    assert netns.is_netns(ns.path) and netns.is_netns("/proc/self/ns/net")
    leftover = tmp_path / "was-a-netns"
    leftover.write_text("")  # what a bind-mount point looks like once unmounted (e.g. after a reboot)
    assert not netns.is_netns(str(leftover))
    assert not netns.is_netns("/proc/self/ns/mnt") and not netns.is_netns(str(tmp_path / "gone"))
    assert not netns.is_netns("")


def test_throwaway_removes_itself_even_on_failure():
    with pytest.raises(RuntimeError), netns.Throwaway(prefix=f"{TEST_NS_PREFIX}-self") as ns:
        path = ns.path
        assert netns.is_netns(path)
        raise RuntimeError("boom")
    assert not os.path.exists(path)


def test_a_bound_path_opens_the_bound_namespace_here_and_in_run_in_workers(make_netns, tmp_path):
    a, b = make_netns("a"), make_netns("b")
    fd = os.open(b.path, os.O_RDONLY)
    try:
        with netns.bound(a.path, fd):
            assert netns.identity(a.path) == netns.identity(b.path)
            assert netns.run_in(a.path, own) == netns.run_in(b.path, own)
            inner = netns.run_in(a.path, lambda: netns.identity(a.path))  # the binding goes with it
            assert inner == netns.identity(b.path)
        assert netns.run_in(a.path, own) != netns.run_in(b.path, own)
        gone = str(tmp_path / "gone")
        with netns.bound(gone, None, 2), pytest.raises(netns.NetnsError) as failed:
            netns.open_netns(gone)
        assert failed.value.errno == 2 and "No such file or directory" in str(failed.value)
    finally:
        os.close(fd)

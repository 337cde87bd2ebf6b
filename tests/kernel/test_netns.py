"""The one netns helper: entering never creates, threads come back or die, liveness is real."""

from __future__ import annotations

import errno
import json
import os
import threading
import time

import pytest

from pycni import netns
from pycni.errors import CNIError
from pycni.sdk import PluginRequest
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


def _in_thread(fn, limit: float):
    """``(finished, elapsed, outcome)`` of ``fn`` run in a daemon thread given ``limit`` seconds."""
    outcome: list[object] = []

    def body() -> None:
        try:
            outcome.append(fn())
        except BaseException as e:
            outcome.append(e)

    start = time.monotonic()
    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(limit)
    return not worker.is_alive(), time.monotonic() - start, outcome[0] if outcome else None


def _release(fifo: str) -> None:
    """Let an opener blocked on the FIFO through (what the old, blocking open needed)."""
    os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    try:
        for fn in (
            lambda: netns.open_netns(fifo),
            lambda: netns.run_in(fifo, own),
            lambda: netns.entered(fifo).__enter__(),
        ):
            done, elapsed, outcome = _in_thread(fn, 5.0)
            assert done and elapsed < 1.0, f"still blocked after {elapsed:.1f}s"
            assert isinstance(outcome, netns.NetnsError) and outcome.errno == errno.EINVAL, outcome
            assert "not a network namespace" in str(outcome)
        assert not netns.is_netns(fifo)
    finally:
        _release(fifo)


@pytest.mark.parametrize("backend", ["inprocess", "exec"])
def test_a_fifo_as_the_container_netns_fails_add_and_del_within_a_second(backend, host_ns, tmp_path, kit):
    from pycni.config import conflist_from_bytes
    from pycni.runtime import Runtime
    from pycni.runtime_conf import RuntimeConf
    from pycni_plugins.install import install

    bindir = tmp_path / "bin"
    install(str(bindir), ["loopback", "bridge", "host-local"])
    bridge = kit.bridge_conf(tmp_path, [{"subnet": "198.18.7.0/24"}])
    net = conflist_from_bytes(
        json.dumps({"cniVersion": "1.0.0", "name": "testnet", "plugins": [{"type": "loopback"}, bridge]}).encode()
    )
    runtime = Runtime([str(bindir)], cache_dir=str(tmp_path / "cache"), backend=backend, host_netns=host_ns.path)
    runtime.cache.lock_timeout = 1.0  # a lock left held by a stuck operation shows as an error, not a wait
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    rt = RuntimeConf("fifo", fifo)
    try:
        done, elapsed, outcome = _in_thread(lambda: runtime.add_network_list(net, rt), 10.0)
        assert done, "ADD blocked on the FIFO"
        assert isinstance(outcome, CNIError) and "not a network namespace" in str(outcome), outcome
        assert elapsed < 1.0, f"ADD took {elapsed:.2f}s"
        done, elapsed, outcome = _in_thread(lambda: runtime.delete_network_list(net, rt), 10.0)
        assert done and outcome is None, outcome  # nothing can be in a namespace that is none
        # DEL runs every plugin of the chain: within a second per exec'd plugin (each one's
        # interpreter start-up alone is a few hundred ms on a busy machine)
        calls = len(net.plugins) if backend == "exec" else 1
        assert elapsed < 1.0 * calls, f"DEL took {elapsed:.2f}s for {calls} plugin call(s)"
        assert [n for n in os.listdir(tmp_path / "ipam" / "testnet") if n[0].isdigit()] == []
    finally:
        for _ in range(10):
            _release(fifo)


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


class _Recording:
    """A backend whose plugins only note the namespace they ran in (and fail when told to)."""

    name = "recording"

    def __init__(self, fail: str = "") -> None:
        self.ran: list[tuple[str, str, str]] = []
        self.fail = fail

    def find(self, plugin_type: str, paths: object) -> str:
        return plugin_type

    def run(self, plugin_type: str, request: PluginRequest) -> dict[str, object] | None:
        command = request.command
        self.ran.append((plugin_type, command, own()))
        if command == "ADD" and plugin_type == self.fail:
            raise CNIError("told to fail", code=11)
        return {"cniVersion": "1.0.0"} if command == "ADD" else None

    def is_builtin(self, plugin_type: str) -> bool:
        return False

    def validate(self, plugin_type: str, request: object) -> None:
        return None

    def version_info(self, plugin_type: str, paths: object) -> object:
        raise AssertionError("not asked")


def _recording_runtime(tmp_path, host: str, backend: _Recording):  # type: ignore[no-untyped-def]
    from pycni.config import conflist_from_bytes
    from pycni.runtime import Runtime

    plugins = [{"type": t} for t in ("a", "b", "c")]
    net = conflist_from_bytes(json.dumps({"cniVersion": "1.0.0", "name": "n", "plugins": plugins}).encode())
    return Runtime([], cache_dir=str(tmp_path / "cache"), backend=backend, host_netns=host), net


def test_one_operation_enters_the_host_namespace_once_for_all_its_plugins(make_netns, tmp_path, monkeypatch):
    from pycni.runtime_conf import RuntimeConf

    host, container = make_netns("host"), make_netns("c")
    backend = _Recording()
    runtime, net = _recording_runtime(tmp_path, host.path, backend)
    entered_host = netns.run_in(host.path, own)
    setns: list[int] = []
    real = netns._setns
    monkeypatch.setattr(netns, "_setns", lambda fd, what: (setns.append(fd), real(fd, what))[1])
    before = own()
    runtime.add_network_list(net, RuntimeConf("c1", container.path))
    assert [(t, c) for t, c, _ in backend.ran] == [("a", "ADD"), ("b", "ADD"), ("c", "ADD")]
    assert {ns for _, _, ns in backend.ran} == {entered_host}
    assert len(setns) == 2 and own() == before  # in once, out once, back where it was
    runtime.delete_network_list(net, RuntimeConf("c1", container.path))
    assert [c for _, c, _ in backend.ran[3:]] == ["DEL"] * 3 and len(setns) == 4 and own() == before


def test_a_failed_operation_with_rollback_leaves_the_host_namespace_too(make_netns, tmp_path):
    from pycni.runtime_conf import RuntimeConf

    host, container = make_netns("host"), make_netns("c")
    backend = _Recording(fail="b")
    runtime, net = _recording_runtime(tmp_path, host.path, backend)
    before = own()
    with pytest.raises(CNIError, match="told to fail"):
        runtime.add_network_list(net, RuntimeConf("c1", container.path), rollback=True)
    assert [(t, c) for t, c, _ in backend.ran] == [("a", "ADD"), ("b", "ADD"), ("b", "DEL"), ("a", "DEL")]
    assert {ns for _, _, ns in backend.ran} == {netns.run_in(host.path, own)}
    assert own() == before


def test_a_host_namespace_path_pointed_elsewhere_between_operations_is_followed(make_netns, tmp_path):
    from pycni.runtime_conf import RuntimeConf

    first, second, container = make_netns("h1"), make_netns("h2"), make_netns("c")
    link = tmp_path / "host"
    link.symlink_to(first.path)
    backend = _Recording()
    runtime, net = _recording_runtime(tmp_path, str(link), backend)
    runtime.add_network_list(net, RuntimeConf("c1", container.path))
    link.unlink()
    link.symlink_to(second.path)
    runtime.delete_network_list(net, RuntimeConf("c1", container.path))
    assert [ns for _, _, ns in backend.ran] == [netns.run_in(first.path, own)] * 3 + [
        netns.run_in(second.path, own)
    ] * 3


def _stat_identity() -> tuple[int, int]:
    st = os.stat("/proc/thread-self/ns/net")
    return st.st_dev, st.st_ino


def test_nested_entered_blocks_come_back_through_the_outer_blocks_fd(make_netns, monkeypatch):
    a, b = make_netns("a"), make_netns("b")
    before = own()
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *r, **k: (opened.append(str(p)), real_open(p, *r, **k))[1])
    with netns.entered(a.path):
        in_a = own()
        with netns.entered(b.path):
            in_b = own()
            with netns.entered(a.path):
                assert own() == in_a
            assert own() == in_b
        with pytest.raises(RuntimeError), netns.entered(b.path):
            raise RuntimeError("boom")
        assert own() == in_a
    assert own() == before and len({before, in_a, in_b}) == 3
    assert opened.count("/proc/thread-self/ns/net") == 1  # the outermost block only


def test_own_identity_is_the_threads_namespace_inside_and_outside_entered_blocks(make_netns):
    a, b = make_netns("a"), make_netns("b")
    assert netns.own_identity() == _stat_identity()
    with netns.entered(a.path):
        assert netns.own_identity() == _stat_identity() == netns.identity(a.path)
        with netns.entered(b.path):
            assert netns.own_identity() == _stat_identity() == netns.identity(b.path)
            seen: list[tuple[int, int]] = []
            worker = threading.Thread(target=lambda: seen.append(netns.own_identity()))
            worker.start()
            worker.join()
            assert seen == [netns.identity(b.path)]  # a new thread starts in b and finds it out itself
        assert netns.own_identity() == _stat_identity() == netns.identity(a.path)
        assert netns.run_in(b.path, netns.own_identity) == netns.identity(b.path)
    assert netns.own_identity() == _stat_identity()

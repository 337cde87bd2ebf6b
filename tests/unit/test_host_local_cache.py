"""host-local's in-process lease cache: warm operations read O(changes), and the cache is never stale.

The cache (``pycni_plugins.host_local.lease_cache``) keeps each network directory's lease
contents in memory, kept exact with inotify. These tests change the directory behind its back
(another Python process, plain file operations, delete + recreate on a reused inode, in-place
rewrites, a replaced directory, queue overflow, fork) and check that the next operation sees
the change, that a stale entry can never release or refuse someone else's lease, and that a
warm ADD/DEL does not read the whole directory. The Go binary's side is in
``tests/kernel/test_host_local_interop.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pycni.errors import CNIError
from pycni.sdk import PluginRequest
from pycni_plugins.host_local import HostLocalPlugin
from pycni_plugins.host_local import lease_cache as hl_cache
from pycni_plugins.host_local.disk import DiskStore

NET = "cachenet"
PLUGIN = HostLocalPlugin()
REPO = Path(__file__).resolve().parents[2]


def make_conf(data_dir: Path, subnet: str = "10.0.0.0/24") -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": NET,
        "type": "bridge",
        "ipam": {"type": "host-local", "dataDir": str(data_dir), "subnet": subnet},
    }


def run(command: str, conf: dict, cid: str = "ctr1", ifname: str = "eth0", args: str = "") -> Any:
    request = PluginRequest(
        command=command, config=conf, container_id=cid, netns="/run/netns/x", ifname=ifname, args=args
    )
    return PLUGIN.handle(request)


def add(conf: dict, cid: str = "ctr1", ifname: str = "eth0", args: str = "") -> str:
    return run("ADD", conf, cid, ifname, args)["ips"][0]["address"].split("/")[0]


def msg_of(command: str, conf: dict, cid: str = "ctr1", **kw: Any) -> str:
    with pytest.raises(CNIError) as info:
        run(command, conf, cid, **kw)
    return info.value.msg


def leases(data_dir: Path) -> dict[str, bytes]:
    net = data_dir / NET
    return {p.name: p.read_bytes() for p in net.iterdir() if p.name != "lock" and not p.name.startswith("last_")}


def entry_of(data_dir: Path) -> hl_cache.Leases:
    """The cache entry of the network dir (the one of the last directory the process used)."""
    st = os.stat(data_dir / NET)
    watcher = hl_cache._watcher
    assert watcher is not None
    entry = watcher.dirs[(st.st_dev, st.st_ino)]
    assert entry.alive
    return entry


def synced(data_dir: Path) -> dict[str, bytes]:
    """The cache after a CHECK made it catch up, as name -> content."""
    try:
        run("CHECK", make_conf(data_dir), "nobody")
    except CNIError:
        pass
    return dict(entry_of(data_dir).content)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "networks"


@pytest.fixture(autouse=True)
def cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache as a long-lived process has it: on, past the first store of the process."""
    monkeypatch.setattr(hl_cache, "_CACHE_LEASES", True)
    monkeypatch.setattr(hl_cache, "_stores_opened", max(hl_cache._stores_opened, 2))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts full directory reads and single-file reads."""
    counts: Counter[str] = Counter()
    lease_files, read = DiskStore.lease_files, DiskStore._read

    def counting_lease_files(self: Any) -> Any:
        counts["directory"] += 1
        return lease_files(self)

    def counting_read(self: Any, name: str, limit: int | None = None) -> Any:
        counts["file"] += 1
        return read(self, name, limit)

    monkeypatch.setattr(DiskStore, "lease_files", counting_lease_files)
    monkeypatch.setattr(DiskStore, "_read", counting_read)
    return counts


CHILD = """
import json, sys
from pycni.errors import CNIError
from pycni.sdk import PluginRequest
from pycni_plugins import host_local
from pycni_plugins.host_local import lease_cache as hl_cache

conf = json.loads(sys.argv[1])
out = []
for command, cid, args in json.loads(sys.argv[2]):
    request = PluginRequest(command=command, config=conf, container_id=cid, netns="/x", ifname="eth0", args=args)
    try:
        out.append(host_local.HostLocalPlugin().handle(request))
    except CNIError as e:
        out.append({"msg": e.msg})
print(json.dumps({"results": out, "inotify": hl_cache._watcher is not None}))
"""


def other_process(conf: dict, *ops: tuple[str, str, str]) -> dict:
    """Run operations in one fresh Python process, as another long-lived runtime would."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(conf), json.dumps(ops)],
        capture_output=True,
        check=True,
        cwd=REPO,
        timeout=60,
    )
    return json.loads(proc.stdout)


def one_shot_processes(conf: dict, *ops: tuple[str, str, str]) -> list[Any]:
    """Run each operation in its own fresh process, as exec'd pycni plugins do; none sets up the cache."""
    results = []
    for op in ops:
        out = other_process(conf, op)
        assert out["inotify"] is False
        results += out["results"]
    return results


# --- the cache is used, and bounded --------------------------------------------------------------


def test_warm_add_and_del_read_no_more_than_the_changed_files(data_dir: Path, reads: Counter[str]) -> None:
    conf = make_conf(data_dir, "10.0.0.0/22")
    for i in range(300):
        add(conf, f"other{i}")
    add(conf, "warm")
    run("DEL", conf, "warm")
    reads.clear()
    for i in range(20):
        add(conf, f"c{i}")
        run("DEL", conf, f"c{i}")
    assert reads["directory"] == 0
    # per ADD: last_reserved_ip (the previous DEL's name is gone: lstat only); per DEL: the new
    # lease (its events), then the verification of the match
    assert reads["file"] == 20 * 3, reads
    assert len(synced(data_dir)) == 300


def test_the_first_operation_of_a_directory_reads_it_once(data_dir: Path, reads: Counter[str]) -> None:
    conf = make_conf(data_dir)
    (data_dir / NET).mkdir(parents=True)
    for i in range(2, 12):
        (data_dir / NET / f"10.0.0.{i}").write_bytes(f"pre{i}\r\neth0".encode())
    assert add(conf) == "10.0.0.12"
    run("CHECK", conf)
    run("DEL", conf)
    assert reads["directory"] == 1


def test_the_cache_holds_one_entry_per_lease(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    for i in range(10):
        add(conf, f"c{i}")
    (data_dir / NET / "junk").mkdir()
    os.symlink("/etc/passwd", data_dir / NET / "10.0.0.200")
    (data_dir / NET / "big").write_bytes(b"x" * 5000)  # read whole, as Go reads it
    leases = {f"10.0.0.{i + 2}": f"c{i}\r\neth0".encode() for i in range(10)}
    assert synced(data_dir) == leases | {"big": b"x" * 5000}
    os.unlink(data_dir / NET / "big")
    for i in range(10):
        run("DEL", conf, f"c{i}")
    entry = entry_of(data_dir)
    synced(data_dir)
    assert entry.content == {}
    assert entry.holders == {}


def test_directories_beyond_the_limit_are_evicted_and_still_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hl_cache, "_MAX_DIRS", 3)
    confs = [make_conf(tmp_path / f"d{i}") for i in range(5)]
    for conf in confs:
        add(conf, "a")
    watcher = hl_cache._watcher
    assert watcher is not None
    assert len(watcher.dirs) <= 3
    assert len(watcher.by_wd) == len(watcher.dirs)
    # d0 was evicted: a change made while nobody watched it is still seen.
    (tmp_path / "d0" / NET / "10.0.0.2").write_bytes(b"b\r\neth0")
    run("CHECK", confs[0], "b")
    assert msg_of("CHECK", confs[0], "a").startswith("host-local: Failed to find")


def test_many_unread_changes_fall_back_to_one_full_read(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, reads: Counter[str]
) -> None:
    monkeypatch.setattr(hl_cache, "_MAX_DIRTY", 5)
    conf = make_conf(data_dir)
    add(conf, "a")
    for i in range(10, 30):
        (data_dir / NET / f"10.0.0.{i}").write_bytes(f"x{i}".encode())
    reads.clear()
    run("CHECK", conf, "a")
    assert reads["directory"] == 1
    assert len(entry_of(data_dir).content) == 21


# --- changes made behind the cache's back are seen -------------------------------------------------


def test_leases_made_and_removed_by_another_process_are_seen(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "mine")
    run("CHECK", conf, "mine")  # warm
    results = one_shot_processes(
        conf, ("ADD", "theirs", ""), ("ADD", "gone", ""), ("DEL", "gone", ""), ("DEL", "mine", "")
    )
    assert results[:2] == [
        {"cniVersion": "1.0.0", "ips": [{"address": f"10.0.0.{i}/24", "gateway": "10.0.0.1"}]} for i in (3, 4)
    ]
    run("CHECK", conf, "theirs")
    assert msg_of("ADD", conf, "theirs").endswith(
        "10.0.0.3 has been allocated to theirs, duplicate allocation is not allowed"
    )
    assert msg_of("CHECK", conf, "gone").startswith("host-local: Failed to find")
    assert msg_of("CHECK", conf, "mine").startswith("host-local: Failed to find")
    assert add(conf, "mine") == "10.0.0.5"
    run("DEL", conf, "theirs")
    assert leases(data_dir) == {"10.0.0.5": b"mine\r\neth0"}


def test_our_leases_are_seen_and_released_by_another_process(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    for cid in ("a", "b", "c"):
        add(conf, cid)
    out = other_process(conf, ("CHECK", "b", ""), ("ADD", "b", ""), ("DEL", "b", ""), ("CHECK", "b", ""))
    assert out["inotify"] is True  # a long-lived process: its own cache
    assert out["results"][0] is None
    assert out["results"][1]["msg"].endswith("duplicate allocation is not allowed")
    assert out["results"][3]["msg"].startswith("host-local: Failed to find")
    assert msg_of("CHECK", conf, "b").startswith("host-local: Failed to find")
    assert add(conf, "d") == "10.0.0.5"


def _recreate_on_its_inode(path: Path, content: bytes, spare: Path) -> None:
    """Delete ``path`` and create it again with ``content`` on the inode number it had, as ext4
    often does: a second link outside the watched directory keeps the inode while the name is
    gone (so the scenario does not depend on the filesystem reusing inode numbers)."""
    old = path.stat().st_ino
    os.link(path, spare)
    path.unlink()
    spare.write_bytes(content)  # truncated and rewritten in place: the same inode
    os.link(spare, path)
    spare.unlink()
    assert path.stat().st_ino == old


def test_delete_and_recreate_with_a_new_owner_on_a_reused_inode(data_dir: Path, tmp_path: Path) -> None:
    """The (name, inode) of a lease does not change, its owner does: the cache must follow the owner."""
    conf = make_conf(data_dir)
    assert add(conf, "a", args="IP=10.0.0.50") == "10.0.0.50"
    add(conf, "keep")
    run("CHECK", conf, "a")  # warm, caching a as the owner of 10.0.0.50
    # another runtime: DEL a, ADD b IP=.50
    _recreate_on_its_inode(data_dir / NET / "10.0.0.50", b"b\r\neth0", tmp_path / "spare")
    run("DEL", conf, "a")  # must not touch b's lease
    assert leases(data_dir)["10.0.0.50"] == b"b\r\neth0"
    run("CHECK", conf, "b")
    assert msg_of("ADD", conf, "b").startswith("failed to allocate for range 0: 10.0.0.50 has been allocated to b")
    run("DEL", conf, "b")  # a missed release here would leak .50 for good
    assert leases(data_dir) == {"10.0.0.51": b"keep\r\neth0"}
    assert add(conf, "c", args="IP=10.0.0.50") == "10.0.0.50"


def test_an_in_place_rewrite_is_seen(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    run("CHECK", conf, "a")
    with open(data_dir / NET / "10.0.0.2", "r+b") as f:  # same inode, same name, new content
        f.truncate()
        f.write(b"z\r\neth0")
    run("CHECK", conf, "z")  # the new owner first: verifying a's hit would correct the entry by chance
    assert msg_of("ADD", conf, "z").endswith("10.0.0.2 has been allocated to z, duplicate allocation is not allowed")
    assert msg_of("CHECK", conf, "a").startswith("host-local: Failed to find")
    run("DEL", conf, "z")
    assert leases(data_dir) == {}


def test_renames_into_and_out_of_the_directory_are_seen(data_dir: Path, tmp_path: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    run("CHECK", conf, "a")
    outside = tmp_path / "parked"
    os.rename(data_dir / NET / "10.0.0.2", outside)
    assert msg_of("CHECK", conf, "a").startswith("host-local: Failed to find")
    os.rename(outside, data_dir / NET / "10.0.0.9")
    run("CHECK", conf, "a")
    run("DEL", conf, "a")
    assert leases(data_dir) == {}


def test_legacy_files_written_by_hand_are_seen(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "other")
    run("CHECK", conf, "other")
    (data_dir / NET / "10.0.0.9").write_bytes(b"ctr1\n")
    run("CHECK", conf)
    assert msg_of("ADD", conf).endswith("10.0.0.9 has been allocated to ctr1, duplicate allocation is not allowed")
    run("DEL", conf)
    assert list(leases(data_dir)) == ["10.0.0.2"]


def test_a_replaced_directory_is_not_confused_with_the_old_one(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    add(conf, "b")
    run("CHECK", conf, "a")
    net = data_dir / NET
    for name in os.listdir(net):
        os.unlink(net / name)
    os.rmdir(net)
    net.mkdir()  # on ext4 this often gets the old directory's inode number back
    (net / "10.0.0.7").write_bytes(b"c\r\neth0")
    assert msg_of("CHECK", conf, "a").startswith("host-local: Failed to find")
    run("CHECK", conf, "c")
    assert add(conf, "d") == "10.0.0.2"
    assert synced(data_dir) == {"10.0.0.7": b"c\r\neth0", "10.0.0.2": b"d\r\neth0"}


def test_two_paths_to_one_directory_share_one_cache(data_dir: Path, tmp_path: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    alias = tmp_path / "alias"
    alias.symlink_to(data_dir)  # a symlink above the network dir is allowed
    via_alias = make_conf(alias)
    run("CHECK", via_alias, "a")
    assert add(via_alias, "b") == "10.0.0.3"
    watcher = hl_cache._watcher
    assert watcher is not None
    st = os.stat(data_dir / NET)
    assert sum(key == (st.st_dev, st.st_ino) for key in watcher.dirs) == 1
    run("DEL", conf, "b")
    assert msg_of("CHECK", via_alias, "b").startswith("host-local: Failed to find")


def test_a_queue_overflow_makes_the_next_operation_read_everything(data_dir: Path, reads: Counter[str]) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    run("CHECK", conf, "a")
    watcher = hl_cache._watcher
    assert watcher is not None
    # Changes whose events are lost: the kernel says so with one IN_Q_OVERFLOW (wd -1).
    with watcher.mutex:
        watcher._drain()  # swallow their events as if the queue had overflowed
    (data_dir / NET / "10.0.0.2").write_bytes(b"b\r\neth0")
    with watcher.mutex:
        watcher._drain()
        watcher.dispatch(hl_cache._EVENT.pack(-1, hl_cache._IN_Q_OVERFLOW, 0, 0))
    reads.clear()
    run("CHECK", conf, "b")
    assert reads["directory"] == 1
    assert msg_of("CHECK", conf, "a").startswith("host-local: Failed to find")


def test_a_lost_watch_drops_the_entry(data_dir: Path, reads: Counter[str]) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    entry = entry_of(data_dir)
    watcher = hl_cache._watcher
    assert watcher is not None
    with watcher.mutex:
        watcher.dispatch(hl_cache._EVENT.pack(entry.wd, hl_cache._IN_IGNORED, 0, 0))
    assert not entry.alive
    reads.clear()
    run("CHECK", conf, "a")
    assert reads["directory"] == 1


# --- a stale entry can never release or refuse someone else's lease ------------------------------


def _poison(data_dir: Path, name: str, content: bytes) -> None:
    """Make the cache wrong about ``name`` without any event to correct it (a writer ignoring the lock)."""
    synced(data_dir)
    entry_of(data_dir).set(name, content)


def test_a_stale_owner_never_causes_a_wrong_release(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "b")
    _poison(data_dir, "10.0.0.2", b"a\r\neth0")
    run("DEL", conf, "a")
    assert leases(data_dir) == {"10.0.0.2": b"b\r\neth0"}
    assert entry_of(data_dir).content == {"10.0.0.2": b"b\r\neth0"}  # corrected on the way


def test_a_stale_owner_never_causes_a_false_duplicate_or_check(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "b")
    _poison(data_dir, "10.0.0.2", b"a\r\neth0")
    assert msg_of("CHECK", conf, "a").startswith("host-local: Failed to find")
    _poison(data_dir, "10.0.0.2", b"a\r\neth0")
    assert add(conf, "a") == "10.0.0.3"


def test_a_stale_taken_hint_only_skips_an_address(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    _poison(data_dir, "10.0.0.3", b"ghost\r\neth0")  # not on disk
    assert add(conf, "b") == "10.0.0.4"
    assert leases(data_dir) == {"10.0.0.2": b"a\r\neth0", "10.0.0.4": b"b\r\neth0"}


def test_a_stale_taken_hint_never_makes_a_range_look_exhausted(data_dir: Path) -> None:
    conf = make_conf(data_dir, "10.0.0.0/29")  # .2 - .6
    for i in range(4):
        add(conf, f"c{i}")
    _poison(data_dir, "10.0.0.6", b"ghost\r\neth0")  # the one free address, wrongly cached as taken
    assert add(conf, "last") == "10.0.0.6"
    assert msg_of("ADD", conf, "more").endswith("no IP addresses available in range set: 10.0.0.1-10.0.0.6")


def test_a_failed_full_read_is_retried(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    with hl_cache._watcher.mutex:  # type: ignore[union-attr]
        hl_cache._watcher._overflow()  # type: ignore[union-attr]
    lease_files = DiskStore.lease_files

    def failing(self: Any) -> Any:
        yield from list(lease_files(self))[:0]
        raise OSError(5, "I/O error")

    monkeypatch.setattr(DiskStore, "lease_files", failing)
    with pytest.raises(OSError):
        run("CHECK", conf, "a")
    monkeypatch.setattr(DiskStore, "lease_files", lease_files)
    run("CHECK", conf, "a")
    assert entry_of(data_dir).content == {"10.0.0.2": b"a\r\neth0"}


# --- no inotify: every operation reads the directory, as before ----------------------------------


def test_without_a_watch_the_directory_is_read_every_time(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, reads: Counter[str]
) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    monkeypatch.setattr(hl_cache.Watcher, "entry", lambda self, store: None)  # e.g. ENOSPC on add_watch
    reads.clear()
    run("CHECK", conf, "a")
    add(conf, "b")
    run("DEL", conf, "a")
    assert reads["directory"] == 3
    assert leases(data_dir) == {"10.0.0.3": b"b\r\neth0"}


def test_without_inotify_the_directory_is_read_every_time(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, reads: Counter[str]
) -> None:
    monkeypatch.setattr(hl_cache, "_watcher", None)
    monkeypatch.setattr(hl_cache, "_watcher_failed_at", float("-inf"))

    def no_inotify() -> None:
        raise OSError(24, "Too many open files")  # fs.inotify.max_user_instances reached

    monkeypatch.setattr(hl_cache, "Watcher", no_inotify)
    conf = make_conf(data_dir)
    add(conf, "a")
    add(conf, "b")
    run("DEL", conf, "a")
    assert reads["directory"] == 3
    assert hl_cache._watcher is None
    assert leases(data_dir) == {"10.0.0.3": b"b\r\neth0"}


# --- concurrency -----------------------------------------------------------------------------------


def test_threads_on_a_warm_cache_allocate_distinct_ips_and_release_exactly(data_dir: Path) -> None:
    conf = make_conf(data_dir, "10.0.0.0/22")
    for i in range(50):
        add(conf, f"pre{i}")
    barrier = threading.Barrier(16)
    got: dict[str, str] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        barrier.wait()
        try:
            for i in range(10):
                cid = f"t{t}-{i}"
                got[cid] = add(conf, cid)
                if i % 2:
                    run("DEL", conf, cid)
                    del got[cid]
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(got) == 80
    assert len(set(got.values())) == 80
    on_disk = leases(data_dir)
    assert {ip: on_disk[ip] for ip in got.values()} == {ip: f"{cid}\r\neth0".encode() for cid, ip in got.items()}
    assert len(on_disk) == 130
    assert synced(data_dir) == {name: content.strip() for name, content in on_disk.items()}


def _forked_worker(conf: dict, prefix: str, count: int, start: Any) -> list[str]:
    start.wait()
    got = []
    for i in range(count):
        got.append(add(conf, f"{prefix}-{i}"))
        if i % 3 == 0:
            run("DEL", conf, f"{prefix}-{i}")
            got.pop()
    return got


def test_forked_children_and_threads_share_a_directory_with_a_warm_parent(data_dir: Path) -> None:
    """Children inherit the parent's inotify fd: if they read it, the parent's cache goes stale."""
    conf = make_conf(data_dir, "10.0.0.0/22")
    for i in range(20):
        add(conf, f"parent{i}")
    run("CHECK", conf, "parent0")
    ctx = multiprocessing.get_context("fork")
    start = ctx.Manager().Event()
    parent_ips: list[str] = []
    with ctx.Pool(4) as pool:
        pending = [pool.apply_async(_forked_worker, (conf, f"p{n}", 24, start)) for n in range(4)]
        thread = threading.Thread(target=lambda: parent_ips.extend(add(conf, f"pt{i}") for i in range(24)))
        start.set()
        thread.start()
        child_ips = [ip for job in pending for ip in job.get(timeout=120)]
        thread.join()
    ips = child_ips + parent_ips
    assert len(ips) == 4 * 16 + 24
    assert len(set(ips)) == len(ips)
    on_disk = leases(data_dir)
    assert len(on_disk) == 20 + len(ips)
    assert synced(data_dir) == {name: content.strip() for name, content in on_disk.items()}
    for n in range(4):  # the parent releases what the children made
        for i in range(24):
            run("DEL", conf, f"p{n}-{i}")
    assert len(leases(data_dir)) == 20 + 24


def test_a_forked_child_gets_its_own_inotify_instance(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "a")
    parent = hl_cache._watcher
    assert parent is not None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            fresh = hl_cache._watcher is None
            add(conf, "child")
            child = hl_cache._watcher
            ok = fresh and child is not None and child is not parent and child.pid == os.getpid()
            os.write(write_end, b"ok" if ok else b"bad")
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    assert os.read(read_end, 16) == b"ok"
    os.close(read_end)
    assert status == 0
    assert hl_cache._watcher is parent
    run("CHECK", conf, "child")
    assert synced(data_dir) == {"10.0.0.2": b"a\r\neth0", "10.0.0.3": b"child\r\neth0"}


def test_processes_with_their_own_caches_allocate_distinct_ips(data_dir: Path) -> None:
    conf = make_conf(data_dir, "10.0.0.0/22")
    add(conf, "warm")
    ops = [("ADD", f"x{i}", "") for i in range(15)] + [("DEL", f"x{i}", "") for i in range(0, 15, 2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(conf), json.dumps([(c, f"{n}-{cid}", a) for c, cid, a in ops])],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        for n in range(4)
    ]
    mine = [add(conf, f"me{i}") for i in range(15)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(out["inotify"] for out in outs)  # several operations per process: each used its cache
    theirs = [r["ips"][0]["address"].split("/")[0] for out in outs for i, r in enumerate(out["results"][:15]) if i % 2]
    kept = mine + theirs + ["10.0.0.2"]
    assert len(set(kept)) == len(kept)
    assert set(leases(data_dir)) == set(kept)
    assert synced(data_dir) == {name: content.strip() for name, content in leases(data_dir).items()}

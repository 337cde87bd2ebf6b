"""The one atomic write (cache entries, plugin state records, shims): old or new, never a part;
durable but for the state records."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pycni import _fs
from pycni.cache import CachedAttachment, ResultsCache
from pycni_plugins.install import install
from pycni_plugins.kernel.state import Records


@pytest.fixture
def dir_fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_reader_sees_the_old_or_the_new_content_never_a_part(tmp_path: Path, dir_fd: int) -> None:
    contents = [b"a" * 300_000, b"b" * 200_000]
    _fs.write_atomic(dir_fd, "f", contents[0])
    done = threading.Event()
    seen: set[bytes] = set()

    def read() -> None:
        while not done.is_set():
            seen.add((tmp_path / "f").read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(40):
            _fs.write_atomic(dir_fd, "f", contents[i % 2])
    finally:
        done.set()
        reader.join()
    assert seen <= set(contents) and seen


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temp_file(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fs.write_atomic(dir_fd, "f", b"old")
    real_write = os.write

    def half_then_fail(fd: int, data: Any) -> int:
        real_write(fd, bytes(data[:2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        _fs.write_atomic(dir_fd, "f", b"new content")
    assert (tmp_path / "f").read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_the_data_is_fsynced_before_the_rename_and_the_directory_after(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[str, bool]] = []  # (what, whether the name is in place yet)
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append(("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file", (tmp_path / "f").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    _fs.write_atomic(dir_fd, "f", b"x")
    assert synced == [("file", False), ("dir", True)]


@pytest.mark.parametrize(
    ("write", "synced"),
    [
        # What outlives a reboot: the file before its rename, the directory after.
        pytest.param(
            lambda root, i: ResultsCache(str(root)).write(CachedAttachment(f"c{i}", "net", "eth0")),
            ["file", "dir"],
            id="cache entry",
        ),
        pytest.param(lambda root, i: install(str(root), ["loopback"], force=True), ["file", "dir"], id="plugin shim"),
        # The plugins' state records describe kernel state a reboot wipes: never synced.
        pytest.param(lambda root, i: Records("r", root=str(root)).store(f"n{i}", {"a": 1}), [], id="state store"),
        pytest.param(lambda root, i: Records("r", root=str(root)).create(f"n{i}", {"a": 1}), [], id="state create"),
    ],
)
def test_the_cache_and_installed_plugins_are_written_durably_and_state_records_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: Any, synced: list[str]
) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    write(root, 0)  # makes the directories (durably, once: see the next test)
    kinds: list[str] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        kinds.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    write(root, 1)
    assert kinds == synced


def test_every_directory_made_for_records_is_durable_in_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            synced.append((st.st_dev, st.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    Records("r", root=str(tmp_path / "a" / "b")).store("n", {})
    ResultsCache(str(tmp_path / "c" / "d")).write(CachedAttachment("c", "net", "eth0"))

    def ident(p: Path) -> tuple[int, int]:
        st = p.stat()
        return st.st_dev, st.st_ino

    made = ["a", "a/b", "a/b/r", "c", "c/d", "c/d/results"]
    for m in made:  # each new entry synced in its parent after it was made
        assert ident((tmp_path / m).parent) in synced, m


def test_exclusive_keeps_the_first_writers_content(tmp_path: Path, dir_fd: int) -> None:
    assert _fs.write_atomic(dir_fd, "f", b"first", exclusive=True) is True
    assert _fs.write_atomic(dir_fd, "f", b"second", exclusive=True) is False
    assert (tmp_path / "f").read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["f"]


def test_temp_files_are_named_without_randomness_and_a_name_already_there_is_passed_by(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open = os.open

    def record(path: str, *args: Any, **kw: Any) -> int:
        opened.append(path)
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", record)
    _fs.write_atomic(dir_fd, "f", b"1")
    _fs.write_atomic(dir_fd, "f", b"2")
    first, second = opened
    assert first.startswith(f".{os.getpid()}.") and first != second
    # The next name planted (a symlink, even): not followed, not touched; a random name instead.
    pid, number = second.split(".")[1:3]
    planted = f".{pid}.{int(number) + 1}.tmp"
    os.symlink(tmp_path / "elsewhere", tmp_path / planted)
    _fs.write_atomic(dir_fd, "f", b"3")
    assert (tmp_path / "f").read_bytes() == b"3"
    assert opened[-2] == planted and len(opened[-1]) == len(".0123456789abcdef.tmp")
    assert sorted(os.listdir(tmp_path)) == sorted([planted, "f"]) and not (tmp_path / "elsewhere").exists()


def test_threads_writing_at_once_never_share_a_temp_file(tmp_path: Path, dir_fd: int) -> None:
    def write(t: int) -> None:
        for i in range(200):
            _fs.write_atomic(dir_fd, f"t{t}", f"{t}.{i}".encode())

    threads = [threading.Thread(target=write, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(os.listdir(tmp_path)) == sorted(f"t{t}" for t in range(8))
    assert all((tmp_path / f"t{t}").read_bytes() == f"{t}.199".encode() for t in range(8))


def test_a_forked_child_names_its_temp_files_by_its_own_pid(tmp_path: Path, dir_fd: int) -> None:
    _fs.write_atomic(dir_fd, "parent", b"p")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            real_open = os.open
            names: list[str] = []

            def record(path: str, *args: Any, **kw: Any) -> int:
                names.append(path)
                return real_open(path, *args, **kw)

            os.open = record  # type: ignore[assignment]
            _fs.write_atomic(dir_fd, "child", b"c")
            os.write(write, names[0].encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        name = f.read().decode()
    os.waitpid(pid, 0)
    assert name.startswith(f".{pid}.")
    assert (tmp_path / "child").read_bytes() == b"c"


def test_the_mode_is_exact_whatever_the_umask(tmp_path: Path, dir_fd: int) -> None:
    old = os.umask(0o077)
    try:
        _fs.write_atomic(dir_fd, "shim", b"#!/bin/sh\n", mode=0o755)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shim").stat().st_mode) == 0o755


@pytest.mark.privileged
@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ("0755 dirs of ours under /tmp", None),
        ("nested sticky 1777 dirs", None),
        ("a 0777 ancestor", "{a} is writable by group or others (mode 0777)"),
        ("an ancestor owned by nobody", "{a} is owned by uid 65534, neither root nor 0"),
        ("a group-writable target", "{t} is writable by group or others (mode 0775)"),
        ("a sticky target", "{t} is writable by group or others (mode 1777)"),
        ("a symlink to a weak dir", "{a} is writable by group or others (mode 0777)"),
    ],
)
def test_unsafe_ancestor_judges_every_directory_up_to_the_root_as_sshd_does(
    tmp_path: Path, layout: str, why: str | None
) -> None:
    a, t = tmp_path / "a", tmp_path / "a" / "b" / "target"
    t.mkdir(parents=True)
    for d in (tmp_path, a, a / "b", t):
        os.chmod(d, 0o755)
    if layout == "nested sticky 1777 dirs":
        os.chmod(tmp_path, 0o1777)
        os.chmod(a, 0o1777)
    elif layout == "a 0777 ancestor":
        os.chmod(a, 0o777)
    elif layout == "an ancestor owned by nobody":
        os.chown(a, 65534, 65534)
    elif layout == "a group-writable target":
        os.chmod(t, 0o775)
    elif layout == "a sticky target":
        os.chmod(t, 0o1777)
    elif layout == "a symlink to a weak dir":
        os.chmod(a, 0o777)
        (tmp_path / "link").symlink_to(a / "b")
        t = tmp_path / "link" / "target"
    try:
        assert _fs.unsafe_ancestor(str(t)) == (why and why.format(a=a, t=t))
        below = None if layout == "a sticky target" else why  # sticky: what we make in it stays ours
        assert _fs.unsafe_ancestor(str(t / "not-yet" / "made")) == (below and below.format(a=a, t=t))
    finally:
        os.chmod(tmp_path, 0o700)

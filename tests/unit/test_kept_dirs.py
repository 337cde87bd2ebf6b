"""Directory fds kept open between calls (plugin state records, results cache): each use costs
one lstat per path, and a directory removed, re-created, replaced or opened up under the
process is noticed and handled as on first use."""

from __future__ import annotations

import os
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest

from pycni import _fs
from pycni.cache import CachedAttachment, ResultsCache
from pycni.errors import CacheError, CNIError, ErrorCode
from pycni_plugins.kernel.state import Records


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of the directory syscalls made (os.open of a directory, mkdir, makedirs)."""
    counted: Counter[str] = Counter()
    real_open, real_mkdir = os.open, os.mkdir

    def counting_open(path: str, flags: int, *args: object, **kw: object) -> int:
        counted["open dir" if flags & os.O_DIRECTORY else "open file"] += 1
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    def counting_mkdir(*args: object, **kw: object) -> None:
        counted["mkdir"] += 1
        real_mkdir(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "mkdir", counting_mkdir)
    return counted


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "state"
    r.mkdir(mode=0o700)
    return r


def test_records_open_their_directories_once_per_process(root: Path, calls: Counter[str]) -> None:
    records = Records("kind", str(root))
    records.store("r0", {"i": 0})
    first = dict(calls)
    assert first["open dir"] >= 2 and first["mkdir"] == 1  # the state dir and the kind's dir, made
    for i in range(1, 5):
        records.store(f"r{i}", {"i": i})
        assert records.load(f"r{i}") == {"i": i}
    assert records.remove("r0")
    # No directory opened or made again: only the records' files (temp file and read) opened.
    assert calls == {**first, "open file": first["open file"] + 8}


def test_a_state_dir_removed_and_re_created_under_the_process_is_used_anew(root: Path) -> None:
    records = Records("kind", str(root))
    records.store("a", {"v": 1})
    shutil.rmtree(root)
    assert records.load("a") is None and records.names() == []
    records.store("b", {"v": 2})  # made again, and the record lands there, not in the removed dir
    assert sorted(os.listdir(root / "kind")) == ["b"]
    shutil.rmtree(root / "kind")
    os.mkdir(root / "kind", 0o700)
    records.store("c", {"v": 3})
    assert os.listdir(root / "kind") == ["c"] and Records("kind", str(root)).load("c") == {"v": 3}


def test_a_state_dir_renamed_away_is_not_written_through_its_kept_fd(root: Path, tmp_path: Path) -> None:
    records = Records("kind", str(root))
    records.store("a", {"v": 1})
    os.rename(root, tmp_path / "moved")
    records.store("b", {"v": 2})
    assert os.listdir(root / "kind") == ["b"] and os.listdir(tmp_path / "moved" / "kind") == ["a"]


@pytest.mark.parametrize("change", ["kind dir a symlink", "state dir a symlink", "kind dir opened up"])
def test_a_state_dir_changed_after_first_use_is_refused_as_on_first_use(
    root: Path, tmp_path: Path, change: str
) -> None:
    records = Records("kind", str(root))
    records.store("a", {"v": 1})
    if change == "kind dir a symlink":
        os.rename(root / "kind", tmp_path / "elsewhere")
        (root / "kind").symlink_to(tmp_path / "elsewhere")
    elif change == "state dir a symlink":  # to the very directory the process opened
        os.rename(root, tmp_path / "moved")
        root.symlink_to(tmp_path / "moved")
    else:
        os.chmod(root / "kind", 0o755)
    with pytest.raises(CNIError) as e:
        records.store("b", {"v": 2})
    assert e.value.code == ErrorCode.IO_FAILURE
    with pytest.raises(CNIError):
        records.load("a")


def test_the_results_cache_opens_its_directories_once_per_process(tmp_path: Path, calls: Counter[str]) -> None:
    cache = ResultsCache(str(tmp_path / "cache"))

    def add(c: str) -> None:
        with cache.container_lock(c), cache.network_lock("net", exclusive=False):
            cache.ensure_writable()
            assert cache.read("net", c, "eth0") is None
            cache.write(CachedAttachment(c, "net", "eth0"))

    add("c0")
    first = dict(calls)
    assert first["open dir"] >= 2 and first["mkdir"] >= 2  # results/ and locks/
    add("c1")
    add("c2")
    # No directory opened or made again: only the lock files, the entry read and its temp file.
    assert calls == {**first, "open file": first["open file"] + 2 * 4}


def test_a_results_dir_removed_and_re_created_under_the_process_is_used_anew(tmp_path: Path) -> None:
    cache = ResultsCache(str(tmp_path / "cache"))
    cache.write(CachedAttachment("c1", "net", "eth0"))
    shutil.rmtree(tmp_path / "cache")
    assert cache.read("net", "c1", "eth0") is None and cache.attachments() == []
    cache.write(CachedAttachment("c2", "net", "eth0"))
    assert os.listdir(tmp_path / "cache" / "results") == ["net-c2-eth0"]
    assert [a.container_id for a in ResultsCache(str(tmp_path / "cache")).attachments()] == ["c2"]


def test_a_results_dir_replaced_by_a_symlink_after_first_use_is_refused(tmp_path: Path) -> None:
    cache = ResultsCache(str(tmp_path / "cache"))
    cache.write(CachedAttachment("c1", "net", "eth0"))
    os.rename(tmp_path / "cache" / "results", tmp_path / "elsewhere")
    (tmp_path / "cache" / "results").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CacheError, match="symlink"):
        cache.write(CachedAttachment("c2", "net", "eth0"))
    assert os.listdir(tmp_path / "elsewhere") == ["net-c1-eth0"]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_at_most_limit_directories_stay_open_and_none_is_closed_while_in_use(tmp_path: Path) -> None:
    kept = _fs.KeptDirs(limit=2)

    def opener(path: Path) -> tuple[int]:
        return (os.open(path, os.O_RDONLY | os.O_DIRECTORY),)

    dirs = [tmp_path / f"d{i}" for i in range(5)]
    before = _open_fds()
    for d in dirs:
        d.mkdir(mode=0o700)
        with kept.use((str(d),), lambda d=d: opener(d)) as fd:
            assert os.fstat(fd).st_ino == d.stat().st_ino
    assert _open_fds() == before + 2
    with kept.use((str(dirs[0]),), lambda: opener(dirs[0])) as first:
        for d in dirs[1:]:  # each evicts an older entry: the first one goes while still in use
            with kept.use((str(d),), lambda d=d: opener(d)):
                pass
        assert os.fstat(first).st_ino == dirs[0].stat().st_ino
    assert _open_fds() == before + 2


def test_clear_closes_every_kept_directory_and_one_in_use_when_its_user_is_done(tmp_path: Path) -> None:
    kept = _fs.KeptDirs()
    dirs = [tmp_path / f"d{i}" for i in range(3)]
    before = _open_fds()
    for d in dirs:
        d.mkdir(mode=0o700)
        with kept.use((str(d),), lambda d=d: (os.open(d, os.O_RDONLY | os.O_DIRECTORY),)):
            pass
    assert _open_fds() == before + 3
    with kept.use((str(dirs[0]),), lambda: (os.open(dirs[0], os.O_RDONLY | os.O_DIRECTORY),)) as fd:
        kept.clear()
        assert _open_fds() == before + 1 and os.fstat(fd).st_ino == dirs[0].stat().st_ino
    assert _open_fds() == before


def test_threads_storing_and_listing_while_the_state_dir_is_removed_lose_nothing_after_it(root: Path) -> None:
    records = Records("kind", str(root))
    records.store("seed", {})
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(n: int) -> None:
        try:
            for i in range(60):
                records.store(f"t{n}-{i}", {"i": i})
                records.names()
        except BaseException as e:  # a store racing the rmtree may fail; nothing else may
            if not isinstance(e, (CNIError, OSError)):
                errors.append(e)

    def remover() -> None:
        while not stop.is_set():
            shutil.rmtree(root, ignore_errors=True)
            stop.wait(0.005)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    chaos = threading.Thread(target=remover)
    chaos.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    chaos.join()
    assert not errors
    # Once the removal stops, every thread's record lands in the directory that is there now.
    records.store("after", {"v": 1})
    assert "after" in os.listdir(root / "kind") and Records("kind", str(root)).load("after") == {"v": 1}


def test_a_forked_child_uses_the_kept_directories(root: Path) -> None:
    records = Records("kind", str(root))
    records.store("parent", {})
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            records.store("child", {})
            os._exit(0 if records.load("parent") == {} else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert records.names() == ["child", "parent"]

"""The results cache: libcni's cniCacheV1 format, legacy files, atomic writes, modes, symlinks, locks."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
import time

import pytest

from pycni.cache import CachedAttachment, ResultsCache
from pycni.errors import CacheError, InvalidArgumentError

RESULT = {"cniVersion": "1.0.0", "ips": [{"address": "198.18.0.2/24"}]}


def entry(**kw):
    base = dict(
        container_id="c1",
        network="net",
        ifname="eth0",
        config=b'{"name":"net"}',
        netns="/run/netns/x",
        cni_args=(("K", "V"),),
        capability_args={"portMappings": [{"hostPort": 8080}]},
        result=RESULT,
    )
    return CachedAttachment(**(base | kw))


def test_file_format_is_libcnis_cnicachev1(tmp_path):
    cache = ResultsCache(str(tmp_path))
    cache.write(entry())
    raw = (tmp_path / "results" / "net-c1-eth0").read_text()
    assert raw == (
        '{"kind":"cniCacheV1","containerId":"c1","config":"' + base64.b64encode(b'{"name":"net"}').decode() + '",'
        '"ifName":"eth0","networkName":"net","netns":"/run/netns/x","cniArgs":[["K","V"]],'
        '"capabilityArgs":{"portMappings":[{"hostPort":8080}]},'
        '"result":{"cniVersion":"1.0.0","ips":[{"address":"198.18.0.2/24"}]}}'
    )


def test_empty_optional_fields_are_omitted_and_html_chars_escaped_like_go(tmp_path):
    cache = ResultsCache(str(tmp_path))
    cache.write(entry(netns="", cni_args=(), capability_args={}, result={"x": "<&>"}))
    raw = (tmp_path / "results" / "net-c1-eth0").read_text()
    assert '"netns"' not in raw and '"cniArgs"' not in raw and '"capabilityArgs"' not in raw
    assert '"x":"\\u003c\\u0026\\u003e"' in raw


def test_round_trip(tmp_path):
    cache = ResultsCache(str(tmp_path))
    cache.write(entry())
    assert cache.read("net", "c1", "eth0") == entry()


def test_modes_dir_0700_file_0600(tmp_path):
    cache = ResultsCache(str(tmp_path / "cache"))
    cache.write(entry())
    assert stat.S_IMODE(os.stat(tmp_path / "cache" / "results").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "cache" / "results" / "net-c1-eth0").st_mode) == 0o600


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    cache = ResultsCache(str(tmp_path))
    cache.write(entry())
    cache.write(entry(result={"cniVersion": "1.0.0"}))
    assert os.listdir(tmp_path / "results") == ["net-c1-eth0"]
    assert cache.read("net", "c1", "eth0").result == {"cniVersion": "1.0.0"}


def test_legacy_raw_result_file_is_read_as_a_result(tmp_path):
    (tmp_path / "results").mkdir(mode=0o700)
    (tmp_path / "results" / "net-c1-eth0").write_text(json.dumps(RESULT))
    got = ResultsCache(str(tmp_path)).read("net", "c1", "eth0")
    assert got.result == RESULT and got.config == b""


def test_entry_fields_match_keys_as_gos_struct_decoder_does(tmp_path):
    cache = ResultsCache(str(tmp_path))
    cache.write(entry())
    path = tmp_path / "results" / "net-c1-eth0"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({k[0].upper() + k[1:]: v for k, v in doc.items()}))
    assert cache.read("net", "c1", "eth0") == entry()


def test_entry_result_is_a_go_map_so_a_repeated_key_keeps_its_last_value(tmp_path):
    # libcni holds the cached result as map[string]interface{} and re-marshals it.
    cache = ResultsCache(str(tmp_path))
    cache.write(entry())
    path = tmp_path / "results" / "net-c1-eth0"
    text = path.read_text().replace('"ips":', '"dns":{"domain":"a"},"dns":{"search":["b"]},"ips":')
    path.write_text(text)
    result = cache.read("net", "c1", "eth0").result
    assert result["dns"] == {"search": ["b"]} and type(result["dns"]) is dict and type(result) is dict


@pytest.mark.parametrize("content", [b"", b"{trunc", b"[1]", b'{"kind":"cniCacheV1","config":"%%%"}'])
def test_corrupt_files_raise_cache_error(tmp_path, content):
    (tmp_path / "results").mkdir(mode=0o700)
    (tmp_path / "results" / "net-c1-eth0").write_bytes(content)
    with pytest.raises(CacheError):
        ResultsCache(str(tmp_path)).read("net", "c1", "eth0")


def test_missing_file_reads_as_none_and_delete_is_idempotent(tmp_path):
    cache = ResultsCache(str(tmp_path))
    assert cache.read("net", "c1", "eth0") is None
    cache.delete("net", "c1", "eth0")
    cache.write(entry())
    cache.delete("net", "c1", "eth0")
    cache.delete("net", "c1", "eth0")
    assert cache.read("net", "c1", "eth0") is None


@pytest.mark.parametrize(
    "network, cid, ifname",
    [
        ("", "c", "e"),
        ("n", "", "e"),
        ("n", "c", ""),
        ("../x", "c", "e"),
        ("n", "../c", "e"),
        ("n", "c", "a/b"),
        ("n/x", "c", "e"),
    ],
)
def test_hostile_or_empty_key_parts_are_refused(tmp_path, network, cid, ifname):
    with pytest.raises(InvalidArgumentError):
        ResultsCache(str(tmp_path)).path(network, cid, ifname)


def test_symlinked_cache_file_is_not_followed(tmp_path):
    cache = ResultsCache(str(tmp_path / "cache"))
    cache.write(entry())
    secret = tmp_path / "secret"
    secret.write_text(json.dumps(RESULT))
    target = tmp_path / "cache" / "results" / "net-c2-eth0"
    target.symlink_to(secret)
    with pytest.raises(CacheError, match="symlink"):
        cache.read("net", "c2", "eth0")
    cache.write(entry(container_id="c2"))
    assert secret.read_text() == json.dumps(RESULT)
    assert not target.is_symlink()


def test_symlinked_results_dir_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "results").symlink_to(elsewhere)
    with pytest.raises(CacheError, match="symlink"):
        ResultsCache(str(tmp_path / "cache")).write(entry())
    assert os.listdir(elsewhere) == []


def test_unusable_results_dir_gives_a_clear_error(tmp_path):
    (tmp_path / "results").write_text("not a dir")
    with pytest.raises(CacheError, match="cannot use cache dir"):
        ResultsCache(str(tmp_path)).write(entry())


def test_attachments_filter_like_libcni(tmp_path):
    cache = ResultsCache(str(tmp_path))
    cache.write(entry(container_id="c1", network="a"))
    cache.write(entry(container_id="c1", network="b", ifname="eth1"))
    cache.write(entry(container_id="c2", network="a"))
    (tmp_path / "results" / "a-c3-eth0").write_text("{corrupt")
    (tmp_path / "results" / "a-c4-eth0").write_text(json.dumps(RESULT))
    assert [(e.network, e.container_id) for e in cache.attachments()] == [("a", "c1"), ("a", "c2"), ("b", "c1")]
    assert [(e.network, e.ifname) for e in cache.attachments("c1")] == [("a", "eth0"), ("b", "eth1")]


def test_container_lock_serialises_the_same_container_only(tmp_path):
    cache = ResultsCache(str(tmp_path))
    order: list[str] = []

    def take(cid):
        with cache.container_lock(cid):
            order.append(cid)

    with cache.container_lock("c1"):
        same = threading.Thread(target=take, args=("c1",))
        other = threading.Thread(target=take, args=("c2",))
        same.start()
        other.start()
        other.join(5)
        time.sleep(0.2)
        assert order == ["c2"]
    same.join(5)
    assert order == ["c2", "c1"]


def test_network_gc_lock_excludes_shared_holders(tmp_path):
    cache = ResultsCache(str(tmp_path))
    got = threading.Event()

    def gc():
        with cache.network_lock("net", exclusive=True):
            got.set()

    with cache.network_lock("net", exclusive=False), cache.network_lock("net", exclusive=False):
        t = threading.Thread(target=gc)
        t.start()
        assert not got.wait(0.3)
    t.join(5)
    assert got.is_set()


def test_an_operations_locks_hold_its_container_and_share_its_network(tmp_path):
    cache = ResultsCache(str(tmp_path), lock_timeout=0.2)
    with cache.attachment_locks("net", "c1") as (nfd, cfd):
        assert nfd is not None and cfd is not None and nfd != cfd
        with cache.network_lock("net", exclusive=False), cache.container_lock("c2"):
            pass  # another container of the network goes ahead
        failed: list[CacheError] = []

        def take(blocked):
            try:
                with blocked():
                    pass
            except CacheError as e:
                failed.append(e)

        for blocked in (lambda: cache.container_lock("c1"), lambda: cache.network_lock("net", exclusive=True)):
            t = threading.Thread(target=take, args=(blocked,))
            t.start()
            t.join(5)
        assert [e.code for e in failed] == [11, 11], "the same container and the network's GC wait"
    with cache.container_lock("c1"), cache.network_lock("net", exclusive=True):
        pass  # both released
    assert sorted(os.listdir(tmp_path / "locks")) == ["containers.lock", "net-net.lock"]


def test_an_operations_locks_refuse_a_bad_network_name_and_an_unusable_locks_dir(tmp_path):
    cache = ResultsCache(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="invalid characters"), cache.attachment_locks("a/b", "c1"):
        pass
    (tmp_path / "locks").write_text("not a dir")
    with pytest.raises(CacheError, match=r"failed to open lock .*/net-net\.lock: cannot use cache dir"):
        with cache.attachment_locks("net", "c1"):
            pass

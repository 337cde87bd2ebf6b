"""A broken results cache never stops DEL, and ADD reports it before changing anything."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from pycni.config import conflist_from_bytes
from pycni.errors import CacheError
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf

RT = RuntimeConf(container_id="ctr", netns="/run/netns/ctr", ifname="eth0")


@pytest.fixture
def setup(fake_plugins, tmp_path):
    runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="exec")
    network = conflist_from_bytes(fake_plugins.conflist(fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b")))
    runtime.add_network_list(network, RT)
    return runtime, network


CORRUPTIONS = {
    "empty": b"",
    "truncated": None,
    "not json": b"\x00\x01garbage",
    "foreign kind": json.dumps({"kind": "somethingElse", "result": {}}).encode(),
    "wrong types": json.dumps({"kind": "cniCacheV1", "containerId": 5, "config": "!!"}).encode(),
    "unconvertible result": json.dumps({"cniVersion": "0.4567.0"}).encode(),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_del_runs_every_plugin_and_removes_a_corrupt_cache_file(setup, fake_plugins, kind):
    runtime, network = setup
    path = runtime.cache.path(network.name, RT.container_id, RT.ifname)
    content = CORRUPTIONS[kind]
    if content is None:
        with open(path, "rb") as f:
            content = f.read()[:37]
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CacheError):
        runtime.check_network_list(network, RT)
    runtime.delete_network_list(network, RT)
    dels = [c for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
    assert [c["type"] for c in dels] == ["fake-b", "fake-a"]
    assert all("prevResult" not in c["stdin"] for c in dels)
    assert runtime.get_cached_attachments() == []


READ_ONLY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pycni.config import conflist_from_bytes
    from pycni.errors import CacheError
    from pycni.runtime_conf import RuntimeConf
    from pycni.runtime import Runtime
    plugin_dir, cache, conflist = sys.argv[1:4]
    runtime = Runtime([plugin_dir], cache_dir=cache, backend="exec")
    network = conflist_from_bytes(conflist.encode())
    out = {}
    try:
        runtime.add_network_list(network, RuntimeConf("other", "/run/netns/other"))
    except CacheError as e:
        out["add_error"] = str(e)
    runtime.delete_network_list(network, RuntimeConf("ctr", "/run/netns/ctr"))
    out["del"] = "ok"
    print(json.dumps(out))
    """
)


@pytest.mark.privileged
def test_read_only_cache_dir(setup, fake_plugins, tmp_path):
    """In a private mount namespace the cache dir is remounted read-only (as a full or RO disk)."""
    runtime, network = setup
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed")
    cache = str(tmp_path / "cache")
    conflist = fake_plugins.conflist(fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b")).decode()
    shell = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    proc = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            shell,
            "sh",
            cache,
            sys.executable,
            "-c",
            READ_ONLY_SCRIPT,
            str(fake_plugins.dir),
            cache,
            conflist,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "read-only" in out["add_error"] and out["del"] == "ok"
    commands = [(c["env"]["CNI_CONTAINERID"], c["env"]["CNI_COMMAND"]) for c in fake_plugins.calls()]
    assert ("other", "ADD") not in commands, "ADD must fail before any plugin runs"
    assert commands[-2:] == [("ctr", "DEL"), ("ctr", "DEL")]
    # the file could not be removed read-only; a later DEL with a writable cache finishes the job
    assert runtime.cache.read(network.name, "ctr", "eth0") is not None
    runtime.delete_network_list(network, RT)
    assert runtime.get_cached_attachments() == []

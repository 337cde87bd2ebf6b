"""host-local: pycni against the Debian Go binary (containernetworking-plugins 1.1.1) on shared data dirs.

host-local never enters the netns, so a placeholder CNI_NETNS is enough; every data dir is under
tmp_path. Both sides must produce the same files, errors and results, and share leases both ways.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pycni.errors import CNIError
from pycni.plugin import PluginRequest
from pycni_plugins.host_local import HostLocalPlugin
from pycni_plugins.host_local import lease_cache as hl_cache
from pycni_plugins.host_local.disk import DiskStore

pytestmark = pytest.mark.reference

GO_BINARY = "/usr/lib/cni/host-local"
NET = "interop"
PLUGIN = HostLocalPlugin()


def make_conf(data_dir: Path, ipam: dict[str, Any] | None = None, version: str = "0.4.0", **top: Any) -> dict:
    conf: dict[str, Any] = {"cniVersion": version, "name": NET, "type": "bridge"}
    conf["ipam"] = {
        "type": "host-local",
        "dataDir": str(data_dir),
        **({"subnet": "10.0.0.0/24"} if ipam is None else ipam),
    }
    conf.update(top)
    return conf


def go(command: str, conf: dict, cid: str = "ctr1", ifname: str = "eth0", args: str = "") -> Any:
    """Run the Go binary; its result, None for an empty success, or its error object (with "code")."""
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": "/run/netns/placeholder",
        "CNI_IFNAME": ifname,
        "CNI_PATH": os.path.dirname(GO_BINARY),
        "CNI_ARGS": args,
    }
    proc = subprocess.run([GO_BINARY], input=json.dumps(conf).encode(), env=env, capture_output=True, timeout=30)
    out = json.loads(proc.stdout) if proc.stdout.strip() else None
    assert (proc.returncode != 0) == (isinstance(out, dict) and "code" in out), proc
    return out


def py(command: str, conf: dict, cid: str = "ctr1", ifname: str = "eth0", args: str = "") -> Any:
    """pycni in-process, answering like ``go``."""
    request = PluginRequest(
        command=command, config=conf, container_id=cid, netns="/run/netns/x", ifname=ifname, args=args
    )
    try:
        return PLUGIN.handle(request)
    except CNIError as e:
        return e.to_json()


RUNNERS = {"go": go, "py": py}


@pytest.fixture(autouse=True, params=["cached", "uncached"])
def lease_cache(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with pycni's in-process lease cache and without it (full directory reads)."""
    monkeypatch.setattr(hl_cache, "_CACHE_LEASES", request.param == "cached")
    monkeypatch.setattr(hl_cache, "_stores_opened", max(hl_cache._stores_opened, 2))
    return request.param


def addresses(result: dict) -> list[str]:
    assert "code" not in result, result
    return [ip["address"].split("/")[0] for ip in result["ips"]]


def snapshot(data_dir: Path) -> dict[str, bytes]:
    net = data_dir / NET
    return {name: (net / name).read_bytes() for name in sorted(os.listdir(net))}


# --- same input, same output -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ipam", "top", "args"),
    [
        ({"subnet": "10.0.0.0/31"}, {}, ""),
        ({"subnet": "10.0.0.5/24"}, {}, ""),
        ({"subnet": "::ffff:10.0.0.0/104"}, {}, ""),
        ({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.200", "rangeEnd": "10.0.0.100"}, {}, ""),
        ({"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.5"}, {}, ""),
        ({"subnet": "10.0.0.0/24", "gateway": "bogus"}, {}, ""),
        ({"ranges": [[]]}, {}, ""),
        ({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}, {}, ""),
        ({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.128/25"}]]}, {}, ""),
        ({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/16"}]]}, {}, ""),
        ({"ranges": [[{"rangeStart": "10.0.0.1"}]]}, {}, ""),
        ({"ranges": "x"}, {}, ""),
        ({}, {}, ""),
        ({}, {"ipam": None}, ""),
        ({"subnet": "10.0.0.0/24", "resolvConf": "/nonexistent/resolv.conf"}, {}, ""),
        ({"subnet": "10.0.0.0/24"}, {}, "K8S_POD_NAME=x;K8S_POD_NAMESPACE=y"),
        ({"subnet": "10.0.0.0/24"}, {}, "IP=10.0.0.1"),
        ({"subnet": "10.0.0.0/24"}, {}, "IP=nonsense"),
        ({"subnet": "10.0.0.0/24"}, {"runtimeConfig": {"ips": ["10.7.0.1", "10.0.0.9"]}}, ""),
        ({"subnet": "10.0.0.0/24"}, {"args": {"cni": {"ips": [""]}}}, ""),
    ],
)
def test_errors_match_go(tmp_path: Path, ipam: dict, top: dict, args: str) -> None:
    results = {}
    for side, runner in RUNNERS.items():
        conf = make_conf(tmp_path / side, ipam)
        conf.update(top)
        results[side] = runner("ADD", conf, args=args)
    assert "code" in results["go"]
    assert results["py"] == results["go"]


@pytest.mark.parametrize("version", ["", "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"])
def test_results_match_go(tmp_path: Path, version: str) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 192.0.2.53\nsearch example.org\noptions ndots:1\n")
    ipam = {
        "ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64", "rangeStart": "fd00::10"}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "fd00:1::/48", "gw": "fd00::1"}, {"dst": "10.9.0.5/16"}],
    }
    for with_dns in (False, True):
        if with_dns:
            ipam["resolvConf"] = str(resolv)
        out = {
            side: runner("ADD", make_conf(tmp_path / side, ipam, version), f"c{with_dns}")
            for side, runner in RUNNERS.items()
        }
        if version == "1.0.0" and not with_dns:
            assert out["go"].pop("dns") == {}  # Go 1.1.1's cni lib always prints it; the latest omits it
        assert out["py"] == out["go"]


@pytest.mark.parametrize(
    ("top", "args"),
    [
        ({"runtimeConfig": {"ips": ["::ffff:10.0.0.9"]}}, ""),
        ({"args": {"cni": {"ips": ["10.0.0.7/8", "fd00::7"]}}}, ""),
        ({"runtimeConfig": {"ips": ["fd00::5"]}}, "IgnoreUnknown=true;K8S_POD_UID=u;IP=10.0.0.5"),
        ({}, "IP="),
    ],
)
def test_requested_ip_forms_match_go(tmp_path: Path, top: dict, args: str) -> None:
    ipam = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}
    out = {}
    for side, runner in RUNNERS.items():
        conf = make_conf(tmp_path / side, ipam)
        conf.update(top)
        out[side] = runner("ADD", conf, args=args)
    assert "code" not in out["go"]
    assert out["py"] == out["go"]


@pytest.mark.parametrize("range_sets", [1, 2])
def test_legacy_bare_id_files_are_checked_and_released_like_go(tmp_path: Path, range_sets: int) -> None:
    ipam = {"ranges": [[{"subnet": f"10.{i}.0.0/24"}] for i in range(range_sets)]}
    for side, runner in RUNNERS.items():
        conf = make_conf(tmp_path / side, ipam)
        runner("ADD", conf, "old", "eth1")
        (tmp_path / side / NET / "10.0.0.50").write_bytes(b"old \n")  # written by a pre-ifname plugin
        assert runner("CHECK", conf, "old") is None  # eth0 only has the legacy file
        assert runner("ADD", conf, "old")["msg"].endswith("duplicate allocation is not allowed")
        addresses(runner("ADD", conf, "old", args="IP=10.0.0.60"))  # requested: no duplicate check
        assert runner("DEL", conf, "old") is None
    assert snapshot(tmp_path / "py") == snapshot(tmp_path / "go")
    assert ("10.0.0.50" in snapshot(tmp_path / "go")) == (range_sets == 1)


# --- shared data dirs --------------------------------------------------------------------------

SEQUENCE: list[tuple[str, str, str, str]] = [  # command, container, ifname, CNI_ARGS
    ("ADD", "a", "eth0", ""),
    ("ADD", "b", "eth0", "IgnoreUnknown=1;K8S_POD_NAME=b;IP=10.0.0.20"),
    ("ADD", "c", "eth0", ""),
    ("ADD", "c", "eth1", ""),
    ("ADD", "c", "eth0", ""),  # duplicate: refused
    ("DEL", "a", "eth0", ""),
    ("ADD", "d", "eth0", ""),
    ("ADD", "e", "eth0", "IP=10.0.0.20"),  # taken: refused
    ("DEL", "b", "eth0", ""),
    ("ADD", "f", "eth0", ""),
    ("CHECK", "c", "eth1", ""),
    ("DEL", "c", "eth0", ""),
    ("DEL", "zz", "eth0", ""),
]


def test_same_sequence_gives_byte_identical_directories(tmp_path: Path) -> None:
    ipam = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/120", "rangeStart": "fd00::fd"}]]}
    outputs: dict[str, list[Any]] = {}
    for side, runner in RUNNERS.items():
        conf = make_conf(tmp_path / side, ipam)
        outputs[side] = [runner(cmd, conf, cid, ifname, args) for cmd, cid, ifname, args in SEQUENCE]
    assert outputs["py"] == outputs["go"]
    assert any("code" in (o or {}) for o in outputs["go"])  # the sequence does exercise failures
    assert snapshot(tmp_path / "py") == snapshot(tmp_path / "go")


def test_exhaustion_error_is_identical(tmp_path: Path) -> None:
    ipam = {"ranges": [[{"subnet": "10.0.0.0/30"}, {"subnet": "10.0.1.0/30"}]]}
    for side, runner in RUNNERS.items():
        conf = make_conf(tmp_path / side, ipam)
        assert addresses(runner("ADD", conf, "a")) == ["10.0.0.2"]
        assert addresses(runner("ADD", conf, "b")) == ["10.0.1.2"]
    conf_go, conf_py = (make_conf(tmp_path / side, ipam) for side in RUNNERS)
    err = go("ADD", conf_go, "c")
    assert err["msg"] == (
        "failed to allocate for range 0: no IP addresses available in range set: 10.0.0.1-10.0.0.2,10.0.1.1-10.0.1.2"
    )
    assert py("ADD", conf_py, "c") == err


@pytest.mark.parametrize("first", ["go", "py"])
def test_allocation_continues_across_implementations_without_duplicates(tmp_path: Path, first: str) -> None:
    conf = make_conf(tmp_path, {"subnet": "10.0.0.0/28"})
    second = "py" if first == "go" else "go"
    got = []
    for turn in range(13):  # 13 usable addresses (.2 - .14): alternate sides, then both see exhaustion
        side = (first, second)[turn % 2]
        got += addresses(RUNNERS[side]("ADD", conf, f"{side}{turn}"))
    assert got == [f"10.0.0.{i}" for i in range(2, 15)]  # one round-robin, shared through last_reserved_ip
    for side in RUNNERS:
        assert RUNNERS[side]("ADD", conf, f"late-{side}")["msg"].startswith("failed to allocate for range 0: no IP")


@pytest.mark.parametrize(("owner", "other"), [("go", "py"), ("py", "go")])
def test_leases_are_checked_and_released_by_the_other_side(tmp_path: Path, owner: str, other: str) -> None:
    conf = make_conf(tmp_path, {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]})
    RUNNERS[owner]("ADD", conf, "keep")
    RUNNERS[owner]("ADD", conf, "gone")
    RUNNERS[owner]("ADD", conf, "gone", "eth1")
    assert RUNNERS[other]("CHECK", conf, "gone") is None
    assert RUNNERS[other]("ADD", conf, "gone")["msg"].endswith("duplicate allocation is not allowed")
    assert RUNNERS[other]("DEL", conf, "gone") is None
    assert RUNNERS[other]("CHECK", conf, "gone")["msg"] == "host-local: Failed to find address added by container gone"
    net = tmp_path / NET
    assert {name: (net / name).read_bytes() for name in os.listdir(net) if name[0] in "1f"} == {
        "10.0.0.2": b"keep\r\neth0",
        "fd00::2": b"keep\r\neth0",
        "10.0.0.4": b"gone\r\neth1",
        "fd00::4": b"gone\r\neth1",
    }


def test_go_and_pycni_allocate_concurrently_without_duplicates(tmp_path: Path) -> None:
    conf = make_conf(tmp_path)
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_NETNS": "/run/netns/placeholder",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
    }
    stdin = json.dumps(conf).encode()
    go_procs = [
        subprocess.Popen(
            [GO_BINARY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**env, "CNI_CONTAINERID": f"go{i}"}
        )
        for i in range(30)
    ]
    py_results: list[Any] = []
    threads = [threading.Thread(target=lambda i=i: py_results.append(py("ADD", conf, f"py{i}"))) for i in range(30)]
    for t in threads:
        t.start()
    go_results = [json.loads(p.communicate(stdin, timeout=60)[0]) for p in go_procs]
    for t in threads:
        t.join()
    ips = [ip for result in go_results + py_results for ip in addresses(result)]
    assert len(ips) == 60
    assert len(set(ips)) == 60
    assert len([n for n in os.listdir(tmp_path / NET) if n.startswith("10.")]) == 60


def test_go_and_pycni_lock_each_other_out_on_one_attachment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent ADDs of one attachment from both sides: flock makes exactly one succeed."""
    conf = make_conf(tmp_path)
    for i in range(100):  # a scan that takes a while, on the Go side too
        py("ADD", conf, f"other{i}")
    find = DiskStore.find

    def slow_find(self: Any, *args: Any) -> Any:  # widen pycni's scan-to-reserve window
        found = find(self, *args)
        time.sleep(0.01)
        return found

    monkeypatch.setattr(DiskStore, "find", slow_find)
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "same",
        "CNI_NETNS": "/run/netns/placeholder",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
    }
    stdin = json.dumps(conf).encode()
    go_procs = [
        subprocess.Popen([GO_BINARY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) for _ in range(10)
    ]
    py_results: list[Any] = []
    threads = [threading.Thread(target=lambda: py_results.append(py("ADD", conf, "same"))) for _ in range(10)]
    for t in threads:
        t.start()
    go_results = [json.loads(p.communicate(stdin, timeout=60)[0]) for p in go_procs]
    for t in threads:
        t.join()
    assert sum("code" not in r for r in go_results + py_results) == 1
    net = tmp_path / NET
    assert len([n for n in os.listdir(net) if (net / n).read_bytes() == b"same\r\neth0"]) == 1


# --- the Go binary changes the directory between two calls of a warm pycni cache ----------------


def test_go_changes_between_warm_calls_are_seen(tmp_path: Path) -> None:
    conf = make_conf(tmp_path)
    assert addresses(py("ADD", conf, "mine")) == ["10.0.0.2"]
    assert py("CHECK", conf, "mine") is None  # warm
    assert addresses(go("ADD", conf, "x")) == ["10.0.0.3"]
    assert addresses(go("ADD", conf, "y")) == ["10.0.0.4"]
    assert go("DEL", conf, "y") is None
    assert go("DEL", conf, "mine") is None
    assert py("CHECK", conf, "x") is None
    assert py("ADD", conf, "x")["msg"].endswith("10.0.0.3 has been allocated to x, duplicate allocation is not allowed")
    assert py("CHECK", conf, "y")["msg"] == "host-local: Failed to find address added by container y"
    assert py("CHECK", conf, "mine")["msg"] == "host-local: Failed to find address added by container mine"
    assert addresses(py("ADD", conf, "mine")) == ["10.0.0.5"]
    assert py("DEL", conf, "x") is None
    assert go("CHECK", conf, "x")["msg"] == "host-local: Failed to find address added by container x"
    assert {n: v for n, v in snapshot(tmp_path).items() if n[0] == "1"} == {"10.0.0.5": b"mine\r\neth0"}


def test_go_giving_a_static_ip_to_another_container_on_a_reused_inode(tmp_path: Path) -> None:
    """Go: DEL a, ADD b with a's static IP; ext4 usually hands the new lease a's inode number."""
    conf = make_conf(tmp_path)
    lease = tmp_path / NET / "10.0.0.50"
    assert addresses(py("ADD", conf, "a", args="IP=10.0.0.50")) == ["10.0.0.50"]
    assert py("CHECK", conf, "a") is None  # warm: a owns .50
    old_inode = lease.stat().st_ino
    assert go("DEL", conf, "a") is None
    assert addresses(go("ADD", conf, "b", args="IP=10.0.0.50")) == ["10.0.0.50"]
    reused = lease.stat().st_ino == old_inode
    assert py("DEL", conf, "a") is None  # a stale owner must not release b's lease
    assert lease.read_bytes() == b"b\r\neth0"
    assert py("CHECK", conf, "b") is None
    assert py("ADD", conf, "b")["msg"].endswith(
        "10.0.0.50 has been allocated to b, duplicate allocation is not allowed"
    )
    assert py("DEL", conf, "b") is None  # a missed release would leak .50 for good
    assert not lease.exists()
    assert addresses(go("ADD", conf, "c", args="IP=10.0.0.50")) == ["10.0.0.50"]
    if not reused:
        pytest.skip("the filesystem did not reuse the inode (the scenario ran anyway)")

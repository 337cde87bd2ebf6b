"""host-local in-process: config errors, allocation order, requested IPs, release, CHECK, results, disk safety.

Expected error texts are the Debian Go plugin's (containernetworking-plugins 1.1.1), captured by
running it; ``tests/kernel/test_host_local_interop.py`` diffs them against the binary itself.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pycni.errors import CNIError, ErrorCode
from pycni.sdk import PluginRequest
from pycni_plugins.host_local import HostLocalPlugin
from pycni_plugins.host_local import lease_cache as hl_cache
from pycni_plugins.host_local.disk import DiskStore

NET = "testnet"
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


def run(command: str, conf: dict, cid: str = "ctr1", ifname: str = "eth0", args: str = "") -> Any:
    request = PluginRequest(
        command=command, config=conf, container_id=cid, netns="/run/netns/x", ifname=ifname, args=args
    )
    return PLUGIN.handle(request)


def add(conf: dict, cid: str = "ctr1", ifname: str = "eth0", args: str = "") -> list[str]:
    """ADD at 0.4.0 or later; the bare addresses allocated."""
    return [ip["address"].split("/")[0] for ip in run("ADD", conf, cid, ifname, args)["ips"]]


def error_of(command: str, conf: dict, **kw: Any) -> CNIError:
    with pytest.raises(CNIError) as info:
        run(command, conf, **kw)
    return info.value


def leases(data_dir: Path) -> dict[str, bytes]:
    """IP-named files of the network dir and their content."""
    net = data_dir / NET
    return {p.name: p.read_bytes() for p in net.iterdir() if p.name != "lock" and not p.name.startswith("last_")}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "networks"


@pytest.fixture(autouse=True, params=["cached", "uncached"])
def lease_cache(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the in-process lease cache (warm after a directory's first call) and without it."""
    monkeypatch.setattr(hl_cache, "_CACHE_LEASES", request.param == "cached")
    monkeypatch.setattr(hl_cache, "_stores_opened", max(hl_cache._stores_opened, 2))
    return request.param


# --- config parsing and validation -------------------------------------------------------------

CONFIG_ERRORS = [
    ({"subnet": "10.0.0.0/31"}, "invalid range set 0: Network 10.0.0.0/31 too small to allocate from"),
    ({"subnet": "fd00::/127"}, "invalid range set 0: Network fd00::/127 too small to allocate from"),
    (
        {"subnet": "10.0.0.5/24"},
        "invalid range set 0: Network has host bits set. "
        "For a subnet mask of length 24 the network address is 10.0.0.0",
    ),
    ({"subnet": "10.0.0.0/33"}, "invalid CIDR address: 10.0.0.0/33"),
    ({"subnet": "010.0.0.0/24"}, "invalid CIDR address: 010.0.0.0/24"),
    ({"subnet": ""}, "invalid CIDR address: "),
    ({"subnet": None}, "invalid CIDR address: "),
    ({"subnet": 5}, "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.subnet of type string"),
    (
        {"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"},
        "invalid range set 0: RangeStart 10.0.1.5 not in network 10.0.0.0/24",
    ),
    (
        {"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.5"},
        "invalid range set 0: RangeEnd 10.0.1.5 not in network 10.0.0.0/24",
    ),
    (
        {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.200", "rangeEnd": "10.0.0.100"},
        "invalid range set 0: RangeStart 10.0.0.200 not in network 10.0.0.0/24",
    ),
    ({"subnet": "10.0.0.0/24", "gateway": "x"}, "invalid IP address: x"),
    ({}, "no IP ranges specified"),
    ({"ranges": [[]]}, "invalid range set 0: empty range set"),
    ({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}, "invalid range set 0: mixed address families"),
    (
        {"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]},
        "invalid range set 0: subnets 10.0.0.1-10.0.0.254 and 10.0.0.1-10.0.0.126 overlap",
    ),
    ({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/16"}]]}, "range set 0 overlaps with 1"),
    ({"ranges": [[{"rangeStart": "10.0.0.1"}]]}, "invalid range set 0: IP <nil> not v4 nor v6"),
    ({"subnet": "::ffff:10.0.0.0/104"}, "invalid range set 0: IPNet IP and Mask version mismatch"),
    (
        {"ranges": "x"},
        "json: cannot unmarshal string into Go struct field IPAMConfig.ipam.ranges of type []allocator.RangeSet",
    ),
    (
        {"ranges": [[{"subnet": 5}]]},
        "json: cannot unmarshal number into Go struct field Range.ipam.ranges.subnet of type string",
    ),
    ({"subnet": "10.0.0.0/24", "routes": [{"dst": "x"}]}, "invalid CIDR address: x"),
    ({"subnet": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "x"}]}, "invalid IP address: x"),
    (
        {"subnet": "10.0.0.0/24", "resolvConf": "/nonexistent/resolv"},
        "open /nonexistent/resolv: no such file or directory",
    ),
]


@pytest.mark.parametrize(("ipam", "msg"), CONFIG_ERRORS)
def test_config_errors_have_the_reference_code_and_text(data_dir: Path, ipam: dict, msg: str) -> None:
    err = error_of("ADD", make_conf(data_dir, ipam))
    assert (err.code, err.msg) == (ErrorCode.INTERNAL, msg)


@pytest.mark.parametrize(
    ("top", "msg"),
    [
        ({"runtimeConfig": {"ips": ["x"]}}, "invalid IP address x"),
        ({"args": {"cni": {"ips": [""]}}}, "cannot understand ip: IP <nil> not v4 nor v6"),
        (
            {"args": {"cni": {"ips": [5]}}},
            "json: cannot unmarshal number into Go struct field IPAMArgs.args.cni.ips of type *ip.IP",
        ),
        ({"runtimeConfig": {"ipRanges": [[{"subnet": "10.0.0.0/33"}]]}}, "invalid CIDR address: 10.0.0.0/33"),
        ({"runtimeConfig": {"ipRanges": [[{"subnet": "10.0.0.0/16"}]]}}, "range set 0 overlaps with 1"),
    ],
)
def test_args_and_runtime_config_errors(data_dir: Path, top: dict, msg: str) -> None:
    err = error_of("ADD", make_conf(data_dir, **top))
    assert (err.code, err.msg) == (ErrorCode.INTERNAL, msg)


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        ("K8S_POD_NAME=x", 'ARGS: unknown args ["K8S_POD_NAME=x"]'),
        ("A=1;B=2", 'ARGS: unknown args ["A=1" "B=2"]'),
        ("A=b=c", 'ARGS: invalid pair "A=b=c"'),
        ("IP=x", 'ARGS: error parsing value of pair "IP=x": invalid IP address x'),
        (
            "IgnoreUnknown=x",
            'ARGS: error parsing value of pair "IgnoreUnknown=x": boolean unmarshal error: invalid input x',
        ),
    ],
)
def test_cni_args_errors(data_dir: Path, args: str, msg: str) -> None:
    err = error_of("ADD", make_conf(data_dir), args=args)
    assert (err.code, err.msg) == (ErrorCode.INTERNAL, msg)


def test_missing_ipam_key(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    del conf["ipam"]
    assert error_of("ADD", conf).msg == "IPAM config missing 'ipam' key"


def test_pre_0_3_versions_allow_one_address_per_family(data_dir: Path) -> None:
    ipam = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]]}
    err = error_of("ADD", make_conf(data_dir, ipam, version="0.2.0"))
    assert err.msg == "CNI version 0.2.0 does not support more than 1 address per family"
    assert add(make_conf(data_dir, ipam, version="0.3.1")) == ["10.0.0.2", "10.1.0.2"]


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "x\n"])
def test_network_names_that_could_escape_the_data_dir_are_refused(data_dir: Path, name: str) -> None:
    conf = make_conf(data_dir)
    conf["name"] = name
    err = error_of("ADD", conf)
    assert (err.code, err.msg) == (ErrorCode.INVALID_NETWORK_CONFIG, "invalid characters found in network name")
    assert not data_dir.exists()


def test_data_dir_with_dotdot_is_refused(tmp_path: Path) -> None:
    err = error_of("ADD", make_conf(tmp_path / "a" / ".." / ".." / "elsewhere"))
    assert err.code == ErrorCode.INVALID_NETWORK_CONFIG
    assert not (tmp_path.parent / "elsewhere").exists()


def test_legacy_range_and_runtime_ranges_are_prepended(data_dir: Path) -> None:
    ipam = {"subnet": "10.1.0.0/24", "ranges": [[{"subnet": "10.2.0.0/24"}]]}
    conf = make_conf(data_dir, ipam, runtimeConfig={"ipRanges": [[{"subnet": "10.3.0.0/24"}]]})
    assert add(conf) == ["10.3.0.2", "10.1.0.2", "10.2.0.2"]


def test_config_keys_match_case_insensitively_like_go(data_dir: Path) -> None:
    conf = make_conf(data_dir, {"Subnet": "10.5.0.0/24", "RANGESTART": "10.5.0.9"})
    assert add(conf) == ["10.5.0.9"]


# --- allocation order --------------------------------------------------------------------------


def test_allocates_in_order_skipping_the_gateway_until_exhausted(data_dir: Path) -> None:
    conf = make_conf(data_dir, {"subnet": "10.0.0.0/29"})
    assert [add(conf, f"c{i}")[0] for i in range(5)] == [f"10.0.0.{i}" for i in range(2, 7)]
    err = error_of("ADD", conf, cid="c9")
    assert (err.code, err.msg) == (
        ErrorCode.INTERNAL,
        "failed to allocate for range 0: no IP addresses available in range set: 10.0.0.1-10.0.0.6",
    )


def test_a_gateway_inside_the_range_is_skipped(data_dir: Path) -> None:
    conf = make_conf(data_dir, {"subnet": "10.0.0.0/29", "gateway": "10.0.0.3"})
    assert [add(conf, f"c{i}")[0] for i in range(3)] == ["10.0.0.1", "10.0.0.2", "10.0.0.4"]
    assert run("ADD", conf, "c3")["ips"][0]["gateway"] == "10.0.0.3"


def test_round_robin_continues_after_the_last_reserved_ip(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    assert add(conf, "a") == ["10.0.0.2"]
    assert add(conf, "b") == ["10.0.0.3"]
    run("DEL", conf, "a")
    assert add(conf, "c") == ["10.0.0.4"]  # not the freed .2
    assert (data_dir / NET / "last_reserved_ip.0").read_bytes() == b"10.0.0.4"


def test_round_robin_wraps_and_tries_the_last_reserved_ip_last(data_dir: Path) -> None:
    conf = make_conf(data_dir, {"subnet": "10.0.0.0/29"})
    for i in range(5):
        add(conf, f"c{i}")  # .2 ... .6, last reserved .6
    run("DEL", conf, "c0")
    assert add(conf, "x") == ["10.0.0.2"]  # wrapped past the end
    run("DEL", conf, "c3")  # frees .5
    (data_dir / NET / "last_reserved_ip.0").write_bytes(b"10.0.0.5")
    assert add(conf, "y") == ["10.0.0.5"]  # only the last reserved one is free: tried last, still found


def test_a_range_set_walks_its_ranges_in_turn(data_dir: Path) -> None:
    conf = make_conf(data_dir, {"ranges": [[{"subnet": "10.0.0.0/30"}, {"subnet": "10.0.1.0/30"}]]})
    assert add(conf, "a") == ["10.0.0.2"]
    assert add(conf, "b") == ["10.0.1.2"]
    assert error_of("ADD", conf, cid="c").msg == (
        "failed to allocate for range 0: no IP addresses available in range set: 10.0.0.1-10.0.0.2,10.0.1.1-10.0.1.2"
    )


def test_a_last_reserved_ip_outside_the_set_restarts_at_range_start(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    (data_dir / NET).mkdir(parents=True)
    (data_dir / NET / "last_reserved_ip.0").write_bytes(b"192.168.7.7")
    assert add(conf) == ["10.0.0.2"]


def test_ipv6_range_end_defaults_to_the_last_address(data_dir: Path) -> None:
    conf = make_conf(data_dir, {"subnet": "fd00::/120", "rangeStart": "fd00::fe"})
    assert add(conf, "a") == ["fd00::fe"]
    assert add(conf, "b") == ["fd00::ff"]
    assert error_of("ADD", conf, cid="c").msg.endswith("range set: fd00::fe-fd00::ff")


# --- requested IPs -----------------------------------------------------------------------------


def test_cni_args_ip_is_honoured_next_to_other_keys(data_dir: Path) -> None:
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;IP=10.0.0.77"
    assert add(make_conf(data_dir), args=args) == ["10.0.0.77"]
    assert (data_dir / NET / "last_reserved_ip.0").read_bytes() == b"10.0.0.77"


def test_requested_ips_from_args_and_runtime_config_go_to_their_range_sets(data_dir: Path) -> None:
    ipam = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}
    conf = make_conf(data_dir, ipam, args={"cni": {"ips": ["fd00::99/64"]}}, runtimeConfig={"ips": ["10.0.0.99"]})
    assert add(conf) == ["10.0.0.99", "fd00::99"]


def test_a_requested_gateway_is_refused(data_dir: Path) -> None:
    err = error_of("ADD", make_conf(data_dir), args="IP=10.0.0.1")
    assert err.msg == "failed to allocate for range 0: requested ip 10.0.0.1 is subnet's gateway"


def test_a_requested_ip_in_use_is_refused(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "a", args="IP=10.0.0.5")
    err = error_of("ADD", conf, cid="b", args="IP=10.0.0.5")
    assert err.msg == (
        "failed to allocate for range 0: requested IP address 10.0.0.5 is not available in range set "
        "10.0.0.1-10.0.0.254"
    )


def test_unplaceable_requested_ips_fail_and_roll_back(data_dir: Path) -> None:
    conf = make_conf(data_dir, runtimeConfig={"ips": ["10.9.0.9", "10.0.0.7", "10.0.0.8"]})
    err = error_of("ADD", conf)
    assert err.msg == "failed to allocate all requested IPs: 10.9.0.9 10.0.0.8"
    assert leases(data_dir) == {}


def test_a_failed_add_frees_only_what_it_reserved_not_the_attachments_earlier_leases(data_dir: Path) -> None:
    """Range 0 takes the requested IP, range 1 finds the attachment's earlier lease (duplicate):
    the failed ADD frees its one reservation; a release by ID (Go's) freed the earlier leases too."""
    ipam = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]]}
    conf = make_conf(data_dir, ipam)
    add(conf)
    before = leases(data_dir)
    err = error_of("ADD", conf, args="IP=10.0.0.50")
    assert "duplicate allocation is not allowed" in err.msg
    assert leases(data_dir) == before


def test_requested_ips_skip_the_duplicate_check(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf)
    assert add(conf, args="IP=10.0.0.50") == ["10.0.0.50"]


# --- duplicates, release, CHECK ----------------------------------------------------------------


def test_a_second_add_for_the_same_attachment_is_a_duplicate(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf)
    err = error_of("ADD", conf)
    assert (
        err.msg
        == "failed to allocate for range 0: 10.0.0.2 has been allocated to ctr1, duplicate allocation is not allowed"
    )
    assert add(conf, ifname="eth1") == ["10.0.0.3"]


def test_a_failed_later_range_set_releases_the_earlier_ones(data_dir: Path) -> None:
    ipam = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/30"}]]}
    conf = make_conf(data_dir, ipam)
    add(conf, "a")
    err = error_of("ADD", conf, cid="b")
    assert err.msg.startswith("failed to allocate for range 1: no IP addresses available")
    assert sorted(leases(data_dir)) == ["10.0.0.2", "10.1.0.2"]


def test_del_releases_only_that_attachment_and_is_idempotent(data_dir: Path) -> None:
    ipam = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}
    conf = make_conf(data_dir, ipam)
    add(conf, "a")
    add(conf, "a", ifname="eth1")
    add(conf, "b")
    run("DEL", conf, "a")
    run("DEL", conf, "a")
    assert leases(data_dir) == {
        "10.0.0.3": b"a\r\neth1",
        "fd00::3": b"a\r\neth1",
        "10.0.0.4": b"b\r\neth0",
        "fd00::4": b"b\r\neth0",
    }


def test_a_lease_longer_than_4096_bytes_is_read_whole_and_released(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    long_id = "c" * 4100  # another tool's lease: pycni refuses such IDs before host-local runs
    add(conf, "other")
    (data_dir / NET / "10.0.0.9").write_bytes(long_id.encode() + b"\r\neth0")
    run("CHECK", conf, long_id)
    run("DEL", conf, long_id)
    assert list(leases(data_dir)) == ["10.0.0.2"]


def test_del_falls_back_to_legacy_bare_id_files(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf, "other")
    (data_dir / NET / "10.0.0.9").write_bytes(b"ctr1\n")
    run("CHECK", conf)
    run("DEL", conf)
    assert list(leases(data_dir)) == ["10.0.0.2"]


@pytest.mark.parametrize(("range_sets", "left"), [(1, ["10.0.0.9"]), (2, [])])
def test_legacy_files_also_go_when_a_second_range_set_releases_again(
    data_dir: Path, range_sets: int, left: list[str]
) -> None:
    # Go calls ReleaseByID once per range set; the second call finds no new-format file left
    # and so removes the legacy ones too.
    conf = make_conf(data_dir, {"ranges": [[{"subnet": f"10.{i}.0.0/24"}] for i in range(range_sets)]})
    add(conf)
    (data_dir / NET / "10.0.0.9").write_bytes(b"ctr1")
    run("DEL", conf)
    assert list(leases(data_dir)) == left


def test_check_finds_any_lease_of_the_attachment(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    add(conf)
    run("CHECK", conf)
    run("DEL", conf)
    err = error_of("CHECK", conf)
    assert (err.code, err.msg) == (ErrorCode.INTERNAL, "host-local: Failed to find address added by container ctr1")


# --- results -----------------------------------------------------------------------------------

DUAL = {
    "ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64", "gateway": "fd00::fe"}]],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00::9"}, {"dst": "10.9.0.5/16", "gw": "10.0.0.9"}],
}


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (
            "0.2.0",
            {
                "cniVersion": "0.2.0",
                "ip4": {
                    "ip": "10.0.0.2/24",
                    "gateway": "10.0.0.1",
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.5/16", "gw": "10.0.0.9"}],
                },
                "ip6": {"ip": "fd00::1/64", "gateway": "fd00::fe", "routes": [{"dst": "::/0", "gw": "fd00::9"}]},
                "dns": {},
            },
        ),
        *[
            (
                v,
                {
                    "cniVersion": v,
                    "ips": [
                        {"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.1"},
                        {"version": "6", "address": "fd00::1/64", "gateway": "fd00::fe"},
                    ],
                    "routes": DUAL["routes"],
                    "dns": {},
                },
            )
            for v in ("0.3.1", "0.4.0")
        ],
        *[
            (
                v,
                {
                    "cniVersion": v,
                    "ips": [
                        {"address": "10.0.0.2/24", "gateway": "10.0.0.1"},
                        {"address": "fd00::1/64", "gateway": "fd00::fe"},
                    ],
                    "routes": DUAL["routes"],
                },
            )
            for v in ("1.0.0", "1.1.0")
        ],
    ],
)
def test_result_shape_per_version(data_dir: Path, version: str, expected: dict) -> None:
    result = run("ADD", make_conf(data_dir, DUAL, version=version))
    assert result == expected
    assert list(result) == list(expected)  # key order as the Go plugin prints it
    types = pytest.importorskip("pycni.types")
    assert types.parse_result(result).to_json() == result


def test_an_empty_version_answers_in_the_0_1_0_shape(data_dir: Path) -> None:
    result = run("ADD", make_conf(data_dir, version=""))
    assert result == {"cniVersion": "0.1.0", "ip4": {"ip": "10.0.0.2/24", "gateway": "10.0.0.1"}, "dns": {}}


def test_resolv_conf_becomes_the_result_dns(data_dir: Path, tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(
        "# comment\n; other comment\nnameserver 1.1.1.1\n  nameserver   8.8.8.8  # trailing\n"
        "domain a.example\ndomain b.example\nsearch x.example y.example\nsearch z.example\n"
        "options ndots:2 edns0\nnameserver\nbogus line here\n"
    )
    dns = {
        "nameservers": ["1.1.1.1", "8.8.8.8"],
        "domain": "b.example",
        "search": ["x.example", "y.example", "z.example"],
        "options": ["ndots:2", "edns0"],
    }
    ipam = {"subnet": "10.0.0.0/24", "resolvConf": str(resolv)}
    assert run("ADD", make_conf(data_dir, ipam), "a")["dns"] == dns
    assert run("ADD", make_conf(data_dir, ipam, version="1.0.0"), "b")["dns"] == dns


def test_route_1_1_attributes_pass_through(data_dir: Path) -> None:
    ipam = {"subnet": "10.0.0.0/24", "routes": [{"dst": "10.8.0.0/16", "mtu": 1400, "priority": 0, "table": 0}]}
    assert run("ADD", make_conf(data_dir, ipam, version="1.1.0"))["routes"] == [
        {"dst": "10.8.0.0/16", "mtu": 1400, "table": 0}
    ]


# --- the on-disk format and its safety ---------------------------------------------------------


def test_disk_format(data_dir: Path) -> None:
    old = os.umask(0o022)
    try:
        add(make_conf(data_dir, {"subnet": "fd00::/64"}), " spaced-id ")
    finally:
        os.umask(old)
    net = data_dir / NET
    assert sorted(os.listdir(net)) == ["fd00::2", "last_reserved_ip.0", "lock"]
    assert (net / "fd00::2").read_bytes() == b"spaced-id\r\neth0"
    assert (net / "last_reserved_ip.0").read_bytes() == b"fd00::2"
    assert (net / "lock").read_bytes() == b""
    assert stat.S_IMODE(net.stat().st_mode) == 0o755
    assert stat.S_IMODE((net / "fd00::2").stat().st_mode) == 0o600
    assert stat.S_IMODE((net / "last_reserved_ip.0").stat().st_mode) == 0o600


def test_a_symlinked_network_dir_is_refused(data_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data_dir.mkdir()
    (data_dir / NET).symlink_to(elsewhere)
    err = error_of("ADD", make_conf(data_dir))
    assert "symbolic link" in err.msg
    assert list(elsewhere.iterdir()) == []


def test_an_existing_network_dir_is_opened_in_one_step_and_a_missing_one_is_made(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open = os.open

    def record(path: str, flags: int, *args: Any, **kw: Any) -> int:
        if flags & os.O_DIRECTORY:
            opened.append(str(path))
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", record)
    with DiskStore(str(data_dir), NET):  # neither there: the slow way, which makes both
        pass
    assert (data_dir / NET).is_dir() and opened[0] == str(data_dir / NET)
    opened.clear()
    with DiskStore(str(data_dir), NET):
        pass
    assert opened == [str(data_dir / NET)]


@pytest.mark.parametrize("planted", ["lock", "last_reserved_ip.0"])
def test_planted_symlinks_to_state_files_are_not_followed(data_dir: Path, tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (data_dir / NET).mkdir(parents=True)
    (data_dir / NET / planted).symlink_to(victim)
    err = error_of("ADD", make_conf(data_dir))
    assert "symbolic link" in err.msg
    assert victim.read_bytes() == b"precious"
    assert leases(data_dir) == {}  # the half-made reservation was undone


def test_planted_lease_symlinks_and_fifos_are_skipped_not_followed(data_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"ctr1\r\neth0")
    net = data_dir / NET
    net.mkdir(parents=True)
    (net / "10.0.0.2").symlink_to(victim)
    os.mkfifo(net / "10.0.0.3")
    conf = make_conf(data_dir)
    assert add(conf) == ["10.0.0.4"]  # taken names are skipped; the scan neither follows nor blocks
    run("DEL", conf)
    assert victim.read_bytes() == b"ctr1\r\neth0"
    assert (net / "10.0.0.2").is_symlink()
    assert not (net / "10.0.0.4").exists()


# --- concurrency -------------------------------------------------------------------------------


def slow_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Widen the window between the duplicate-check scan and the reservation."""
    find = DiskStore.find

    def slow(self: Any, *args: Any) -> Any:
        found = find(self, *args)
        time.sleep(0.01)
        return found

    monkeypatch.setattr(DiskStore, "find", slow)


def test_threads_allocate_distinct_ips(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    barrier = threading.Barrier(50)
    got: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            got[i] = add(conf, f"t{i}")
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ips = [ip for v in got.values() for ip in v]
    assert len(set(ips)) == 50
    assert set(leases(data_dir)) == set(ips)


def test_concurrent_adds_of_one_attachment_make_one_lease(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # O_EXCL alone keeps IPs distinct; the lock is what makes the duplicate check atomic.
    slow_scan(monkeypatch)
    conf = make_conf(data_dir)
    barrier = threading.Barrier(20)
    outcomes: list[str] = []

    def worker() -> None:
        barrier.wait()
        try:
            outcomes.append(add(conf, "same")[0])
        except CNIError as e:
            outcomes.append(e.msg)

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(not o.startswith("failed") for o in outcomes) == 1, outcomes
    assert sum(content == b"same\r\neth0" for content in leases(data_dir).values()) == 1


def _process_worker(conf: dict, prefix: str, count: int, start: Any) -> list[str]:
    start.wait()
    return [add(conf, f"{prefix}-{i}")[0] for i in range(count)]


def test_processes_allocate_distinct_ips(data_dir: Path) -> None:
    conf = make_conf(data_dir)
    ctx = multiprocessing.get_context("fork")
    start = ctx.Manager().Event()
    with ctx.Pool(4) as pool:
        pending = [pool.apply_async(_process_worker, (conf, f"p{n}", 25, start)) for n in range(4)]
        start.set()
        ips = [ip for job in pending for ip in job.get(timeout=60)]
    assert len(ips) == 100
    assert len(set(ips)) == 100
    assert set(leases(data_dir)) == set(ips)


def test_the_ipam_leases_hook_lists_every_lease_of_the_network_and_creates_nothing(tmp_path: Path) -> None:
    from pycni_plugins.host_local import network_leases

    ipam = {"type": "host-local", "dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": "198.18.9.0/24"}]]}
    bridge = {"type": "bridge", "ipam": ipam}
    assert network_leases(NET, bridge) == [] and not (tmp_path / "ipam").exists()
    d = tmp_path / "ipam" / NET
    d.mkdir(parents=True)
    (d / "198.18.9.2").write_bytes(b"ctr1\r\neth0")
    (d / "198.18.9.3").write_bytes(b"old")  # a legacy bare-ID lease
    (d / "last_reserved_ip.0").write_bytes(b"198.18.9.3")
    assert network_leases(NET, bridge) == [("198.18.9.2", "ctr1/eth0"), ("198.18.9.3", "old (legacy lease)")]
    assert network_leases(NET, ipam) == network_leases(NET, bridge)
    assert network_leases(NET, {"type": "bridge", "ipam": {"type": "static"}}) == []


def test_a_gc_dry_run_of_a_network_without_leases_makes_no_directory(tmp_path: Path) -> None:
    conf = make_conf(tmp_path / "ipam", version="1.1.0") | {"pycni.dev/dry-run": True}
    assert run("GC", conf) == {"removed": []}
    assert not (tmp_path / "ipam").exists()

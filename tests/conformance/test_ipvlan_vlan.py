"""ipvlan and vlan: pycni (in-process and exec'd) against Debian's Go plugins, twin worlds.

This machine's kernel has neither the ipvlan nor the 802.1Q driver. Everything short of making
the link runs whatever the kernel: config refusals, the missing driver's error (and that it
leaves nothing behind), DEL of what is not there, CHECK's prevResult handling. Only the tests
that need a link made skip, saying which driver is missing.
"""

from __future__ import annotations

import functools
import re

import pytest

from pycni.errors import CNIError
from pycni_plugins._sublink import DRIVERS

from .links_harness import MASTER, World, host_local, kernel_has, worlds
from .twins import differences

pytestmark = [pytest.mark.privileged, pytest.mark.reference]

KINDS = ("ipvlan", "vlan")


@functools.cache
def _has(kind: str) -> bool:
    return kernel_has(kind)


def _need(kind: str) -> None:
    if not _has(kind):
        pytest.skip(f"this kernel has no {kind} driver ({DRIVERS[kind]} is not set): the link cannot be made")


def _conf(kind: str, world: World, **extra: object) -> dict:
    base: dict = {"type": kind, "master": MASTER, "ipam": host_local(world.root / "ipam")}
    if kind == "vlan":
        base["vlanId"] = 42
    return {**base, **extra}


def _leases(world: World) -> list:
    return list((world.root / "ipam").glob("*/198.*"))


@pytest.mark.parametrize("kind", KINDS)
def test_add_check_del_match_the_reference(make_netns, tmp_path, kind):
    _need(kind)
    pair = worlds(tmp_path, make_netns)
    seen = {}
    for impl, w in pair.items():
        net = w.network("1.0.0", _conf(kind, w, mtu=1400))
        w.add(net)
        w.check(net)
        result = w.normalise(w.result.to_json())
        result.pop("dns", None) if impl == "go" and result.get("dns") == {} else None
        seen[impl] = (result, w.snapshot())
        w.delete(net)
        w.delete(net)
        assert set(w.snapshot()["container"]["links"]) == {"lo"} and not _leases(w), impl
    expected = [] if kind == "vlan" else [("/container/sysctls/net/ipv6/conf/eth0/ndisc_notify", "0", "1")]
    for impl in ("pycni", "pycni-exec"):
        assert seen[impl][0] == seen["go"][0], impl
        assert differences(seen["go"][1], seen[impl][1]) == expected, impl


@pytest.mark.parametrize("kind", KINDS)
def test_without_the_driver_add_fails_naming_it_and_leaves_nothing(make_netns, tmp_path, kind):
    if _has(kind):
        pytest.skip(f"this kernel has the {kind} driver: its absence cannot be shown here")
    pair = worlds(tmp_path, make_netns)
    for impl, w in pair.items():
        net = w.network("1.0.0", _conf(kind, w))
        before = w.snapshot()
        with pytest.raises(CNIError) as err:
            w.add(net)
        if impl == "go":
            assert "operation not supported" in err.value.msg
        else:
            assert err.value.code == 999
            assert f"failed to create {kind}: this kernel has no {kind} driver ({DRIVERS[kind]} is not set)" in (
                err.value.msg
            )
        assert w.snapshot() == before and not _leases(w), impl
        assert not w.runtime.get_cached_attachments("ctr1"), impl


HOSTILE = {
    "ipvlan": [
        ({"mode": "l4"}, 'unknown ipvlan mode: "l4"'),
        ({"master": "nosuch0"}, 'failed to lookup master "nosuch0": Link not found'),
        ({"master": ""}, "no default route interface found"),
        ({"ipam": {}}, "no plugin name provided"),
        ({"mode": ["l2"]}, "cannot unmarshal array into Go struct field .mode of type string"),
    ],
    "vlan": [
        ({"master": ""}, '"master" field is required'),
        ({"vlanId": 4095}, r"invalid VLAN ID 4095 \(must be between 0 and 4095 inclusive\)"),
        ({"vlanId": -1}, r"invalid VLAN ID -1"),
        ({"vlanId": "42"}, "cannot unmarshal string into Go struct field .vlanId of type int"),
        ({"mtu": 9001}, r"invalid MTU 9001, must be \[0, master MTU\(1500\)\]"),
        ({"mtu": -5}, r"invalid MTU -5"),
        ({"master": "nosuch0"}, 'failed to lookup master "nosuch0": Link not found'),
        ({"ipam": {}}, "no plugin name provided"),
    ],
}
CASES = [(kind, extra, msg) for kind, cases in HOSTILE.items() for extra, msg in cases]


@pytest.mark.parametrize("kind,extra,message", CASES, ids=[f"{k}-{m[:28]}" for k, _, m in CASES])
def test_hostile_configs_are_refused_before_anything_changes(make_netns, tmp_path, kind, extra, message):
    pair = worlds(tmp_path, make_netns)
    for impl, w in pair.items():
        net = w.network("1.0.0", _conf(kind, w, **extra))
        before = w.snapshot()
        with pytest.raises(CNIError) as err:
            w.add(net)
        if impl != "go":
            assert err.value.code == 999 and re.search(message, err.value.msg), err.value
        assert w.snapshot() == before and not _leases(w), impl


@pytest.mark.parametrize("kind", KINDS)
def test_del_of_what_is_not_there_succeeds(make_netns, tmp_path, kind):
    pair = worlds(tmp_path, make_netns)
    for impl, w in pair.items():
        net = w.network("1.0.0", _conf(kind, w))
        before = w.snapshot()
        w.delete(net)
        w.delete(net)
        assert w.snapshot() == before, impl


@pytest.mark.parametrize("kind", KINDS)
def test_check_prev_result_handling_matches_the_reference(make_netns, tmp_path, kind):
    """CHECK with no prevResult, with one for another namespace, and with one naming an
    interface the container does not have: the same errors as the Go plugins'."""
    pair = worlds(tmp_path, make_netns)
    messages: dict[str, list[str]] = {}
    for impl, w in pair.items():
        conf = _conf(kind, w)
        w.call("ADD", {"type": "host-local", "ipam": conf["ipam"]})  # so that IPAM CHECK passes
        eth0 = {"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": w.ctr.path}
        ip = {"address": "198.18.1.10/24", "interface": 0}
        prevs = [
            None,
            {"cniVersion": "1.0.0", "interfaces": [{**eth0, "sandbox": "/run/netns/other"}], "ips": [ip]},
            {"cniVersion": "1.0.0", "interfaces": [eth0], "ips": [ip]},
        ]
        out = []
        for prev in prevs:
            with pytest.raises(CNIError) as err:
                w.call("CHECK", conf if prev is None else {**conf, "prevResult": prev})
            out.append(w.normalise(err.value.msg))
        messages[impl] = out
    assert messages["pycni"] == messages["pycni-exec"]
    go = messages["go"]
    assert messages["pycni"][0] == go[0]
    assert messages["pycni"][1:] == go[1:]

"""macvlan: pycni (in-process and exec'd) against Debian's Go plugin, in twin throwaway worlds.

Expected differences from 1.1.1 (pycni follows v1.9.1): ``ndisc_notify=1`` on the container
interface, ``keep_addr_on_down=1`` with IPv6, and 1.1.1's always-printed ``"dns": {}``.
"""

from __future__ import annotations

import re

import pytest

from pycni.errors import CNIError

from .links_harness import MASTER, World, host_local, worlds
from .twins import differences

pytestmark = [pytest.mark.privileged, pytest.mark.reference]


def _expected(version: str, families: tuple[int, ...]) -> list[tuple[str, object, object]]:
    out: list[tuple[str, object, object]] = [("/container/sysctls/net/ipv6/conf/eth0/ndisc_notify", "0", "1")]
    if 6 in families:
        out.append(("/container/sysctls/net/ipv6/conf/eth0/keep_addr_on_down", "0", "1"))
    return out


def _result(world: World, version: str) -> dict:
    assert world.result is not None
    out = world.normalise(world.result.to_json())
    if world.impl == "go" and version == "1.0.0" and out.get("dns") == {}:
        out.pop("dns")  # 1.1.1 always prints an empty dns; v1.9.1 omits it
    return out


@pytest.mark.parametrize(
    "version,mode,families",
    [("1.0.0", "bridge", (4,)), ("0.4.0", "private", (4,)), ("1.0.0", "vepa", (4, 6)), ("1.1.0", "", (4,))],
)
def test_macvlan_add_check_del_match_the_reference(make_netns, tmp_path, version, mode, families):
    if version == "1.1.0":
        version_go = "1.0.0"  # 1.1.1 knows no 1.1.0; the pycni worlds run 1.1.0 and are compared to it
    else:
        version_go = version
    pair = worlds(tmp_path, make_netns)
    seen = {}
    for impl, w in pair.items():
        conf = {
            "type": "macvlan",
            "master": MASTER,
            "mode": mode,
            "mtu": 1400,
            "ipam": host_local(w.root / "ipam", families),
        }
        net = w.network(version_go if impl == "go" else version, conf)
        w.add(net)
        w.check(net)
        seen[impl] = (_result(w, version), w.snapshot(), w.reaches_lan(4), 6 not in families or w.reaches_lan(6))
        w.delete(net)
        w.delete(net)  # DEL is idempotent
        after = w.snapshot()
        assert set(after["container"]["links"]) == {"lo"}, impl
        assert not list((w.root / "ipam").glob("*/198.*")), impl
        assert not w.runtime.get_cached_attachments("ctr1")
    go = seen["go"]
    for impl in ("pycni", "pycni-exec"):
        ours = seen[impl]
        if version == "1.1.0":
            assert ours[0]["cniVersion"] == "1.1.0"
            ours = ({**ours[0], "cniVersion": "1.0.0"}, *ours[1:])
        assert ours[0] == go[0], impl
        assert sorted(differences(go[1], ours[1])) == sorted(_expected(version, families)), impl
        assert ours[2:] == go[2:] == (True, True), impl
    container = seen["pycni"][1]["container"]["links"]["eth0"]
    assert container["kind"] == "macvlan" and container["mtu"] == 1400
    assert container["data"]["IFLA_MACVLAN_MODE"] == (mode or "bridge")


def test_macvlan_mac_from_args_and_runtime_config(make_netns, tmp_path):
    pair = worlds(tmp_path, make_netns)
    macs = {}
    for impl, w in pair.items():
        conf = {"type": "macvlan", "master": MASTER, "mac": "02:00:00:00:00:01", "capabilities": {"mac": True}}
        net = w.network("1.0.0", conf)
        w.rt = w.rt.__class__("ctr1", w.ctr.path, "eth0", args=[("MAC", "02:00:00:00:00:02")])
        w.add(net)
        macs[impl, "args"] = w.result.interfaces[0].mac
        w.delete(net)
        w.rt = w.rt.__class__("ctr1", w.ctr.path, "eth0", capability_args={"mac": "02:00:00:00:00:03"})
        w.add(net)
        macs[impl, "runtimeConfig"] = w.result.interfaces[0].mac
        w.delete(net)
    for impl in pair:
        assert macs[impl, "args"] == "02:00:00:00:00:02", impl
        assert macs[impl, "runtimeConfig"] == "02:00:00:00:00:03", impl


def test_macvlan_link_in_container(make_netns, tmp_path):
    """The master lives in the container namespace (v1.9.1's ``linkInContainer``; 1.1.1 ignores
    the key and looks for the master on the host, where it is missing)."""
    pair = worlds(tmp_path, make_netns)
    for impl, w in pair.items():
        from pycni import netns

        netns.run_in(w.ctr.path, _make_veth, "cmst0")
        net = w.network("1.0.0", {"type": "macvlan", "master": "cmst0", "linkInContainer": True})
        if impl == "go":
            with pytest.raises(CNIError, match="Link not found"):
                w.add(net)
            continue
        w.add(net)
        state = w.snapshot()["container"]["links"]
        assert state["eth0"]["kind"] == "macvlan" and state["eth0"]["up"]
        w.delete(net)
        assert "eth0" not in w.snapshot()["container"]["links"]


def _make_veth(name: str) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("add", ifname=name, kind="veth", peer=f"{name}p", state="up")


HOSTILE = [
    ({"master": "nosuch0"}, 'failed to lookup master "nosuch0": Link not found'),
    ({"master": "lo"}, 'master "lo"'),
    ({"master": MASTER, "mtu": 9001}, r"invalid MTU 9001, must be \[0, master MTU\(1500\)\]"),
    ({"master": MASTER, "mtu": -1}, r"invalid MTU -1"),
    ({"master": MASTER, "mode": "source"}, 'unknown macvlan mode: "source"'),
    ({"master": MASTER, "mac": "02:00:00:00:00"}, "invalid MAC address"),
    ({"master": MASTER, "mac": "../../etc"}, "invalid MAC address"),
    ({"master": MASTER, "bcqueuelen": 2**32}, "bcqueuelen"),  # 1.1.1 ignores the key: only pycni's worlds
    ({"master": MASTER, "mode": 7}, "cannot unmarshal number into Go struct field .mode of type string"),
    ({}, "no default route interface found"),
]


@pytest.mark.parametrize("extra,message", HOSTILE, ids=[m[:30] for _, m in HOSTILE])
def test_hostile_macvlan_configs_are_refused_before_anything_changes(make_netns, tmp_path, extra, message):
    pair = worlds(tmp_path, make_netns)
    for impl, w in pair.items():
        if impl == "go" and "bcqueuelen" in extra:
            continue
        conf = {"type": "macvlan", **extra, "ipam": host_local(w.root / "ipam")}
        net = w.network("1.0.0", conf)
        before = w.snapshot()
        with pytest.raises(CNIError) as err:
            w.add(net)
        if impl != "go":
            assert err.value.code == 999 and re.search(message, err.value.msg), err.value
        assert differences(before, w.snapshot()) == [], impl
        assert not list((w.root / "ipam").glob("*/198.*")), impl

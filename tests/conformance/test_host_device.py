"""host-device: pycni (in-process and exec'd) against Debian's Go plugin, in twin throwaway worlds.

The device is the host end ``mst0`` of a veth to the world's "lan" namespace, addressed on the
host (198.18.1.5/24). Expected differences after DEL: pycni puts the device's host address and
up state back (the reference leaves it down and without addresses), and 1.1.1 leaves the alias
set (v1.9.1 and pycni clear it).
"""

from __future__ import annotations

import re

import pytest

from pycni import netns
from pycni.errors import CNIError

from .links_harness import MASTER, World, host_local, read_state, worlds
from .twins import differences

pytestmark = [pytest.mark.privileged, pytest.mark.reference]

HOST_ADDR = "198.18.1.5/24"


def _address_host_device(world: World) -> None:
    def body() -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname=MASTER)[0]
            ipr.addr("add", index=index, address="198.18.1.5", prefixlen=24, flags=0x02)

    netns.run_in(world.host.path, body)


def _without_link_local(state: dict) -> dict:
    """The snapshot without IPv6 link-local addresses: the kernel adds one a moment after a
    device comes up, whenever that is."""
    for side in state.values():
        for link in side["links"].values():
            link["addresses"] = [a for a in link["addresses"] if a != "fe80::LL/64"]
        side["routes"] = [r for r in side["routes"] if " fe80::/64 " not in r]
    return state


def _result(world: World) -> dict:
    assert world.result is not None
    out = world.normalise(world.result.to_json())
    if world.impl == "go" and out.get("dns") == {}:
        out.pop("dns")
    return out


@pytest.mark.parametrize("select", ["device", "hwaddr"])
@pytest.mark.parametrize("ipam", [True, False])
def test_host_device_add_check_del_match_the_reference(make_netns, tmp_path, select, ipam):
    pair = worlds(tmp_path, make_netns)
    seen = {}
    for impl, w in pair.items():
        _address_host_device(w)
        before = _without_link_local(w.snapshot())
        conf = {"type": "host-device"}
        if select == "device":
            conf["device"] = MASTER
        else:
            conf["hwaddr"] = netns.run_in(w.host.path, read_state)["links"][MASTER]["mac"].upper()
        if ipam:
            conf["ipam"] = host_local(w.root / "ipam")
        net = w.network("1.0.0", conf)
        w.add(net)
        w.check(net)
        during = _without_link_local(w.snapshot())
        reaches = w.reaches_lan(4) if ipam else None
        w.delete(net)
        after = _without_link_local(w.snapshot())
        if impl == "go":  # the reference's second DEL fails: the device is no longer there
            with pytest.raises(CNIError, match='failed to find "eth0"'):
                w.delete(net)
        else:
            w.delete(net)  # pycni: a repeated DEL succeeds and changes nothing
        assert _without_link_local(w.snapshot()) == after, impl
        seen[impl] = (_result(w), during, reaches, differences(before, after))
        assert MASTER not in during["host"]["links"] and during["container"]["links"]["eth0"]["alias"] == MASTER
    go = seen["go"]
    # the Go plugin's DEL: the device comes back down, without its host address, alias left set
    assert sorted(go[3]) == sorted(
        [
            (f"/host/links/{MASTER}/addresses", [HOST_ADDR], []),
            ("/host/routes", [f"table 254 198.18.1.0/24 via None dev {MASTER} src 198.18.1.5 metric None"], []),
            (f"/host/links/{MASTER}/alias", None, MASTER),
            (f"/host/links/{MASTER}/up", True, False),
        ]
    ), go[3]
    for impl in ("pycni", "pycni-exec"):
        ours = seen[impl]
        assert ours[0] == go[0], impl
        assert differences(go[1], ours[1]) == [], impl
        assert ours[2] == go[2], impl
        assert ours[3] == [], impl  # everything as it was before ADD
    if ipam:
        assert go[2] is True


def test_host_device_default_route_device_is_refused_and_nothing_changes(make_netns, tmp_path):
    pair = worlds(tmp_path, make_netns)
    for impl, w in pair.items():
        _address_host_device(w)

        def default_route() -> None:
            from pyroute2 import IPRoute

            with IPRoute() as ipr:
                ipr.route("add", dst="0.0.0.0/0", gateway="198.18.1.1")

        netns.run_in(w.host.path, default_route)
        net = w.network("1.0.0", {"type": "host-device", "device": MASTER, "ipam": host_local(w.root / "ipam")})
        before = w.snapshot()
        if impl == "go":  # the reference moves it: the host loses its default route
            w.add(net)
            assert MASTER not in w.snapshot()["host"]["links"]
            w.delete(net)
            continue
        with pytest.raises(CNIError) as err:
            w.add(net)
        assert err.value.code == 7 and "carries the host namespace's default route" in err.value.msg
        assert w.snapshot() == before
        assert not list((w.root / "ipam").glob("*/198.*"))


HOSTILE = [
    ({}, 'specify either "device", "hwaddr", "kernelpath" or "pciBusID"', 999),
    ({"device": "nosuch0"}, "failed to find host device: Link not found", 999),
    ({"device": "lo"}, 'refusing to move "lo": it is the loopback device', 7),
    ({"hwaddr": "02:00:00:00:00"}, "failed to parse MAC address", 999),
    ({"hwaddr": "02:00:00:00:00:99"}, "failed to find physical interface", 999),
    ({"kernelpath": "/etc/../sys/devices"}, "must be absolute and begin with /sys/devices/", 999),
    ({"kernelpath": "/sys/devices/../../etc"}, "must be absolute and begin with /sys/devices/", 999),
    ({"pciBusID": "0000:ff:1f.7"}, "error with host device", 999),
    ({"pciBusID": "../../../etc"}, "error with host device", 999),
    ({"runtimeConfig": {"deviceID": "../x"}}, "runtime config DeviceID ../x not found or unsupported", 999),
    ({"device": 5}, "cannot unmarshal number into Go struct field .device of type string", 999),
]


@pytest.mark.parametrize("extra,message,code", HOSTILE, ids=[m[:30] for _, m, _ in HOSTILE])
def test_hostile_host_device_configs_are_refused_before_anything_changes(make_netns, tmp_path, extra, message, code):
    pair = worlds(tmp_path, make_netns)
    for impl, w in pair.items():
        net = w.network("1.0.0", {"type": "host-device", **extra, "ipam": host_local(w.root / "ipam")})
        before = w.snapshot()
        if impl == "go" and (
            extra.get("device") == "lo"
            or "/.." in str(extra.get("kernelpath", ""))
            and "etc" in str(extra.get("kernelpath", "")).split("/")[-1]
        ):
            continue  # the reference would move lo / read /etc/net: not run
        with pytest.raises(CNIError) as err:
            w.add(net)
        if impl != "go":
            assert err.value.code == code and re.search(re.escape(message), err.value.msg), err.value
        assert w.snapshot() == before, impl
        assert not list((w.root / "ipam").glob("*/198.*")), impl

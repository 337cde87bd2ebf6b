"""vrf: pycni (in-process and exec'd) against Debian's Go plugin, in twin throwaway worlds.

The container interface is a veth ``eth0`` made in the container namespace and addressed
there, named by a hand-made prevResult. This machine's kernel has no VRF support
(CONFIG_NET_VRF): everything short of making the VRF runs whatever the kernel, only the tests
that need one skip, saying so.
"""

from __future__ import annotations

import functools
import time

import pytest

from pycni import netns
from pycni.errors import CNIError

from .links_harness import World, kernel_has, worlds

pytestmark = [pytest.mark.privileged, pytest.mark.reference]


@functools.cache
def _has_vrf() -> bool:
    return kernel_has("vrf")


def _eth0() -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("add", ifname="eth0", kind="veth", peer="eth0p", state="up")
        index = ipr.link_lookup(ifname="eth0")[0]
        ipr.link("set", index=ipr.link_lookup(ifname="eth0p")[0], state="up")
        ipr.addr("add", index=index, address="198.18.1.10", prefixlen=24)
        ipr.addr("add", index=index, address="fd00:18:1::10", prefixlen=64, flags=0x02)
        ipr.route("add", dst="198.18.2.0/24", gateway="198.18.1.1", oif=index)
        for _ in range(200):  # the kernel adds the link-local address a moment after the link is up
            if any(a.get("address", "").startswith("fe80") for a in ipr.addr("dump", index=index)):
                break
            time.sleep(0.01)


PREV = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "SANDBOX"}],
    "ips": [{"address": "198.18.1.10/24", "interface": 0}],
}


def _setup(w: World) -> dict:
    netns.run_in(w.ctr.path, _eth0)
    w.settle()
    return {**PREV, "interfaces": [{"name": "eth0", "sandbox": w.ctr.path}]}


def test_vrf_add_check_del_match_the_reference(make_netns, tmp_path):
    if not _has_vrf():
        pytest.skip("this kernel has no VRF support (CONFIG_NET_VRF is not set): the VRF cannot be made")
    pair = worlds(tmp_path, make_netns)
    seen = {}
    for impl, w in pair.items():
        prev = _setup(w)
        conf = {"type": "vrf", "vrfname": "blue", "prevResult": prev}
        out = w.call("ADD", conf)
        w.call("CHECK", conf)
        seen[impl] = (w.normalise(out), w.snapshot())
        w.call("DEL", conf)
        state = w.snapshot()["container"]["links"]
        assert "blue" not in state and state["eth0"]["master"] is None, impl
    for impl in ("pycni", "pycni-exec"):
        assert seen[impl] == seen["go"], impl


def test_without_vrf_support_add_fails_naming_it_and_changes_nothing(make_netns, tmp_path):
    if _has_vrf():
        pytest.skip("this kernel has VRF support: its absence cannot be shown here")
    pair = worlds(tmp_path, make_netns)
    for impl, w in pair.items():
        conf = {"type": "vrf", "vrfname": "blue", "table": 1001, "prevResult": _setup(w)}
        before = w.snapshot()
        with pytest.raises(CNIError) as err:
            w.call("ADD", conf)
        if impl == "go":
            assert err.value.msg == "cmdAdd failed: could not add VRF blue: operation not supported"
        else:
            assert err.value.code == 999 and err.value.msg == (
                "cmdAdd failed: could not add VRF blue: this kernel has no VRF support "
                "(CONFIG_NET_VRF is not set): Operation not supported"
            )
        assert w.snapshot() == before, impl


def test_vrf_errors_match_the_reference(make_netns, tmp_path):
    """The same refusals, word for word, and nothing changed: no vrfname, no prevResult, a
    vrfname taken by a link that is no VRF, a version before 0.3.1; DEL with no VRF there
    succeeds. CHECK with no VRF there fails as in v1.9.1 (1.1.1 dropped the error)."""
    pair = worlds(tmp_path, make_netns)
    answers: dict[str, list] = {}
    for impl, w in pair.items():
        prev = _setup(w)
        cases = [
            ("ADD", {"type": "vrf", "prevResult": prev}),
            ("ADD", {"type": "vrf", "vrfname": "blue"}),
            ("ADD", {"type": "vrf", "vrfname": "eth0p", "prevResult": prev}),
            ("CHECK", {"type": "vrf", "vrfname": "blue"}),
            ("ADD", {"type": "vrf", "vrfname": "blue", "cniVersion": "0.3.0", "prevResult": prev}),
        ]
        before = w.snapshot()
        out = []
        for command, conf in cases:
            with pytest.raises(CNIError) as err:
                w.call(command, conf)
            out.append((err.value.code, err.value.msg))
        check = {"type": "vrf", "vrfname": "blue", "prevResult": prev}
        if impl == "go":
            w.call("CHECK", check)  # 1.1.1 ignores what it found (fixed upstream since): passes
        else:
            with pytest.raises(CNIError, match="^Link not found$"):
                w.call("CHECK", check)
        w.call("DEL", {"type": "vrf", "vrfname": "blue"})  # no VRF: nothing to do
        assert w.snapshot() == before, impl
        answers[impl] = out
    assert answers["pycni"] == answers["pycni-exec"] == answers["go"]


HOSTILE = [
    ({"vrfname": "../../etc"}, 'invalid vrf name "../../etc": not a valid interface name'),
    ({"vrfname": "a-very-long-vrf-name"}, "not a valid interface name"),
    (
        {"vrfname": "blue", "table": -1},
        "cannot unmarshal number -1 into Go struct field VRFNetConf.table of type uint32",
    ),
    ({"vrfname": "blue", "table": 2**32}, "of type uint32"),
    ({"vrfname": "blue", "table": "7"}, "cannot unmarshal string into Go struct field .table of type int"),
    ({"vrfname": "blue", "table": 254}, "invalid table 254"),
]


@pytest.mark.parametrize("extra,message", HOSTILE, ids=[m[:30] for _, m in HOSTILE])
def test_hostile_vrf_configs_are_refused_before_anything_changes(make_netns, tmp_path, extra, message):
    pair = worlds(tmp_path, make_netns)
    for impl in ("pycni", "pycni-exec"):
        w = pair[impl]
        conf = {"type": "vrf", **extra, "prevResult": _setup(w)}
        before = w.snapshot()
        with pytest.raises(CNIError) as err:
            w.call("ADD", conf)
        assert err.value.code == 999 and message in err.value.msg, err.value
        assert w.snapshot() == before, impl

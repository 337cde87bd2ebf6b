"""bandwidth in-process: which host link it shapes, and which ifb is whose."""

from __future__ import annotations

import hashlib
import os

import pytest

from pycni import netns
from pycni.errors import CNIError
from pycni.sdk import Attachment
from pycni_plugins.bandwidth import BandwidthPlugin
from pycni_plugins.kernel.state import Records

pytestmark = pytest.mark.privileged

SHAPED = {"ingressRate": 4_000_000, "ingressBurst": 80_000, "egressRate": 2_000_000, "egressBurst": 40_000}
# An index no fresh namespace has reached, so the host can be given a link of the same one.
FOREIGN_INDEX = 4242


def _conf(ctr: str, host_name: str, ifname: str = "eth0") -> dict:
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": host_name}, {"name": ifname, "sandbox": ctr}],
        "ips": [],
    }
    return {"cniVersion": "1.0.0", "name": "bwnet", "type": "bandwidth", "prevResult": prev, **SHAPED}


def _veth(peer_ns: str, name: str, peer: str, *, index: int = 0) -> None:
    """A veth ``name`` (of ifindex ``index``, 0: any) here whose end ``peer`` is in ``peer_ns``, both up."""
    from pyroute2 import IPRoute

    fd = os.open(peer_ns, os.O_RDONLY)
    try:
        with IPRoute() as ipr:
            spec = {"index": index} if index else {}
            ipr.link("add", ifname=name, kind="veth", state="up", peer={"ifname": peer, "net_ns_fd": fd}, **spec)
    finally:
        os.close(fd)

    def up() -> None:
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=peer)[0], state="up")

    netns.run_in(peer_ns, up)


def _qdiscs(path: str | None = None) -> dict[str, list[str]]:
    """Link name -> the kinds of its qdiscs other than the kernel's defaults, in a namespace."""

    def body() -> dict[str, list[str]]:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            names = {link["index"]: link.get("ifname") for link in ipr.link("dump")}
            out: dict[str, list[str]] = {}
            for q in ipr.get_qdiscs():
                if q.get("kind") not in ("noqueue", "pfifo_fast", "noop", "fq_codel", "mq"):
                    out.setdefault(names[q["index"]], []).append(q.get("kind"))
        return {name: sorted(kinds) for name, kinds in out.items()}

    return netns.run_in(path, body)


def _ifbs(kit) -> set[str]:
    return {name for name, link in kit.links_in().items() if link.kind == "ifb"}


def test_a_peer_in_another_namespace_is_refused_though_the_host_has_its_index(host, make_netns, kit):
    ctr, third = make_netns("c"), make_netns("third")
    netns.run_in(third.path, _veth, ctr.path, "tpeer0", "eth0", index=FOREIGN_INDEX)
    _veth(host.path, "hveth0", "hpeer0", index=FOREIGN_INDEX)  # the host's link of that index
    _veth(ctr.path, "hveth1", "eth1")  # the container gives the host an id too: the ids must differ
    with pytest.raises(CNIError) as e:
        BandwidthPlugin().handle(kit.request("ADD", _conf(ctr.path, "hveth0"), "c1", ctr.path))
    assert e.value.msg == "veth peer of container interface eth0 is not in host ns"
    assert _qdiscs() == {} and _ifbs(kit) == set()
    assert _qdiscs(third.path) == {}


def _two_interfaces(make_netns) -> str:
    """A container with veths ``eth0`` and ``eth1`` whose peers ``hveth0`` and ``hveth1`` are here."""
    ctr = make_netns("c")
    _veth(ctr.path, "hveth0", "eth0")
    _veth(ctr.path, "hveth1", "eth1")
    return ctr.path


def test_each_interface_of_a_container_gets_its_own_ifb_and_del_removes_only_its_own(host, make_netns, kit):
    ctr = _two_interfaces(make_netns)
    plugin = BandwidthPlugin()
    conf0, conf1 = _conf(ctr, "hveth0"), _conf(ctr, "hveth1", "eth1")
    result0 = plugin.handle(kit.request("ADD", conf0, "c1", ctr))
    result1 = plugin.handle(kit.request("ADD", conf1, "c1", ctr, "eth1"))
    ifb0, ifb1 = result0["interfaces"][-1]["name"], result1["interfaces"][-1]["name"]
    assert ifb0 != ifb1 and _ifbs(kit) == {ifb0, ifb1}
    plugin.handle(kit.request("DEL", conf1, "c1", ctr, "eth1"))
    assert _ifbs(kit) == {ifb0}
    assert _qdiscs() == {"hveth0": ["ingress", "tbf"], ifb0: ["tbf"]}
    plugin.handle(kit.request("CHECK", {**conf0, "prevResult": result0}, "c1", ctr))
    plugin.handle(kit.request("DEL", conf0, "c1", ctr))
    assert _ifbs(kit) == set() and _qdiscs() == {}


def test_an_ifb_named_per_container_by_an_older_pycni_is_its_own_attachments_alone(host, make_netns, kit):
    ctr = _two_interfaces(make_netns)
    plugin = BandwidthPlugin()
    conf0, conf1 = _conf(ctr, "hveth0"), _conf(ctr, "hveth1", "eth1")
    add0 = kit.request("ADD", conf0, "c1", ctr)
    result0 = plugin.handle(add0)
    # As pycni named it before ifbs were per attachment: bwp + sha512(network + container ID).
    legacy = ("bwp" + hashlib.sha512(b"bwnetc1").hexdigest())[:15]
    _rename(result0["interfaces"][-1]["name"], legacy)
    records = Records("bandwidth", add0.state_dir)
    key = Attachment("bwnet", "c1", "eth0").key
    records.store(key, {**records.load(key), "ifb": legacy})
    result0["interfaces"][-1]["name"] = legacy
    plugin.handle(kit.request("ADD", conf1, "c1", ctr, "eth1"))
    plugin.handle(kit.request("DEL", conf1, "c1", ctr, "eth1"))
    assert _ifbs(kit) == {legacy}
    plugin.handle(kit.request("CHECK", {**conf0, "prevResult": result0}, "c1", ctr))
    plugin.handle(kit.request("DEL", conf0, "c1", ctr))
    assert _ifbs(kit) == set() and _qdiscs() == {}


def _rename(name: str, new: str) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=name)[0]
        ipr.link("set", index=index, state="down")
        ipr.link("set", index=index, ifname=new, state="up")

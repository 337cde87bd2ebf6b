"""macvlan, ipvlan, vlan and host-device: a failed ADD, its rollback and a DEL take only the
container link their attachment's record names (the rule of ``pycni_plugins.kernel.owned``),
never another attachment's ``CNI_IFNAME``; without a record DEL takes ``CNI_IFNAME`` as the
reference does, unless another attachment's record names it. In-process and through the CLI
with the plugins exec'd. The masters and the devices host-device moves are veth ends inside the
throwaway host namespace; this kernel has no ipvlan or vlan driver, so those two are covered
as intruders whose ADD fails at link creation."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from pycni import netns
from pycni.errors import CNIError
from pycni_plugins.install import install
from pycni_plugins.kernel import links as kernel_links
from tests.faults.conftest import World, ok
from tests.helpers.kernel import links

pytestmark = pytest.mark.privileged

SUBNET = "198.18.66.0/24"
MASTER = "lanm0"


def _conf(root: Any, main: str, device: str = "") -> dict[str, Any]:
    ipam = {"type": "host-local", "ranges": [[{"subnet": SUBNET}]], "dataDir": str(root / "ipam")}
    plugin: dict[str, Any] = {"type": main, "ipam": ipam}
    if main == "host-device":
        plugin["device"] = device
    elif main == "vlan":
        plugin.update(master=MASTER, vlanId=7)
    else:
        plugin["master"] = MASTER
    return {"cniVersion": "1.0.0", "name": "linknet", "plugins": [{"type": "loopback"}, plugin]}


def _veth_pair(name: str, peer: str) -> None:
    with kernel_links.iproute() as ipr:
        ipr.link("add", ifname=name, kind="veth", peer=peer)
        for n in (name, peer):
            ipr.link("set", index=kernel_links.ifindex(n), state="up")


@pytest.fixture(params=["macvlan", "host-device"])
def worlds(request, host_ns, make_netns, tmp_path, monkeypatch) -> tuple[World, World]:
    """The victim's and the intruder's view of one network (host-device: each its own device)."""
    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "state"))
    main = request.param
    for name, peer in ((MASTER, "lanm1"), ("hda0", "hda1"), ("hdb0", "hdb1")):
        netns.run_in(host_ns.path, _veth_pair, name, peer)
    vic = World(host_ns, make_netns, tmp_path, _conf(tmp_path, main, "hda0"))
    intruder = World(host_ns, make_netns, tmp_path, _conf(tmp_path, main, "hdb0"))
    return vic, intruder


def _eth0(ns: netns.Throwaway) -> tuple[int, str, str | None]:
    def read() -> tuple[int, str, str | None]:
        with kernel_links.iproute() as ipr:
            link = kernel_links.get_link(ipr, "eth0")
            assert link is not None, "eth0 is gone"
            return link.index, link.mac, link.kind

    return netns.run_in(ns.path, read)


def _records(world: World) -> list[str]:
    return world.records()


def test_rollback_into_a_namespace_another_attachment_uses_leaves_its_link(worlds):
    """The intruder's ADD fails ("File exists": eth0 is the victim's); its rollback DEL and
    two later DELs neither delete nor move the victim's eth0."""
    vic, intruder = worlds
    ns = vic.make_netns("c")
    vic.add("vic", ns.path)
    before, leases = _eth0(ns), vic.leases()
    with pytest.raises(CNIError, match="File exists"):
        intruder.runtime.add_network_list(intruder.network, intruder.rt("intruder", ns.path), rollback=True)
    assert _eth0(ns) == before
    assert set(links(ns.path)) == {"lo", "eth0"}, "the failed ADD left its device in the container"
    with pytest.raises(CNIError, match="File exists"):
        intruder.add("intruder", ns.path)
    intruder.delete("intruder", ns.path)
    intruder.delete("intruder", ns.path)
    assert _eth0(ns) == before and vic.leases() == leases
    vic.check("vic", ns.path)
    vic.delete("vic", ns.path)
    assert set(links(ns.path)) == {"lo"} and vic.leases() == {} and _records(vic) == []
    assert {"hda0", "hdb0"} <= set(links(vic.host.path))


def test_a_del_without_a_record_keeps_the_link_another_attachments_record_names(worlds):
    """An attachment never ADDed here (or whose state was lost): its DEL has no record and
    finds the victim's eth0, which the victim's record names."""
    vic, intruder = worlds
    ns = vic.make_netns("c")
    vic.add("vic", ns.path)
    before = _eth0(ns)
    intruder.delete("stranger", ns.path)
    assert _eth0(ns) == before
    vic.check("vic", ns.path)
    vic.delete("vic", ns.path)
    assert set(links(ns.path)) == {"lo"}


def test_a_del_without_any_record_takes_ifname_as_the_reference_does(worlds):
    """Lost state (or an attachment the Go plugin made): DEL takes eth0 by name."""
    vic, _ = worlds
    ns = vic.make_netns("c")
    vic.add("vic", ns.path)
    for kind in vic.state_dir.iterdir():
        for f in kind.iterdir():
            if kind.name != "nft":
                f.unlink()
    vic.delete("vic", ns.path)
    assert set(links(ns.path)) == {"lo"}
    if vic.network.plugins[1].type == "host-device":
        assert "hda0" in links(vic.host.path)


def _replace_eth0() -> None:
    with kernel_links.iproute() as ipr:
        index = kernel_links.ifindex("eth0")
        assert index is not None
        ipr.link("set", index=index, ifname="old0")
        ipr.link("add", ifname="eth0", kind="veth", peer="eth0p")


def test_a_del_with_a_record_keeps_an_eth0_that_is_no_longer_its_link(worlds):
    """The recorded link was renamed away and another eth0 made: DEL takes the recorded one
    only (by ifindex and MAC), never the new eth0."""
    vic, _ = worlds
    ns = vic.make_netns("c")
    vic.add("vic", ns.path)
    netns.run_in(ns.path, _replace_eth0)
    newcomer = _eth0(ns)
    vic.delete("vic", ns.path)
    assert _eth0(ns) == newcomer
    assert "old0" not in links(ns.path)


@pytest.mark.parametrize("kind", ["ipvlan", "vlan"])
def test_a_failed_ipvlan_or_vlan_add_and_its_rollback_leave_anothers_eth0(worlds, kind):
    """No ipvlan/vlan driver here: the ADD fails at link creation; its rollback DEL (record
    naming none) and a later record-less DEL keep the victim's eth0."""
    vic, _ = worlds
    root = vic.root
    intruder = World(vic.host, vic.make_netns, root, _conf(root, kind))
    ns = vic.make_netns("c")
    vic.add("vic", ns.path)
    before = _eth0(ns)
    with pytest.raises(CNIError):
        intruder.runtime.add_network_list(intruder.network, intruder.rt("intruder", ns.path), rollback=True)
    assert _eth0(ns) == before
    intruder.delete("intruder", ns.path)
    assert _eth0(ns) == before
    vic.check("vic", ns.path)
    vic.delete("vic", ns.path)
    assert _records(vic) == []


def _cli(world: World, tmp_path: Any, tag: str):
    bindir = tmp_path / "bin"
    if not bindir.exists():
        install(str(bindir))
    conf_dir = tmp_path / f"net.d-{tag}"
    conf_dir.mkdir()
    (conf_dir / "10-link.conflist").write_text(world.conflist_text)

    return functools.partial(world.cli, bindir, conf_dir)


def test_cli_exec_rollback_into_a_namespace_another_attachment_uses_leaves_its_link(worlds, tmp_path):
    vic_world, intruder_world = worlds
    vic, intruder = _cli(vic_world, tmp_path, "vic"), _cli(intruder_world, tmp_path, "intruder")
    ns = vic_world.make_netns("c")
    out = json.loads(ok(vic("add", ns.path, "vic")).stdout)
    assert out["ips"]
    before = _eth0(ns)
    proc = intruder("add", ns.path, "intruder", "--rollback")
    assert proc.returncode == 1 and "File exists" in proc.stderr, proc.stderr
    assert _eth0(ns) == before
    ok(intruder("del", ns.path, "intruder"))
    assert _eth0(ns) == before
    ok(vic("check", ns.path, "vic"))
    ok(vic("del", ns.path, "vic"))
    assert set(links(ns.path)) == {"lo"} and _records(vic_world) == []

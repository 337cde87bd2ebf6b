"""host-device in-process: PCI/auxiliary/DPDK look-ups through a stand-in sysfs, rollback, CHECK (and a
failed ADD of host-device or macvlan changing nothing)."""

from __future__ import annotations

import os

import pytest

from pycni import netns
from pycni.errors import CNIError
from pycni_plugins import host_device
from pycni_plugins.host_device import HostDevicePlugin
from tests.conftest import TEST_NS_PREFIX

pytestmark = pytest.mark.privileged

PCI = "0000:00:05.0"


def _device(name: str = "hd0") -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("add", ifname=name, kind="veth", peer=f"{name}p", state="up")
        index = ipr.link_lookup(ifname=name)[0]
        ipr.addr("add", index=index, address="198.18.9.1", prefixlen=24)


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    """A stand-in /sys/bus: ``PCI`` with net/hd0 bound to ``driver``, auxiliary ``mlx.eth.0``."""
    root = tmp_path / "sys"
    for bus in ("pci", "auxiliary"):
        (root / bus).mkdir(parents=True)
    monkeypatch.setattr(host_device, "SYS_BUS_PCI", str(root / "pci"))
    monkeypatch.setattr(host_device, "SYS_BUS_AUXILIARY", str(root / "auxiliary"))

    def make(driver: str = "virtio-pci", virtio: bool = False) -> None:
        dev = root / "pci" / PCI
        net = dev / "virtio3" / "net" if virtio else dev / "net"
        net.mkdir(parents=True)
        (net / "hd0").mkdir()
        (root / "drivers" / driver).mkdir(parents=True)
        os.symlink(root / "drivers" / driver, dev / "driver")
        (root / "auxiliary" / "mlx.eth.0" / "net" / "hd0").mkdir(parents=True)

    return make


def _conf(**extra):
    return {"cniVersion": "1.0.0", "name": "hd", "type": "host-device", **extra}


def _in_container(path):
    from pycni_plugins.kernel import links

    def body():
        with links.iproute() as ipr:
            return {link.name: link for link in links.dump_links(ipr)}

    return netns.run_in(path, body)


@pytest.mark.parametrize(
    "how,virtio",
    [
        ({"pciBusID": PCI}, False),
        ({"pciBusID": PCI}, True),
        ({"runtimeConfig": {"deviceID": PCI}}, False),
        ({"runtimeConfig": {"deviceID": "mlx.eth.0"}}, False),
    ],
)
def test_host_device_found_by_pci_address_or_device_id(host, make_netns, kit, sysfs, how, virtio):
    sysfs(virtio=virtio)
    _device()
    ctr = make_netns("c")
    plugin = HostDevicePlugin()
    out = plugin.handle(kit.request("ADD", _conf(**how), "c1", ctr.path))
    assert out["interfaces"][0]["name"] == "eth0"
    assert "hd0" not in kit.links_in(None) and "eth0" in _in_container(ctr.path)
    plugin.handle(kit.request("DEL", _conf(**how), "c1", ctr.path))
    back = kit.links_in(None)["hd0"]
    assert back.up


def test_host_device_dpdk_device_is_not_moved(host, make_netns, kit, sysfs, tmp_path):
    sysfs(driver="vfio-pci")
    _device()
    ctr = make_netns("c")
    ipam = {"type": "host-local", "ranges": [[{"subnet": "198.18.7.0/24"}]], "dataDir": str(tmp_path / "ipam")}
    conf = _conf(pciBusID=PCI, ipam=ipam)
    out = HostDevicePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
    assert out["interfaces"] == [{"name": "eth0", "sandbox": ctr.path}]
    assert out["ips"][0]["address"] == "198.18.7.2/24" and out["ips"][0]["interface"] == 0
    assert "hd0" in kit.links_in(None) and set(_in_container(ctr.path)) == {"lo"}
    HostDevicePlugin().handle(kit.request("DEL", conf, "c1", ctr.path))
    assert not list((tmp_path / "ipam").glob("*/198.*"))


def test_host_device_goes_back_with_its_addresses_when_ipam_fails(host, make_netns, kit, tmp_path):
    _device()
    ctr = make_netns("c")
    before = kit.links_in(None)["hd0"]
    conf = _conf(device="hd0", ipam={"type": "no-such-ipam"})
    with pytest.raises(CNIError, match="no-such-ipam"):
        HostDevicePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
    after = kit.links_in(None)["hd0"]
    assert after.up and after.mac == before.mac
    assert set(_in_container(ctr.path)) == {"lo"}
    from pycni_plugins.kernel import addressing, links

    with links.iproute() as ipr:
        assert "198.18.9.1/24" in {str(a) for a, _ in addressing.addresses(ipr, after.index)}


def test_host_device_check_notices_a_changed_mac(host, make_netns, kit):
    _device()
    ctr = make_netns("c")
    plugin = HostDevicePlugin()
    conf = _conf(device="hd0")
    out = plugin.handle(kit.request("ADD", conf, "c1", ctr.path))
    plugin.handle(kit.request("CHECK", {**conf, "prevResult": out}, "c1", ctr.path))
    stale = {**out, "interfaces": [{**out["interfaces"][0], "mac": "02:00:00:00:00:42"}]}
    with pytest.raises(CNIError, match="Interface eth0 Mac 02:00:00:00:00:42 doesn't match container Mac"):
        plugin.handle(kit.request("CHECK", {**conf, "prevResult": stale}, "c1", ctr.path))
    with pytest.raises(CNIError, match="Required prevResult missing"):
        plugin.handle(kit.request("CHECK", conf, "c1", ctr.path))
    plugin.handle(kit.request("DEL", conf, "c1", ctr.path))


def test_host_device_del_with_the_container_namespace_gone_succeeds(host, kit):
    _device()
    ctr = netns.Throwaway(prefix=f"{TEST_NS_PREFIX}-gone")
    ctr.__enter__()
    try:
        HostDevicePlugin().handle(kit.request("ADD", _conf(device="hd0"), "c1", ctr.path))
    finally:
        ctr.__exit__(None, None, None)
    HostDevicePlugin().handle(kit.request("DEL", _conf(device="hd0"), "c1", ctr.path))


@pytest.mark.parametrize("plugin_type", ["host-device", "macvlan"])
def test_an_add_whose_result_its_version_cannot_hold_changes_nothing(host, make_netns, kit, state_dir, plugin_type):
    """0.2.0 without IPAM: no address for the result (code 6, as the reference). Found by
    ``pycni fuzz``: the device had been moved (the macvlan made) before the result failed."""
    _device()
    ctr = make_netns("c")
    conf = {**_conf(cniVersion="0.2.0"), "type": plugin_type}
    conf.update({"device": "hd0"} if plugin_type == "host-device" else {"master": "hd0"})
    with pytest.raises(CNIError) as e:
        from pycni.sdk import builtin_plugin

        builtin_plugin(plugin_type).handle(kit.request("ADD", conf, "c1", ctr.path))
    assert e.value.code == 6 and "no valid IP addresses" in e.value.msg
    assert set(_in_container(ctr.path)) == {"lo"}
    assert kit.links_in(None)["hd0"].up
    records = os.path.join(state_dir, plugin_type)
    for name in os.listdir(records):
        with open(os.path.join(records, name)) as f:
            assert '"link":null' in f.read()


def _routes(*commands: tuple[str, dict]) -> None:
    """Two uplinks (veths ``up1``, ``up2``, addressed) and the given routing rules and routes."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for n, name in ((1, "up1"), (2, "up2")):
            ipr.link("add", ifname=name, kind="veth", peer=f"{name}p", state="up")
            index = ipr.link_lookup(ifname=name)[0]
            ipr.addr("add", index=index, address=f"198.18.{10 + n}.1", prefixlen=24)
            ipr.addr("add", index=index, address=f"2001:db8:{n}::1", prefixlen=64, flags=0x80)  # nodad
        up = {name: ipr.link_lookup(ifname=name)[0] for name in ("up1", "up2")}
        for what, spec in commands:
            spec = {k: (up[v] if k == "oif" else v) for k, v in spec.items()}
            if "multipath" in spec:
                spec["multipath"] = [{**hop, "oif": up[hop["oif"]]} for hop in spec["multipath"]]
            getattr(ipr, what)("add", **spec)


MULTIPATH = {
    "dst": "0.0.0.0/0",
    "multipath": [{"gateway": "198.18.11.2", "oif": "up1"}, {"gateway": "198.18.12.2", "oif": "up2"}],
}
ROUTINGS = {
    "multipath default, first hop": ([("route", MULTIPATH)], "up1"),
    "multipath default, second hop": ([("route", MULTIPATH)], "up2"),
    "a second default route, metric 200": (
        [
            ("route", {"dst": "0.0.0.0/0", "gateway": "198.18.11.2"}),
            ("route", {"dst": "0.0.0.0/0", "gateway": "198.18.12.2", "priority": 200}),
        ],
        "up2",
    ),
    "an IPv6 default route": (
        [
            ("route", {"dst": "0.0.0.0/0", "gateway": "198.18.11.2"}),
            ("route", {"dst": "::/0", "oif": "up2", "family": 10}),
        ],
        "up2",
    ),
    "a default route in a table a rule reaches": (
        [
            ("route", {"dst": "0.0.0.0/0", "gateway": "198.18.12.2", "table": 100}),
            ("rule", {"fwmark": 1, "table": 100, "priority": 100}),
        ],
        "up2",
    ),
}


@pytest.mark.parametrize("case", list(ROUTINGS))
def test_host_device_refuses_every_device_a_default_route_can_leave_through(host, make_netns, kit, case):
    commands, device = ROUTINGS[case]
    _routes(*commands)
    ctr = make_netns("c")
    before = kit.links_in(None)
    with pytest.raises(CNIError) as e:
        HostDevicePlugin().handle(kit.request("ADD", _conf(device=device), "c1", ctr.path))
    assert (
        e.value.code == 7
        and f'refusing to move "{device}": it carries the host namespace\'s default route' in e.value.msg
    )
    assert kit.links_in(None) == before and set(_in_container(ctr.path)) == {"lo"}


def test_host_device_moves_a_device_whose_default_route_no_rule_reaches(host, make_netns, kit):
    _routes(
        ("route", {"dst": "0.0.0.0/0", "gateway": "198.18.11.2"}),
        ("route", {"dst": "0.0.0.0/0", "gateway": "198.18.12.2", "table": 100}),
    )
    ctr = make_netns("c")
    HostDevicePlugin().handle(kit.request("ADD", _conf(device="up2"), "c1", ctr.path))
    assert "up2" not in kit.links_in(None) and "eth0" in _in_container(ctr.path)
    HostDevicePlugin().handle(kit.request("DEL", _conf(device="up2"), "c1", ctr.path))
    assert "up2" in kit.links_in(None)


def test_macvlan_default_master_is_a_multipath_default_routes_first_hop(host, make_netns, kit):
    """Go's lookup skips a multipath default route and finds no master; pycni takes its first hop."""
    from pycni_plugins import _sublink
    from pycni_plugins.kernel import links

    _routes(("route", MULTIPATH))
    request = kit.request("ADD", {"cniVersion": "1.0.0", "name": "mv", "type": "macvlan"}, "c1", make_netns("c").path)
    master = _sublink.lookup_master(request, "", in_container=False)
    assert master.link.index == links.ifindex("up1")

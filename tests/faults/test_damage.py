"""Out-of-band damage: someone else deletes a container's namespace or interface, the bridge, or
pycni's nftables tables. CHECK says precisely what is missing, DEL still succeeds and removes
everything of the attachment, and the next ADD (or ``reconcile``) repairs what is shared.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess

import pytest

from pycni.config import conflist_from_bytes
from pycni.errors import CNIError
from pycni_plugins.kernel import layout, nft
from tests.faults.conftest import BRIDGE, NETWORK, World

pytestmark = pytest.mark.privileged


def _nft(world: World, *commands: str) -> None:
    for command in commands:
        subprocess.run(["ip", "netns", "exec", world.host.name, "nft", command], check=True, capture_output=True)


def _two(world: World):
    a, b = world.make_netns("c"), world.make_netns("c")
    ips = {"a": world.works("a", a)[0], "b": world.works("b", b)[0]}
    return a, b, ips


def _finish(world: World, *attachments) -> None:
    """DEL of every attachment succeeds (twice) and nothing is left of any."""
    for cid, ns in attachments:
        world.delete(cid, ns.path)
        world.delete(cid, ns.path)
    assert world.leftovers() == {}


def test_container_netns_deleted_before_del(world):
    a, b, ips = _two(world)
    path = a.path
    a.__exit__(None, None, None)
    with pytest.raises(CNIError) as e:
        world.check("a", path)
    assert str(e.value) == f"failed to open netns {path!r}: No such file or directory"
    world.delete("a", path)
    left = world.leftovers()
    assert set(left["leases"]) == {ips["b"]} and left["cache"] == ["b/eth0"], left
    assert all(" b eth0" in e for e in left["nft"]), left["nft"]
    world.check("b", b.path)
    assert world.ping(ips["b"])
    c = world.make_netns("c")
    world.works("c", c)
    _finish(world, ("a", a), ("b", b), ("c", c))


def test_container_interface_deleted_out_of_band(world):
    a, b, ips = _two(world)
    subprocess.run(["ip", "-n", a.name, "link", "del", "eth0"], check=True)
    with pytest.raises(CNIError, match="^Interface name eth0 not found$"):
        world.check("a", a.path)
    world.delete("a", a.path)
    left = world.leftovers()
    assert set(left["leases"]) == {ips["b"]} and len(left["veths"]) == 1, left
    world.check("b", b.path)
    world.works("a", a)  # the same container comes back
    _finish(world, ("a", a), ("b", b))


def test_bridge_deleted_while_containers_exist(world):
    a, b, ips = _two(world)
    subprocess.run(["ip", "-n", world.host.name, "link", "del", BRIDGE], check=True)
    for cid, ns in (("a", a), ("b", b)):
        with pytest.raises(CNIError, match=f"^Interface name {BRIDGE} not found$"):
            world.check(cid, ns.path)
    assert not world.ping(ips["a"])
    c = world.make_netns("c")
    world.works("c", c)  # re-creates the bridge: same MAC, earlier veths enslaved again
    for cid, ns in (("a", a), ("b", b)):
        world.check(cid, ns.path)
        assert world.ping(ips[cid])
    _finish(world, ("a", a), ("b", b), ("c", c))


def test_bridge_deleted_then_old_containers_deleted(world):
    a, b, _ = _two(world)
    subprocess.run(["ip", "-n", world.host.name, "link", "del", BRIDGE], check=True)
    _finish(world, ("a", a), ("b", b))


HINT = f"; run `pycni gc {NETWORK} --reconcile` to restore"
DAMAGE = {
    "tables deleted": ("delete table inet pycni", "delete table bridge pycni"),
    "ruleset flushed": ("flush ruleset",),
    "tables flushed (rules only)": ("flush table inet pycni", "flush table bridge pycni"),
}
CHECK_SAYS = {
    "tables deleted": "ipMasq: table inet pycni is missing" + HINT,
    "ruleset flushed": "ipMasq: table inet pycni is missing" + HINT,
    "tables flushed (rules only)": "ipMasq: chain masq_postrouting of table inet pycni has 0 of its 2 rules" + HINT,
}


TAIL_CHECK_SAYS = {
    "tables deleted": {
        "firewall": "expected firewall element {ip} not found in set firewall4; table inet pycni is missing" + HINT,
        "portmap": "missing hostport elements in table inet pycni: tcp . {port}, {ip}; table inet pycni is missing"
        + HINT,
    },
    "tables flushed (rules only)": {
        "firewall": "firewall rules incomplete: chain forward of table inet pycni has 0 of its 4 rules; "
        "chain forward of table inet pycni has lost its jump to CNI-ADMIN" + HINT,
        "portmap": "host ports not published: chain hostports of table inet pycni has 0 of its 4 rules; "
        "chain hostports_prerouting of table inet pycni has 0 of its 1 rules; "
        "chain hostports_output of table inet pycni has 0 of its 1 rules; "
        "chain hostports_postrouting of table inet pycni has 0 of its 2 rules; "
        "chain hairpin-198_18_64_0_nm24 of table inet pycni has 0 of its 1 rules" + HINT,
    },
}
TAIL_CHECK_SAYS["ruleset flushed"] = TAIL_CHECK_SAYS["tables deleted"]


def _plugin(world: World, plugin_type: str) -> dict:
    return next(p for p in world.conf["plugins"] if p["type"] == plugin_type)


def _all_sections() -> list[nft.Section]:
    net = ipaddress.ip_network("198.18.64.0/24")
    return [
        layout.MASQ,
        layout.masq_subnet(net),
        layout.PORTMAP,
        layout.hairpin_subnet(net),
        layout.FIREWALL,
        layout.admin_section("CNI-ADMIN"),
        layout.SPOOFCHK,
    ]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_pycni_tables_damaged_by_someone_else(world, damage):
    a, b, ips = _two(world)
    _nft(world, *DAMAGE[damage])
    with pytest.raises(CNIError) as e:
        world.check("a", a.path)
    assert str(e.value) == CHECK_SAYS[damage]
    # Past the bridge, each plugin says what it misses (CHECK of the chain's tail alone).
    for plugin, says in TAIL_CHECK_SAYS[damage].items():
        tail = conflist_from_bytes(json.dumps({**world.conf, "plugins": [_plugin(world, plugin)]}).encode())
        with pytest.raises(CNIError) as e:
            world.runtime.check_network_list(tail, world.rt("a", a.path))
        assert str(e.value) == says.format(ip=ips["a"], port=world.ports("a")[0]["hostPort"])

    c = world.make_netns("c")
    world.works("c", c)  # the very next ADD puts the skeleton back: it sees the generation moved
    assert netns_run(world, nft.skeleton_problems, _all_sections()) == []
    if damage == "tables flushed (rules only)":
        world.check("a", a.path)  # elements survived a flush of the rules: nothing else to do
    else:
        with pytest.raises(CNIError, match=r"ipMasq: element 198\.18\.64\.\d+ is missing from map masq4"):
            world.check("a", a.path)
        report = world.reconcile()  # restores the recorded elements of the valid attachments
        assert report.errors == () and any("restored" in r for r in report.collected), report
    for cid, ns in (("a", a), ("b", b)):
        world.check(cid, ns.path)
        assert world.ping(ips[cid])
    _finish(world, ("a", a), ("b", b), ("c", c))


def test_del_after_the_tables_are_gone(world):
    a, b, _ = _two(world)
    _nft(world, "flush ruleset")
    _finish(world, ("a", a), ("b", b))


def test_a_set_emptied_by_someone_else(world):
    a, b, ips = _two(world)
    _nft(world, "flush set inet pycni firewall4")
    with pytest.raises(CNIError) as e:
        world.check("a", a.path)
    assert str(e.value) == (
        f"expected firewall element {ips['a']} not found in set firewall4; "
        f"element {ips['a']} is missing from set firewall4 of table inet pycni" + HINT
    )
    world.reconcile()
    world.check("a", a.path)
    world.check("b", b.path)
    _finish(world, ("a", a), ("b", b))


def netns_run(world: World, fn, *args):
    from pycni import netns

    return netns.run_in(world.host.path, fn, *args)

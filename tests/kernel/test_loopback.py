"""loopback: lo up, result shapes, prevResult pass-through, DEL/CHECK edge cases."""

from __future__ import annotations

import pytest

from pycni.errors import CNIError
from pycni_plugins.loopback import LoopbackPlugin

pytestmark = pytest.mark.privileged

LO = {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}


def _set_lo(kit, path: str, up: bool) -> None:
    from pycni import netns
    from pycni_plugins.kernel import links

    def body() -> None:
        with links.iproute() as ipr:
            index = links.get_link(ipr, "lo").index
            links.set_up(ipr, index) if up else links.set_down(ipr, index)

    netns.run_in(path, body)


def test_add_brings_lo_up_and_reports_it(host, make_netns, kit):
    ctr = make_netns("c")
    _set_lo(kit, ctr.path, False)
    out = LoopbackPlugin().handle(kit.request("ADD", LO, "c1", ctr.path, "lo"))
    assert out == {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": ctr.path}],
        "ips": [{"interface": 0, "address": "127.0.0.1/8"}, {"interface": 0, "address": "::1/128"}],
    }
    assert kit.links_in(ctr.path)["lo"].up


def test_add_040_keeps_the_1x_shape_like_the_reference(host, make_netns, kit):
    ctr = make_netns("c")
    out = LoopbackPlugin().handle(kit.request("ADD", {**LO, "cniVersion": "0.4.0"}, "c1", ctr.path, "lo"))
    assert out["cniVersion"] == "0.4.0"
    assert all("version" not in ip for ip in out["ips"])


def test_add_passes_prev_result_through(host, make_netns, kit):
    ctr = make_netns("c")
    prev = {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24"}]}
    conf = {**LO, "cniVersion": "0.4.0", "prevResult": prev}
    out = LoopbackPlugin().handle(kit.request("ADD", conf, "c1", ctr.path, "lo"))
    assert out == {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24"}], "dns": {}}


def test_check_and_del(host, make_netns, kit):
    ctr = make_netns("c")
    _set_lo(kit, ctr.path, False)
    plugin = LoopbackPlugin()
    plugin.handle(kit.request("ADD", LO, "c1", ctr.path, "lo"))
    plugin.handle(kit.request("CHECK", LO, "c1", ctr.path, "lo"))
    plugin.handle(kit.request("DEL", LO, "c1", ctr.path, "lo"))
    assert not kit.links_in(ctr.path)["lo"].up
    with pytest.raises(CNIError, match="loopback interface is down"):
        plugin.handle(kit.request("CHECK", LO, "c1", ctr.path, "lo"))


def test_del_with_empty_or_gone_netns_succeeds(host, kit, tmp_path):
    plugin = LoopbackPlugin()
    plugin.handle(kit.request("DEL", LO, "c1", "", "lo"))
    plugin.handle(kit.request("DEL", LO, "c1", str(tmp_path / "gone"), "lo"))
    assert not (tmp_path / "gone").exists()


def test_del_keeps_lo_up_when_its_add_found_it_up(host, make_netns, kit):
    """A rollback/DEL of an attachment that did not bring lo up (another attachment did) must
    not take it away from the namespace's other users."""
    ctr = make_netns("c")
    plugin = LoopbackPlugin()
    plugin.handle(kit.request("ADD", LO, "first", ctr.path, "eth0"))  # lo was already up
    plugin.handle(kit.request("DEL", LO, "first", ctr.path, "eth0"))
    assert kit.links_in(ctr.path)["lo"].up


def test_del_without_a_record_sets_lo_down_like_the_reference_only_when_lo_is_alone(host, make_netns, kit):
    """No record (a reference-made attachment, state lost, a repeated DEL): lo goes down as
    the reference does once it is the last interface, never while another attachment's is there."""
    from pycni import netns
    from pycni_plugins.kernel import links

    ctr = make_netns("c")
    plugin = LoopbackPlugin()

    def dummy(up: bool) -> None:
        with links.iproute() as ipr:
            if up:
                ipr.link("add", ifname="other0", kind="veth", peer="other1")
            else:
                ipr.link("del", ifname="other0")

    netns.run_in(ctr.path, dummy, True)
    plugin.handle(kit.request("DEL", LO, "nobody", ctr.path, "eth0"))
    assert kit.links_in(ctr.path)["lo"].up
    netns.run_in(ctr.path, dummy, False)
    plugin.handle(kit.request("DEL", LO, "nobody", ctr.path, "eth0"))
    assert not kit.links_in(ctr.path)["lo"].up

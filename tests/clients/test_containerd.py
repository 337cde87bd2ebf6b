"""containerd's ``ctr run --cni`` (go-cni) runs busybox containers on pycni's installed plugins."""

from __future__ import annotations

import pytest

from .checks import check_attached, settled_leftovers, write_conflist
from .clients import container_script

pytestmark = pytest.mark.privileged

SUBNET, GATEWAY = "198.18.20.0/24", "198.18.20.1"


def test_ctr_container_gets_an_address_pings_the_gateway_and_leaves_nothing(sandbox, containerd):
    write_conflist(sandbox, "pycni-ctr", "pcctr0", SUBNET, GATEWAY)
    assert sandbox.leftovers() == {}

    running = containerd.run("c1", container_script(GATEWAY))
    (attached,) = check_attached(sandbox, SUBNET, GATEWAY, running)
    assert attached["lease"] == f"{containerd.NAMESPACE}-c1/eth0"  # go-cni's ID: namespace-container

    assert running.finish() == 0, running.text()
    assert settled_leftovers(sandbox) == {}


def test_ctr_two_containers_at_once_get_distinct_addresses_and_both_leave_nothing(sandbox, containerd):
    write_conflist(sandbox, "pycni-ctr", "pcctr0", SUBNET, GATEWAY)
    running = [containerd.run(name, container_script(GATEWAY)) for name in ("c1", "c2")]
    attached = check_attached(sandbox, SUBNET, GATEWAY, *running)
    assert sorted(a["lease"] for a in attached) == [f"{containerd.NAMESPACE}-{n}/eth0" for n in ("c1", "c2")]

    assert [c.finish() for c in running] == [0, 0], [c.text() for c in running]
    assert settled_leftovers(sandbox) == {}

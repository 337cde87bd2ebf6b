"""podman (libcni, CNI backend) runs busybox containers on pycni's installed plugins."""

from __future__ import annotations

import pytest

from .checks import check_attached, settled_leftovers, write_conflist
from .clients import container_script

pytestmark = pytest.mark.privileged

SUBNET, GATEWAY = "198.18.10.0/24", "198.18.10.1"


def test_podman_container_gets_an_address_pings_the_gateway_and_leaves_nothing(sandbox, podman):
    write_conflist(sandbox, "pycni-podman", "pcpod0", SUBNET, GATEWAY)
    assert sandbox.leftovers() == {}

    running = podman.run("c1", "pycni-podman", container_script(GATEWAY))
    (attached,) = check_attached(sandbox, SUBNET, GATEWAY, running)
    (container_id,) = podman.containers()
    assert attached["lease"] == f"{container_id}/eth0"

    assert running.finish() == 0, running.text()
    assert settled_leftovers(sandbox) == {}


def test_podman_two_containers_at_once_get_distinct_addresses_and_both_leave_nothing(sandbox, podman):
    write_conflist(sandbox, "pycni-podman", "pcpod0", SUBNET, GATEWAY)
    running = [podman.run(name, "pycni-podman", container_script(GATEWAY)) for name in ("c1", "c2")]
    attached = check_attached(sandbox, SUBNET, GATEWAY, *running)
    assert sorted(a["lease"] for a in attached) == sorted(f"{cid}/eth0" for cid in podman.containers())

    assert [c.finish() for c in running] == [0, 0], [c.text() for c in running]
    assert settled_leftovers(sandbox) == {}

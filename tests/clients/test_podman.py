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
    attached = check_attached(sandbox, running, SUBNET, GATEWAY)
    (container_id,) = podman.containers()
    assert attached["lease"] == f"{container_id}/eth0"

    assert running.finish() == 0, running.text()
    assert settled_leftovers(sandbox) == {}

"""podman (libcni) and ``ctr run --cni`` (go-cni) run containers on folded conflists: the plugin
dir holds only the ``pycni-chain`` shim, so each network is one exec, served by the daemon or run
by the shim itself (the ``cni_plugins`` fixture's modes: daemon running, stopped, off)."""

from __future__ import annotations

import pytest

from pycni.chain import fold
from tests.helpers import kernel

from .checks import check_attached, settled_leftovers, write_conflist
from .clients import container_script
from .test_podman_default_network import GATEWAY as PODMAN_GATEWAY
from .test_podman_default_network import PODMAN_BRIDGE_CONFLIST
from .test_podman_default_network import SUBNET as PODMAN_SUBNET

pytestmark = pytest.mark.privileged

CTR_SUBNET, CTR_GATEWAY = "198.18.21.0/24", "198.18.21.1"


def test_podman_default_network_folded_runs_a_container_through_one_exec_and_leaves_nothing(
    sandbox, podman, cni_plugins
):
    cni_plugins.fold()
    (sandbox.conf_dir / "87-podman-bridge.conflist").write_bytes(fold(PODMAN_BRIDGE_CONFLIST))

    running = podman.run("c1", "podman", container_script(PODMAN_GATEWAY))
    (attached,) = check_attached(sandbox, PODMAN_SUBNET, PODMAN_GATEWAY, running)
    (container_id,) = podman.containers()
    assert attached["lease"] == f"{container_id}/eth0"
    assert kernel.links(sandbox.host.path)["cni-podman0"]["kind"] == "bridge"

    assert running.finish() == 0, running.text()
    assert settled_leftovers(sandbox) == {}


def test_ctr_folded_network_runs_a_container_through_one_exec_and_leaves_nothing(sandbox, containerd, cni_plugins):
    cni_plugins.fold()
    write_conflist(sandbox, "pycni-ctr", "pcctr1", CTR_SUBNET, CTR_GATEWAY, folded=True)

    running = containerd.run("c1", container_script(CTR_GATEWAY))
    (attached,) = check_attached(sandbox, CTR_SUBNET, CTR_GATEWAY, running)
    assert attached["lease"] == f"{containerd.NAMESPACE}-c1/eth0"

    assert running.finish() == 0, running.text()
    assert settled_leftovers(sandbox) == {}

"""podman's own default network (87-podman-bridge.conflist: bridge, portmap, firewall, tuning) on
pycni's installed plugins."""

from __future__ import annotations

import pytest

from tests.helpers import kernel

from .checks import check_attached, settled_leftovers
from .clients import container_script

pytestmark = pytest.mark.privileged

SUBNET, GATEWAY = "198.18.30.0/24", "198.18.30.1"

# As Debian's podman ships it in /etc/cni/net.d, byte for byte but for the subnet (10.88.0.0/16).
PODMAN_BRIDGE_CONFLIST = """{
  "cniVersion": "0.4.0",
  "name": "podman",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni-podman0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "routes": [{ "dst": "0.0.0.0/0" }],
        "ranges": [
          [
            {
              "subnet": "198.18.30.0/24",
              "gateway": "198.18.30.1"
            }
          ]
        ]
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    },
    {
      "type": "firewall"
    },
    {
      "type": "tuning"
    }
  ]
}
"""


def test_podman_default_network_from_87_podman_bridge_conflist_works_and_leaves_nothing(sandbox, podman):
    (sandbox.conf_dir / "87-podman-bridge.conflist").write_text(PODMAN_BRIDGE_CONFLIST)
    assert sandbox.leftovers() == {}

    running = podman.run("c1", "podman", container_script(GATEWAY))
    (attached,) = check_attached(sandbox, SUBNET, GATEWAY, running)
    (container_id,) = podman.containers()
    assert attached["lease"] == f"{container_id}/eth0"
    assert kernel.links(sandbox.host.path)["cni-podman0"]["kind"] == "bridge"

    assert running.finish() == 0, running.text()
    assert settled_leftovers(sandbox) == {}

"""The host-firewall world: a throwaway host namespace with a profile's firewall, an "outside"
namespace behind its uplink (the host's default route), and the Nomad-style chain in-process.

Nothing here touches the machine's own namespace: the host, the outside and the containers are
namespaces the fixtures create and remove, even on failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from pycni import netns
from pycni.config import conflist_from_bytes
from pycni.nomad.conflist import NomadBridgeConfig, bridge_conflist
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from tests.conftest import REQUIRE_PRIVILEGED
from tests.helpers.traffic import veth

from .profiles import PROFILES, HostProfile

BRIDGE = "nomad"
SUBNET = "198.18.64.0/20"
HOST_UPLINK = "198.19.0.1"
OUTSIDE = "198.19.0.2"


@attrs.define
class World:
    host: str
    outside: str
    profile: HostProfile
    runtime: Runtime
    network: Any
    make_netns: Callable[[str], netns.Throwaway]
    conflist: bytes = b""

    def network_at(self, version: str) -> Any:
        """The same network at another cniVersion (Nomad writes 0.4.0; STATUS needs 1.1.0)."""
        return conflist_from_bytes(
            self.conflist.replace(b'"cniVersion": "0.4.0"', f'"cniVersion": "{version}"'.encode())
        )

    def exec_runtime(self, plugin_dir: str, cache_dir: str) -> Runtime:
        """A runtime exec'ing the plugins of ``plugin_dir`` (shims, or Go's) in the host namespace,
        with its own cache and the world's state dir."""
        return Runtime(
            [plugin_dir], cache_dir=cache_dir, state_dir=self.runtime.state_dir, backend="exec", host_netns=self.host
        )

    def container(self, cid: str, ports: list[dict[str, Any]] | None = None) -> tuple[RuntimeConf, str]:
        """A container namespace ADDed to the network; ``(its RuntimeConf, its address)``."""
        ns = self.make_netns("c")
        caps = {"portMappings": ports} if ports else {}
        rt = RuntimeConf(cid, ns.path, "eth0", capability_args=caps)
        result = self.runtime.add_network_list(self.network, rt)
        return rt, str(result.ips[0].address.ip)


@pytest.fixture(params=PROFILES, ids=lambda p: p.name)
def profile(request: pytest.FixtureRequest) -> HostProfile:
    prof: HostProfile = request.param
    missing = prof.missing()
    if missing:
        (pytest.fail if REQUIRE_PRIVILEGED else pytest.skip)(missing)
    return prof


@pytest.fixture
def world(make_netns: Callable[[str], netns.Throwaway], profile: HostProfile, tmp_path: Path) -> Iterator[World]:
    host = make_netns("host")
    outside = make_netns("out")
    veth(host.path, "uplink0", [f"{HOST_UPLINK}/24"], outside.path, "eth0", [f"{OUTSIDE}/24"])

    def default_route() -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            ipr.route("add", dst="0.0.0.0/0", gateway=OUTSIDE)

    netns.run_in(host.path, default_route)
    profile.build(host.path, BRIDGE)
    (tmp_path / "state").mkdir(mode=0o700)
    conf = NomadBridgeConfig(BRIDGE, SUBNET, ipam_data_dir=str(tmp_path / "ipam"))
    raw = bridge_conflist(conf)
    network = conflist_from_bytes(raw)
    runtime = Runtime(
        [],
        cache_dir=str(tmp_path / "cache"),
        state_dir=str(tmp_path / "state"),
        backend="inprocess",
        host_netns=host.path,
    )
    yield World(host.path, outside.path, profile, runtime, network, make_netns, raw)
    profile.teardown(host.path)

"""The configurator driving pycni's real go-cni style client, with the scriptable fake plugins (exec'd)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pycni import client
from pycni.nomad.configurator import NetworkConfigurator
from pycni.nomad.models import Allocation, Node

from .conftest import fixture_json


def test_setup_check_and_teardown_through_the_client(fake_plugins: Any, tmp_path: Path) -> None:
    conflist = fake_plugins.conflist(
        fake_plugins.plugin("fake-a"),
        {**fake_plugins.plugin("fake-b", ADD={"echo_prev": True}), "capabilities": {"portMappings": True}},
        name="nomad",
        version="1.0.0",
    )
    cni = client.CNI(plugin_dirs=[str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="exec")
    alloc = Allocation.from_json(fixture_json("bridge_ports_alloc.json"))
    node = Node.from_json(fixture_json("node.json"))  # bridge plugin v1.4.0: CHECK is allowed
    conf = NetworkConfigurator(cni, conflist, node, ignore_port_mapping_host_ip=False)
    netns = str(tmp_path / "netns")
    Path(netns).touch()

    status = conf.setup(alloc, netns, created=True)
    assert status is not None
    assert (status.interface_name, status.address) == ("eth0", "198.18.0.2")

    add_a, add_b = fake_plugins.calls()
    assert add_a["env"]["CNI_CONTAINERID"] == alloc.id and add_a["env"]["CNI_IFNAME"] == "eth0"
    pairs = dict(kv.split("=", 1) for kv in add_a["env"]["CNI_ARGS"].split(";"))
    assert pairs["IgnoreUnknown"] == "true" and pairs["NOMAD_JOB_ID"] == "shop" and pairs["K8S_POD_NAMESPACE"] == "web"
    # Only the plugin declaring the capability gets the port maps, in order, with host IPs.
    assert "runtimeConfig" not in add_a["stdin"]
    mappings = add_b["stdin"]["runtimeConfig"]["portMappings"]
    assert mappings[0] == {"hostPort": 8443, "containerPort": 443, "protocol": "tcp", "hostIP": "192.168.56.11"}
    assert len(mappings) == 6

    assert conf.setup(alloc, netns, created=False) is None
    assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()[2:]] == ["CHECK", "CHECK"]

    assert conf.teardown(alloc, netns) is None
    dels = fake_plugins.calls()[4:]
    assert [c["env"]["CNI_COMMAND"] for c in dels] == ["DEL", "DEL"]
    assert all(c["env"].get("CNI_ARGS", "") == "" for c in dels)  # teardown passes no args

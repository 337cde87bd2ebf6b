"""Hostile names and values are refused before use: nothing is written outside the cache and data
dirs, no nftables rule text is injected, the host namespace is never configured as a container."""

from __future__ import annotations

import copy
import json
import os

import pytest

from pycni.config import conflist_from_bytes
from pycni.errors import CNIError
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from tests.helpers.kernel import links, nft_ruleset

pytestmark = pytest.mark.privileged

HOSTILE_STRINGS = ["../../etc", "a/b", "x;flush ruleset", 'q"; flush ruleset; "', "new\nline", "tab\tx", "..", "-x"]


def chain(tmp_path):
    return {
        "cniVersion": "1.0.0",
        "name": "hostile",
        "plugins": [
            {"type": "loopback"},
            {
                "type": "bridge",
                "bridge": "hbr0",
                "isGateway": True,
                "ipMasq": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "198.18.8.0/24"}]],
                    "dataDir": str(tmp_path / "ipam"),
                },
            },
            {"type": "firewall", "iptablesAdminChainName": "HOSTILE-ADMIN"},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


@pytest.fixture
def world(host_ns, make_netns, tmp_path, monkeypatch):
    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "state"))
    runtime = Runtime(["/usr/lib/cni"], cache_dir=str(tmp_path / "cache"), backend="inprocess", host_netns=host_ns.path)
    return runtime, make_netns("c"), tmp_path


def snapshot(tmp_path, host_ns):
    files = set()
    for root, dirs, names in os.walk(tmp_path):
        for n in dirs + names:
            files.add(os.path.relpath(os.path.join(root, n), tmp_path))
    return files, set(links(host_ns.path)), nft_ruleset(host_ns.path)


def assert_refused_and_untouched(world, host_ns, attempt, before=None):
    runtime, ctr, tmp_path = world
    before = before or snapshot(tmp_path, host_ns)
    with pytest.raises(CNIError) as raised:
        attempt()
    files, host_links, ruleset = snapshot(tmp_path, host_ns)
    new_files = {f for f in files - before[0] if not f.startswith(("cache", "ipam", "state"))}
    assert not new_files, f"written outside the cache and data dirs: {new_files}"
    assert host_links == before[1], "host links changed"
    assert ruleset == before[2], "host nftables changed"
    assert set(links(ctr.path)) == {"lo"}
    leases = [f for f in files if f.startswith("ipam/") and f.rsplit("/", 1)[-1][0].isdigit()]
    assert not leases, leases
    return raised.value


@pytest.mark.parametrize(
    "field, value",
    [
        (field, value)
        for field in ("container_id", "ifname", "network")
        for value in HOSTILE_STRINGS
        if not (field == "ifname" and value == "-x")  # a valid interface name
    ],
)
def test_hostile_names_are_refused_before_use(world, host_ns, tmp_path, field, value):
    runtime, ctr, _ = world
    conf = chain(tmp_path)
    rt = RuntimeConf("ok", ctr.path, "eth0")
    if field == "network":
        conf["name"] = value
    else:
        rt = RuntimeConf(**{"container_id": "ok", "netns": ctr.path, "ifname": "eth0", field: value})
    network = conflist_from_bytes(json.dumps(conf).encode())
    error = assert_refused_and_untouched(world, host_ns, lambda: runtime.add_network_list(network, rt))
    assert error.code in (3, 4, 7)


@pytest.mark.parametrize(
    "path, value",
    [
        (("plugins", 1, "bridge"), 'br"; flush ruleset'),
        (("plugins", 1, "bridge"), "../../x"),
        (("plugins", 1, "bridge"), "a-bridge-name-too-long"),
        (("plugins", 1, "ipam", "dataDir"), "/tmp/../../etc/../tmp/x\x00y"),
        (("plugins", 1, "ipam", "dataDir"), "../relative"),
        (("plugins", 2, "iptablesAdminChainName"), 'ADMIN"; flush ruleset; "'),
        (("plugins", 2, "iptablesAdminChainName"), "A\nB"),
        (("plugins", 0, "type"), "../../bin/sh"),
        (("plugins", 1, "ipam", "type"), "../host-local"),
    ],
)
def test_hostile_config_values_are_refused(world, host_ns, tmp_path, path, value):
    runtime, ctr, _ = world
    conf = chain(tmp_path)
    target = conf
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value

    def attempt():
        network = conflist_from_bytes(json.dumps(conf).encode())
        runtime.add_network_list(network, RuntimeConf("ok", ctr.path, "eth0"), rollback=True)

    assert_refused_and_untouched(world, host_ns, attempt)


@pytest.mark.parametrize(
    "mapping",
    [
        {"hostPort": 8080, "containerPort": 80, "protocol": 'tcp"; flush ruleset; "'},
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "1.2.3.4; flush ruleset"},
        {"hostPort": 70000, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": -1, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": "8080", "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 2**64, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 8080, "containerPort": 80, "protocol": 5},
    ],
)
def test_hostile_port_mappings_inject_nothing_and_roll_back(world, host_ns, tmp_path, mapping):
    runtime, ctr, _ = world
    network = conflist_from_bytes(json.dumps(chain(tmp_path)).encode())
    rt = RuntimeConf("ok", ctr.path, "eth0", capability_args={"portMappings": [copy.deepcopy(mapping)]})
    error = assert_refused_and_untouched(
        world, host_ns, lambda: runtime.add_network_list(network, rt, rollback=True), before=None
    )
    assert "flush" not in json.dumps(nft_ruleset(host_ns.path)) or error


def test_the_host_namespace_is_never_configured_as_a_container(world, host_ns, tmp_path):
    runtime, _, _ = world
    network = conflist_from_bytes(json.dumps(chain(tmp_path)).encode())
    for command in ("add", "del"):
        before = snapshot(tmp_path, host_ns)
        with pytest.raises(CNIError) as raised:
            rt = RuntimeConf("ok", host_ns.path, "eth0")
            if command == "add":
                runtime.add_network_list(network, rt)
            else:
                runtime.delete_network_list(network, rt)
        assert raised.value.code == 8
        assert snapshot(tmp_path, host_ns)[1:] == before[1:]


@pytest.mark.parametrize("netns_path", ["/etc/hostname", "/proc/self/ns/mnt", "/nonexistent/ns"])
def test_a_netns_path_that_is_not_a_network_namespace_is_refused(world, host_ns, tmp_path, netns_path):
    runtime, _, _ = world
    network = conflist_from_bytes(json.dumps(chain(tmp_path)).encode())
    assert_refused_and_untouched(
        world, host_ns, lambda: runtime.add_network_list(network, RuntimeConf("ok", netns_path))
    )

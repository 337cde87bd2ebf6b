"""The debug log of an in-process ADD and DEL: every kernel change, named with its attachment; nothing at
the default level."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pycni.config import conflist_from_bytes
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.sdk import logs

pytestmark = pytest.mark.privileged

CID = "logc1"
ATTACHMENT = "network=lognet container=logc1 ifname=eth0"


def _conflist(tmp_path: Any) -> Any:
    ipam = {"type": "host-local", "dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": "198.18.93.0/24"}]]}
    plugins = [
        {"type": "loopback"},
        {"type": "bridge", "bridge": "plog0", "isGateway": True, "isDefaultGateway": True, "ipMasq": True}
        | {"ipam": ipam},
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "bandwidth", "ingressRate": 4_000_000, "ingressBurst": 80_000},
    ]
    return conflist_from_bytes(json.dumps({"cniVersion": "1.0.0", "name": "lognet", "plugins": plugins}).encode())


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """What pycni logs during the test, as ``configure`` installs it; undone afterwards."""
    stream = io.StringIO()
    yield stream
    logging.getLogger().removeHandler(logs.configure(logging.WARNING, stream=io.StringIO()))
    for name in logs.LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


def _add(host_ns: Any, make_netns: Any, tmp_path: Any) -> Callable[[], None]:
    """ADD; returns the DEL."""
    ctr = make_netns("c")
    runtime = Runtime([], cache_dir=str(tmp_path / "cache"), backend="inprocess", host_netns=host_ns.path)
    ports = {"portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]}
    rt = RuntimeConf(CID, ctr.path, "eth0", capability_args=ports)
    runtime.add_network_list(_conflist(tmp_path), rt)
    return lambda: runtime.delete_network_list(_conflist(tmp_path), rt)


def test_debug_log_of_an_in_process_bridge_add_and_del_names_each_kernel_change_and_its_attachment(
    host_ns, make_netns, tmp_path, logged, kit
):
    logs.configure(logging.DEBUG, stream=logged, env={})
    delete = _add(host_ns, make_netns, tmp_path)
    lines = logged.getvalue().splitlines()

    def changes(plugin: str, needle: str, command: str = "ADD") -> list[str]:
        fields = f"{ATTACHMENT} plugin={plugin} command={command}"
        return [line for line in lines if " DEBUG pycni_plugins.kernel: " in line and needle in line and fields in line]

    assert changes("bridge", "netlink link add ifname=plog0 kind=bridge")
    assert changes("bridge", "netlink link add kind=veth")
    assert changes("bridge", "netlink link set")  # the veth's master, up
    assert any("address=198.18.93.2" in line for line in changes("bridge", "netlink addr add"))
    assert any("gateway=198.18.93.1" in line for line in changes("bridge", "netlink route append"))
    assert changes("bridge", "sysctl net/ipv4/ip_forward=1")
    assert changes("bridge", "nft transaction")  # the masquerade elements
    assert changes("portmap", "nft transaction") and any("18080" in ln for ln in changes("portmap", "nft transaction"))
    assert any("tbf" in line for line in changes("bandwidth", "netlink tc add"))
    # each plugin call once, by the runtime, with its outcome and duration
    calls = [line for line in lines if " DEBUG pycni.runtime: plugin " in line]
    assert [line.split(" DEBUG pycni.runtime: ")[1].split(":")[0] for line in calls] == [
        f"plugin {t} ADD network=lognet container={CID} ifname=eth0"
        for t in ("loopback", "bridge", "portmap", "bandwidth")
    ]
    assert all(": code 0 in " in line and line.endswith("ms") for line in calls)
    # the changes happen in two namespaces: the host's and the container's
    namespaces = {line.split("[netns ")[1].split("]")[0] for line in changes("bridge", "netlink ")}
    assert len(namespaces) == 2

    delete()
    kit.join_delete_helpers()  # the veth is deleted by a helper thread, which logs after DEL returns
    lines = logged.getvalue().splitlines()
    assert changes("bridge", "netlink link del ifname=veth", "DEL")
    assert changes("bridge", "nft transaction", "DEL") and changes("portmap", "nft transaction", "DEL")
    assert changes("bandwidth", "netlink tc del", "DEL")


def test_the_default_level_logs_nothing_for_a_successful_add(host_ns, make_netns, tmp_path, logged):
    logs.configure(stream=logged, env={})
    _add(host_ns, make_netns, tmp_path)
    assert logged.getvalue() == ""

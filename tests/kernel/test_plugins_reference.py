"""pycni's plugins next to the Debian reference binaries: same results and kernel state."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from pycni import netns
from pycni_plugins.bridge import BridgePlugin
from pycni_plugins.loopback import LoopbackPlugin

pytestmark = [pytest.mark.privileged, pytest.mark.reference]

REF = "/usr/lib/cni"
SYSCTLS_HOST = ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv6/conf/pbr0/accept_ra"]
SYSCTLS_CTR = [
    "net/ipv6/conf/eth0/accept_dad",
    "net/ipv4/conf/eth0/arp_notify",
    "net/ipv6/conf/eth0/disable_ipv6",
    "net/ipv6/conf/lo/disable_ipv6",
]


def _exec(plugin: str, command: str, conf: dict, cid: str, nspath: str, ifname: str = "eth0") -> dict:
    fd = os.open(nspath, os.O_RDONLY)
    try:
        env = {
            "PATH": os.environ["PATH"],
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": f"/proc/self/fd/{fd}",
            "CNI_IFNAME": ifname,
            "CNI_PATH": REF,
        }
        p = subprocess.run(
            [f"{REF}/{plugin}"], input=json.dumps(conf).encode(), capture_output=True, env=env, pass_fds=(fd,)
        )
    finally:
        os.close(fd)
    assert p.returncode == 0, p.stdout
    return json.loads(p.stdout) if p.stdout else {}


def _normalise(result: dict, sandbox: str) -> dict:
    text = json.dumps(result, sort_keys=True)
    text = re.sub(r'"([0-9a-f]{2}:){5}[0-9a-f]{2}"', '"MAC"', text)
    text = re.sub(r'"veth[0-9a-f]{8}"', '"VETH"', text)
    return json.loads(text.replace(sandbox, "SANDBOX"))


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_bridge_dual_stack_matches_reference(make_netns, kit, tmp_path, version):
    outcomes = []
    for impl in ("go", "pycni"):
        host, ctr = make_netns("host"), make_netns("c")
        conf = kit.bridge_conf(
            tmp_path / impl, [{"subnet": "10.77.0.0/24"}], [{"subnet": "fd77::/64"}], cniVersion=version
        )
        with netns.entered(host.path):
            if impl == "go":
                result = _exec("bridge", "ADD", conf, "c1", ctr.path)
                sandbox = result["interfaces"][2]["sandbox"]
            else:
                result = BridgePlugin().handle(kit.request("ADD", conf, "c1", ctr.path))
                sandbox = ctr.path
            host_sysctls = [kit.sysctl_in(None, s) for s in SYSCTLS_HOST]
        ctr_sysctls = [kit.sysctl_in(ctr.path, s) for s in SYSCTLS_CTR]
        outcomes.append((_normalise(result, sandbox), host_sysctls, ctr_sysctls))
    go, ours = outcomes
    if version == "1.0.0":  # v1.1.1 always prints an empty "dns": {}; v1.9.1 (and pycni) omit it
        go[0].pop("dns", None)
    assert ours == go


def test_loopback_matches_reference(make_netns, kit):
    conf = {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}
    go_ns, our_ns = make_netns("c"), make_netns("c")
    go = _exec("loopback", "ADD", conf, "c1", go_ns.path, "lo")
    ours = LoopbackPlugin().handle(kit.request("ADD", conf, "c1", our_ns.path, "lo"))
    go.pop("dns", None)
    assert _normalise(ours, our_ns.path) == _normalise(go, go["interfaces"][0]["sandbox"])

"""dhcp is not built in (it needs its daemon and a DHCP server): a ``dhcp`` binary on CNI_PATH
is exec'd, both as a chain's plugin under the ``auto`` backend and as the IPAM plugin a built-in
plugin delegates to in-process. The binary here is the scriptable fake plugin named ``dhcp``."""

from __future__ import annotations

import json

import pytest

from pycni import netns
from pycni.config import conflist_from_bytes
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.sdk import PluginRequest, builtin_plugin
from pycni_plugins.macvlan import MacvlanPlugin

DHCP_RESULT = {
    "cniVersion": "1.0.0",
    "ips": [{"address": "198.18.4.20/24", "gateway": "198.18.4.1"}],
    "routes": [{"dst": "0.0.0.0/0"}],
}


def test_dhcp_is_not_built_in_and_auto_execs_the_binary(fake_plugins, tmp_path):
    assert builtin_plugin("dhcp") is None
    fake_plugins.install("dhcp")
    net = conflist_from_bytes(fake_plugins.conflist(fake_plugins.plugin("dhcp", ADD={"result": DHCP_RESULT})))
    runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="auto")
    result = runtime.add_network_list(net, RuntimeConf("c1", "/run/netns/none", "eth0"))
    assert str(result.ips[0].address) == "198.18.4.20/24"
    assert [c["type"] for c in fake_plugins.calls()] == ["dhcp"]


@pytest.mark.privileged
def test_a_built_in_plugin_delegates_ipam_to_an_exec_d_dhcp_binary(host, make_netns, fake_plugins):
    fake_plugins.install("dhcp")

    def master() -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            ipr.link("add", ifname="mst0", kind="veth", peer="mst0p", state="up")

    netns.run_in(host.path, master)
    ctr = make_netns("c")
    conf = {
        "cniVersion": "1.0.0",
        "name": "dhcpnet",
        "type": "macvlan",
        "master": "mst0",
        "ipam": {"type": "dhcp"},
        "fake": {"log": str(fake_plugins.log), "ADD": {"result": DHCP_RESULT}},
    }
    path = (str(fake_plugins.dir),)
    out = MacvlanPlugin().handle(PluginRequest("ADD", conf, "c1", ctr.path, "eth0", "", path))
    assert out["ips"] == [{"address": "198.18.4.20/24", "gateway": "198.18.4.1", "interface": 0}]

    def addresses() -> list[str]:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname="eth0")[0]
            return [f"{a.get('address')}/{a['prefixlen']}" for a in ipr.addr("dump", index=index, family=2)]

    assert netns.run_in(ctr.path, addresses) == ["198.18.4.20/24"]
    MacvlanPlugin().handle(PluginRequest("DEL", conf, "c1", ctr.path, "eth0", "", path))
    calls = fake_plugins.calls()
    assert [(c["type"], c["env"]["CNI_COMMAND"]) for c in calls] == [("dhcp", "ADD"), ("dhcp", "DEL")]
    assert json.dumps(calls[0]["stdin"]["ipam"]) == '{"type": "dhcp"}'

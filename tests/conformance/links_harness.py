"""Twin worlds for the plugins that hand a host link to the container (macvlan, ipvlan, vlan,
host-device) and the meta plugins chained after them (sbr, vrf).

Each implementation -- the Go reference exec'd from /usr/lib/cni (``go``), pycni's plugins
in-process (``pycni``) and pycni's plugins exec'd as installed by ``pycni plugins install``
(``pycni-exec``) -- gets its own throwaway "host" namespace, a "lan" namespace wired to it by a
veth whose host end ``mst0`` is the master, a container namespace, and its own IPAM dataDir and
results cache. Nothing touches the root namespace; removing the namespaces removes everything.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pycni import netns
from pycni.config import conflist_from_bytes
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.sdk import PluginRequest, builtin_plugin
from pycni.sdk.invoke import exec_plugin
from pycni.testing import probes
from pycni.types import AnyResult
from pycni_plugins import install
from tests.conftest import REFERENCE_PLUGIN_DIR, TEST_NS_PREFIX
from tests.helpers.slow import scaled

from .twins import read_sysctl, veth_to, wait_no_tentative

IMPLS = ("go", "pycni", "pycni-exec")
MASTER = "mst0"
LAN = {4: ("198.18.1.1", 24), 6: ("fd00:18:1::1", 64)}
SUBNETS = {4: "198.18.1.0/24", 6: "fd00:18:1::/64"}
CONTAINER_SYSCTLS = (
    "net/ipv4/conf/eth0/arp_notify",
    "net/ipv6/conf/eth0/ndisc_notify",
    "net/ipv6/conf/eth0/keep_addr_on_down",
    "net/ipv6/conf/eth0/disable_ipv6",
)


def host_local(data_dir: Path, families: tuple[int, ...] = (4,), **extra: Any) -> dict[str, Any]:
    ranges = [[{"subnet": SUBNETS[v], "rangeStart": "198.18.1.10" if v == 4 else "fd00:18:1::10"}] for v in families]
    routes = [{"dst": "0.0.0.0/0" if v == 4 else "::/0"} for v in families]
    gw = {4: "198.18.1.1", 6: "fd00:18:1::1"}
    for v, r in zip(families, ranges):
        r[0]["gateway"] = gw[v]
    return {"type": "host-local", "ranges": ranges, "routes": routes, "dataDir": str(data_dir), **extra}


class World:
    def __init__(self, impl: str, root: Path, make_netns: Callable[[str], netns.Throwaway], plugin_dir: str) -> None:
        self.impl, self.root = impl, root
        self.host = make_netns(f"{impl[:4]}-host")
        self.lan = make_netns(f"{impl[:4]}-lan")
        self.ctr = make_netns(f"{impl[:4]}-c")
        netns.run_in(self.host.path, veth_to, self.lan.path, MASTER, "lan0", (), tuple(LAN.values()))
        # The kernel adds (then DADs) the link-local addresses a moment after the veth is up:
        # wait for them, so that a test's "before" snapshot is not taken half-way.
        netns.run_in(self.host.path, _wait_link_local, MASTER)
        netns.run_in(self.lan.path, _wait_link_local, "lan0")
        for path in (self.host.path, self.lan.path):
            netns.run_in(path, wait_no_tentative)
        dirs = [REFERENCE_PLUGIN_DIR] if impl == "go" else [plugin_dir]
        self.runtime = Runtime(
            dirs,
            cache_dir=str(root / "cache"),
            backend="inprocess" if impl == "pycni" else "exec",
            timeout=60,
            host_netns=self.host.path,
        )
        self.plugin_dirs = tuple(dirs)
        self.rt = RuntimeConf("ctr1", self.ctr.path, "eth0")
        self.result: AnyResult | None = None

    def network(self, version: str, *plugins: dict[str, Any]) -> Any:
        return conflist_from_bytes(
            json.dumps({"cniVersion": version, "name": "linknet", "plugins": list(plugins)}).encode()
        )

    def add(self, net: Any, **kw: Any) -> AnyResult:
        self.result = self.runtime.add_network_list(net, self.rt, **kw)
        return self.result

    def check(self, net: Any) -> None:
        self.runtime.check_network_list(net, self.rt)

    def delete(self, net: Any) -> None:
        self.runtime.delete_network_list(net, self.rt)

    def call(self, command: str, conf: dict[str, Any]) -> dict[str, Any] | None:
        """One plugin call in this world's host, bypassing the runtime (e.g. CHECK with a
        hand-made prevResult); a failure raises the plugin's CNIError."""
        config = {"cniVersion": "1.0.0", "name": "linknet", **conf}
        request = PluginRequest(command, config, "ctr1", self.ctr.path, "eth0", "", self.plugin_dirs)
        if self.impl == "pycni":
            plugin = builtin_plugin(conf["type"])
            assert plugin is not None
            return netns.run_in(self.host.path, plugin.handle, request)
        return netns.run_in(self.host.path, exec_plugin, conf["type"], request, timeout=60)

    def normalise(self, data: Any) -> Any:
        text = json.dumps(data, sort_keys=True, default=str).replace(self.ctr.path, "SANDBOX")
        text = re.sub(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", "MAC", text)
        text = re.sub(r"fe80::[0-9a-f:]+/64", "fe80::LL/64", text)
        return json.loads(text)

    def snapshot(self, host_sysctls: tuple[str, ...] = ()) -> dict[str, Any]:
        return self.normalise(
            {
                "host": netns.run_in(self.host.path, read_state, host_sysctls),
                "container": netns.run_in(self.ctr.path, read_state, CONTAINER_SYSCTLS),
            }
        )

    def settle(self) -> None:
        for path in (self.host.path, self.ctr.path, self.lan.path):
            netns.run_in(path, wait_no_tentative)

    def reaches_lan(self, version: int = 4) -> bool:
        """A TCP connection to the lan peer from the container's own address (bound: the rules
        sbr adds only match a known source)."""
        self.settle()
        assert self.result is not None
        src = next(str(ip.address.ip) for ip in self.result.ips if ip.address.version == version)
        with probes.TCPEchoServer(self.lan.path, 7000):
            return netns.run_in(self.ctr.path, _connect_from, src, LAN[version][0], 7000)


def worlds(root: Path, make_netns: Callable[[str], netns.Throwaway]) -> dict[str, World]:
    plugin_dir = root / "pycni-bin"
    install.install(str(plugin_dir))
    return {impl: World(impl, root / impl, make_netns, str(plugin_dir)) for impl in IMPLS}


def kernel_has(kind: str) -> bool:
    """Whether this kernel can make a ``kind`` link (tried on a veth in a throwaway namespace)."""

    def probe() -> bool:
        from pyroute2 import IPRoute, NetlinkError

        with IPRoute() as ipr:
            ipr.link("add", ifname="probe0", kind="veth", peer="probe1")
            index = ipr.link_lookup(ifname="probe0")[0]
            extra = {"vlan_id": 5} if kind == "vlan" else {"vrf_table": 10} if kind == "vrf" else {}
            try:
                ipr.link("add", ifname="probe2", kind=kind, **({} if kind == "vrf" else {"link": index}), **extra)
            except NetlinkError:
                return False
            return True

    with netns.Throwaway(prefix=f"{TEST_NS_PREFIX}-probe") as ns:
        return netns.run_in(ns.path, probe)


# --- run inside a namespace ---------------------------------------------------------------------


def _connect_from(src: str, dst: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.bind((src, 0))
        try:
            s.connect((dst, port))
        except OSError:
            return False
        return True


def _wait_link_local(name: str, timeout: float = 10.0) -> None:
    import time

    from pyroute2 import IPRoute

    deadline = time.monotonic() + scaled(timeout)
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=name)[0]
        while not any(
            str(a.get("address", "")).startswith("fe80:") for a in ipr.addr("dump", index=index, family=socket.AF_INET6)
        ):
            assert time.monotonic() < deadline, f"no link-local address on {name}"
            time.sleep(0.01)


def read_state(sysctls: tuple[str, ...] = ()) -> dict[str, Any]:
    """Links (kind, kind data, master, flags, MTU, addresses), routes of every table, rules."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        by_index = {link["index"]: link for link in ipr.link("dump")}
        names = {i: link.get("ifname") for i, link in by_index.items()}
        links: dict[str, Any] = {}
        for link in by_index.values():
            data = link.get(("linkinfo", "data"))
            kind_data = {}
            if data is not None:
                for key, value in data["attrs"]:
                    if key in ("IFLA_MACVLAN_MODE", "IFLA_IPVLAN_MODE", "IFLA_VLAN_ID", "IFLA_VRF_TABLE"):
                        kind_data[key] = value
            links[link.get("ifname")] = {
                "kind": link.get(("linkinfo", "kind")),
                "data": kind_data,
                "master": names.get(link.get("master")),
                "up": bool(link["flags"] & 1),
                "mtu": link.get("mtu"),
                "mac": link.get("address"),
                "alias": link.get("ifalias"),
                "addresses": sorted(
                    f"{a.get('address')}/{a['prefixlen']}" for a in ipr.addr("dump", index=link["index"])
                ),
            }
        routes = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in ipr.route("dump", family=family):
                if r.get("type") == 1 and r.get("table") != 255:  # unicast, not the local table
                    routes.append(
                        f"table {r.get('table')} {r.get('dst') or 'default'}/{r['dst_len']} via {r.get('gateway')} "
                        f"dev {names.get(r.get('oif'))} src {r.get('prefsrc')} metric {r.get('priority')}"
                    )
        rules = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in ipr.get_rules(family=family):
                rules.append(f"{r.get('priority')}: from {r.get('src') or 'all'}/{r['src_len']} table {r.get('table')}")
    return {
        "links": links,
        "routes": sorted(routes),
        "rules": sorted(rules),
        "sysctls": {s: read_sysctl(s) for s in sysctls},
    }

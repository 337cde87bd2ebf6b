"""One conflist through the Go reference plugins and through pycni_plugins, side by side.

Each implementation gets its own *world*: a throwaway "host" namespace (the runtime runs every
plugin there, ``host_netns=``), container namespaces, an "outside" namespace wired to the host by
a veth (198.19.255.0/24 and fd00:19::/64, standing for the network beyond the host), and its own
IPAM dataDir and results cache. pycni's state dir is ``$PYCNI_STATE_DIR``, set per test by the
fixtures. Nothing here touches the root namespace; removing the namespaces removes everything.

Kernel state is read with pyroute2 and libnftables directly, independently of the plugins'
own helpers, and normalised (``snapshot``) so that the two worlds compare equal where the two
implementations behave alike: MACs, veth names, link-local addresses and namespace paths differ
by nature and are replaced by placeholders.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from pycni import netns
from pycni.config import NetworkConfigList, conflist_from_bytes
from pycni.nomad.conflist import NomadBridgeConfig, bridge_conflist
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.testing import probes
from pycni.types import AnyResult
from tests.conftest import REFERENCE_PLUGIN_DIR

from .twins import read_sysctl, veth_to, wait_no_tentative

IMPLS = ("go", "pycni")
OUTSIDE = {4: ("198.19.255.1", "198.19.255.2", 24), 6: ("fd00:19::1", "fd00:19::2", 64)}
HOST_PORT, CONTAINER_PORT, OUTSIDE_PORT = 8080, 80, 9000
PORTS = {"portMappings": [{"hostPort": HOST_PORT, "containerPort": CONTAINER_PORT, "protocol": "tcp"}]}
BRIDGE = "cbr0"


# --- conflists ----------------------------------------------------------------------------------


def default_chain(
    data_dir: str, version: str, ranges: list[list[dict[str, str]]], routes: list[dict[str, str]]
) -> bytes:
    """loopback, bridge + host-local (ipMasq, isGateway, hairpin), firewall, portmap."""
    return json.dumps(
        {
            "cniVersion": version,
            "name": "confnet",
            "plugins": [
                {"type": "loopback"},
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {"type": "host-local", "ranges": ranges, "routes": routes, "dataDir": data_dir},
                },
                {"type": "firewall"},
                {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
            ],
        }
    ).encode()


V4_RANGES = [[{"subnet": "198.18.0.0/24"}]]
V6_RANGES = [[{"subnet": "fd00:18::/64"}]]


def nomad_chain(data_dir: str) -> bytes:
    """Nomad's own bridge conflist, byte for byte, with only its IPAM dataDir moved."""
    conf = json.loads(bridge_conflist(NomadBridgeConfig().with_defaults()))
    conf["plugins"][1]["ipam"]["dataDir"] = data_dir
    return json.dumps(conf).encode()


#: name -> (conflist builder taking the IPAM dataDir, address families, hairpinMode)
SCENARIOS: dict[str, tuple[Callable[[str], bytes], tuple[int, ...], bool]] = {
    "ipv4-0.4.0": (lambda d: default_chain(d, "0.4.0", V4_RANGES, [{"dst": "0.0.0.0/0"}]), (4,), True),
    "ipv4-1.0.0": (lambda d: default_chain(d, "1.0.0", V4_RANGES, [{"dst": "0.0.0.0/0"}]), (4,), True),
    "dual-0.4.0": (
        lambda d: default_chain(d, "0.4.0", V4_RANGES + V6_RANGES, [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]),
        (4, 6),
        True,
    ),
    "dual-1.0.0": (
        lambda d: default_chain(d, "1.0.0", V4_RANGES + V6_RANGES, [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]),
        (4, 6),
        True,
    ),
    "ipv6-1.0.0": (lambda d: default_chain(d, "1.0.0", V6_RANGES, [{"dst": "::/0"}]), (6,), True),
    "nomad": (nomad_chain, (4,), False),
}


# --- a world ------------------------------------------------------------------------------------


@attrs.define
class Container:
    id: str
    ns: netns.Throwaway
    rt: RuntimeConf
    result: AnyResult | None = None

    def ip(self, version: int) -> str:
        assert self.result is not None
        return next(str(ip.address.ip) for ip in self.result.ips if ip.address.version == version)

    def gateway(self, version: int) -> str:
        assert self.result is not None
        return next(str(ip.gateway) for ip in self.result.ips if ip.address.version == version)


class World:
    """One implementation's host, outside and containers, and a runtime bound to that host."""

    def __init__(self, impl: str, scenario: str, root: Path, make_netns: Callable[[str], netns.Throwaway]) -> None:
        build, self.families, self.hairpin = SCENARIOS[scenario]
        self.impl = impl
        self.root = root
        self.make_netns = make_netns
        self.host = make_netns(f"{impl}-host")
        self.outside = make_netns(f"{impl}-out")
        netns.run_in(self.host.path, _wire_outside, self.outside.path)
        self.runtime = Runtime(
            [REFERENCE_PLUGIN_DIR],
            cache_dir=str(root / "cache"),
            backend="exec" if impl == "go" else "inprocess",
            timeout=60,
            host_netns=self.host.path,
        )
        self.network: NetworkConfigList = conflist_from_bytes(build(str(root / "ipam")))
        self.bridge = self.network.plugins[1].raw["bridge"]
        self.containers: list[Container] = []

    def container(self, cid: str, ports: bool = False) -> Container:
        ns = self.make_netns(f"{self.impl}-c")
        c = Container(cid, ns, RuntimeConf(cid, ns.path, "eth0", capability_args=PORTS if ports else {}))
        self.containers.append(c)
        return c

    def add(self, c: Container, **kw: Any) -> AnyResult:
        c.result = self.runtime.add_network_list(self.network, c.rt, **kw)
        return c.result

    def check(self, c: Container) -> None:
        self.runtime.check_network_list(self.network, c.rt)

    def delete(self, c: Container, *, ports: bool = True) -> None:
        rt = c.rt if ports else attrs.evolve(c.rt, capability_args={})
        self.runtime.delete_network_list(self.network, rt)

    def settle(self) -> None:
        """Wait until no IPv6 address is tentative anywhere in this world (the Go bridge adds its
        gateway address with DAD: ~1-2 s before the host answers on it)."""
        for path in (self.host.path, *(c.ns.path for c in self.containers)):
            netns.run_in(path, wait_no_tentative)

    # -- what the kernel holds, normalised -------------------------------------------------

    def names(self) -> dict[str, str]:
        """Names that differ by implementation -> placeholders: veths (by owner), sandboxes."""
        out: dict[str, str] = {}
        for c in self.containers:
            if c.result is not None:
                out[c.result.interfaces[1].name] = f"VETH({c.id})"
            out[c.ns.path] = f"SANDBOX({c.id})"
        return out

    def normalise(self, data: Any) -> Any:
        text = json.dumps(data, sort_keys=True, default=str)
        for real, placeholder in self.names().items():
            text = text.replace(real, placeholder)
        text = re.sub(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", "MAC", text)
        text = re.sub(r"fe80::[0-9a-f:]+/64", "fe80::LL/64", text)
        return json.loads(text)

    def snapshot(self) -> dict[str, Any]:
        """Links, addresses, routes and the sysctls the plugins write, host and containers."""
        veths = [c.result.interfaces[1].name for c in self.containers if c.result is not None]
        host_sysctls = ["net/ipv4/ip_forward", f"net/ipv6/conf/{self.bridge}/accept_ra"]
        host_sysctls += [f"net/ipv6/conf/{v}/accept_ra" for v in veths]
        host_sysctls += [f"net/ipv4/conf/{self.bridge}/route_localnet"]
        if 6 in self.families:
            host_sysctls.append("net/ipv6/conf/all/forwarding")
        ctr_sysctls = [
            "net/ipv6/conf/eth0/accept_dad",
            "net/ipv4/conf/eth0/arp_notify",
            "net/ipv6/conf/eth0/keep_addr_on_down",
            "net/ipv6/conf/eth0/disable_ipv6",
            "net/ipv6/conf/lo/disable_ipv6",
        ]
        state = {"host": netns.run_in(self.host.path, _read_state, host_sysctls, False)}
        for c in self.containers:
            state[c.id] = netns.run_in(c.ns.path, _read_state, ctr_sysctls, True)
        return self.normalise(state)

    def firewall_text(self) -> str:
        """The host's packet-filter state as text: pycni's nftables tables, or the reference's
        iptables rules (``iptables-save``, which names their xt matches and targets)."""
        if self.impl == "pycni":
            return _nft_list(self.host.path)
        saves = [["iptables-save"], ["ip6tables-save"]]
        return "".join(netns.run_in(self.host.path, _run, cmd) for cmd in saves)

    def leftovers(self, c: Container) -> dict[str, Any]:
        """Everything of ``c`` still around after its DEL (empty when it is all gone)."""
        assert c.result is not None
        ips = {str(ip.address.ip) for ip in c.result.ips}
        mentions = re.compile("|".join([rf"(?<![\w-]){re.escape(c.id)}(?![\w-])", *(_ip_pattern(ip) for ip in ips)]))
        out: dict[str, Any] = {}
        ctr = netns.run_in(c.ns.path, _read_state, [], True)["links"]
        if set(ctr) != {"lo"}:
            out["container links"] = sorted(ctr)
        host = netns.run_in(self.host.path, _read_state, [], False)["links"]
        if c.result.interfaces[1].name in host:
            out["host veth"] = c.result.interfaces[1].name
        held = [a for link in host.values() for a in link["addresses"] if mentions.search(a)]
        if held:
            out["host addresses"] = held
        leases = [p.name for p in (self.root / "ipam").glob("*/*") if p.name in ips]
        if leases:
            out["leases"] = leases
        rules = [line.strip() for line in self.firewall_text().splitlines() if mentions.search(line)]
        if rules:
            out["firewall"] = rules
        if self.runtime.get_cached_attachments(c.id):
            out["cache"] = c.id
        if self.impl == "pycni":
            records = Path(os.environ["PYCNI_STATE_DIR"]) / "nft"
            mine = [p.name for p in records.glob("*") if p.name != "epoch" and c.id in p.read_text()]
            if mine:
                out["state records"] = mine
        return out


def worlds(scenario: str, tmp: Path, make_netns: Callable[[str], netns.Throwaway]) -> dict[str, World]:
    return {impl: World(impl, scenario, tmp / impl, make_netns) for impl in IMPLS}


# --- behaviour ----------------------------------------------------------------------------------


def behaviour(world: World, a: Container, b: Container) -> dict[str, Any]:
    """What works, per family: ``a`` publishes HOST_PORT -> its port 80, ``b`` publishes nothing.

    Every probe is a fresh TCP connection (or ICMP echo) from the named place; for ``b->outside``
    the value is the source address the outside listener saw (``None``: no connection).
    """
    world.settle()
    out: dict[str, Any] = {}
    for v in world.families:
        gw = a.gateway(v)
        with probes.TCPEchoServer(a.ns.path, CONTAINER_PORT):
            out[f"v{v} ping b->a"] = probes.ping(b.ns.path, a.ip(v))
            out[f"v{v} ping a->b"] = probes.ping(a.ns.path, b.ip(v))
            out[f"v{v} b->hostport via gateway"] = probes.tcp_echo(b.ns.path, gw, HOST_PORT, timeout=2)
            out[f"v{v} host->hostport via gateway"] = probes.tcp_echo(world.host.path, gw, HOST_PORT, timeout=2)
            if v == 4:
                out["v4 host->hostport via 127.0.0.1"] = probes.tcp_echo(
                    world.host.path, "127.0.0.1", HOST_PORT, timeout=2
                )
            out[f"v{v} a->own hostport (hairpin)"] = probes.tcp_echo(a.ns.path, gw, HOST_PORT, timeout=2)
        with probes.TCPEchoServer(world.outside.path, OUTSIDE_PORT) as server:
            reached = probes.tcp_echo(b.ns.path, OUTSIDE[v][1], OUTSIDE_PORT, timeout=2)
            out[f"v{v} b->outside, source seen"] = server.peers[-1] if reached and server.peers else None
    return out


def expected_behaviour(world: World) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in world.families:
        out |= {
            f"v{v} ping b->a": True,
            f"v{v} ping a->b": True,
            f"v{v} b->hostport via gateway": True,
            f"v{v} host->hostport via gateway": True,
            f"v{v} a->own hostport (hairpin)": world.hairpin,
            f"v{v} b->outside, source seen": OUTSIDE[v][0],  # the host's address: masqueraded
        }
        if v == 4:
            out["v4 host->hostport via 127.0.0.1"] = True
    return out


# --- readers (run inside a namespace) ------------------------------------------------------------


def _wire_outside(outside: str) -> None:
    """A veth from this (host) namespace to ``outside``, addressed in both families."""
    here = [(host_ip, plen) for host_ip, _, plen in OUTSIDE.values()]
    there = [(outside_ip, plen) for _, outside_ip, plen in OUTSIDE.values()]
    veth_to(outside, "uplink", "uplink", here, there)


def _read_state(sysctls: list[str], container: bool) -> dict[str, Any]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        by_index = {link["index"]: link for link in ipr.link("dump")}
        names = {i: link.get("ifname") for i, link in by_index.items()}
        links: dict[str, Any] = {}
        for link in by_index.values():
            links[link.get("ifname")] = {
                "kind": link.get(("linkinfo", "kind")),
                "master": names.get(link.get("master")),
                "up": bool(link["flags"] & 1),
                "mtu": link.get("mtu"),
                "txqlen": link.get("txqlen"),
                "hairpin": link.get(("linkinfo", "slave_data", "mode")),
                "addresses": [],
            }
        for addr in ipr.addr("dump"):
            links[names[addr["index"]]]["addresses"].append(f"{addr.get('address')}/{addr['prefixlen']}")
        for link in links.values():
            link["addresses"].sort()
        state: dict[str, Any] = {"links": links}
        if container:
            routes = []
            for family in (socket.AF_INET, socket.AF_INET6):
                for r in ipr.route("dump", family=family, table=254):
                    if r.get("type") == 1:  # unicast (not the IPv6 multicast/anycast housekeeping)
                        routes.append(
                            f"{r.get('dst') or 'default'}/{r['dst_len']} via {r.get('gateway')} "
                            f"dev {names.get(r.get('oif'))} proto {r['proto']} metric {r.get('priority')}"
                        )
            state["routes"] = sorted(routes)
    state["sysctls"] = {name: read_sysctl(name) for name in sysctls}
    return state


def _nft_list(path: str) -> str:
    """``nft list ruleset`` of a namespace (where pycni's tables are)."""

    def read() -> str:
        from pycni._libnftables import Nftables

        rc, out, err = Nftables().cmd("list ruleset")
        assert rc == 0, err
        return out

    return netns.run_in(path, read)


def _ip_pattern(ip: str) -> str:
    """``ip`` as a whole address: ``10.0.0.2`` matches in ``10.0.0.2:80`` but not in ``10.0.0.20``."""
    addr = ipaddress.ip_address(ip)
    edge = "[0-9.]" if addr.version == 4 else "[0-9a-fA-F:]"
    return rf"(?<!{edge}){re.escape(addr.compressed)}(?!{edge})"


def _run(cmd: list[str]) -> str:
    """Run a command in the calling thread's namespace (children inherit the forking thread's)."""
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

"""The bench's drivers: the workload and each backend under test behind one small driver interface.

Workload: the default chain (loopback; bridge + host-local with ipMasq and isGateway; firewall;
portmap with one mapping per container, host port 20000+i → 80/tcp), N containers on one
bridge, subnet 198.18.0.0/16 (RFC 2544 benchmarking space). A Linux bridge holds at most 1023
ports (``BR_MAX_PORTS``; the 1024th ``master`` fails with EXFULL), so above
:data:`PORTS_PER_BRIDGE` containers the cell has several networks of that many containers each
(container i on network i // 1000: its own bridge ``pcbench<k>`` and subnet), the way a host
with 5000 containers has several networks.

Backends, by name:

* ``reference-exec``: Debian's Go reference plugins (/usr/lib/cni) exec'd by pycni's runtime.
* ``pycni-exec``: pycni_plugins exec'd as binaries (the shims ``pycni_plugins.install``
  writes, with no daemon to talk to: each runs its plugin itself).
* ``pycni-daemon``: the same shims, served by a ``pycni serve`` the harness starts (in a
  throwaway namespace of its own: it acts in each caller's namespaces, passed as fds).
* ``pycni-inprocess``: pycni_plugins called in-process by the runtime.
* ``pycni-exec-folded``, ``pycni-daemon-folded``: the folded chain (:func:`pycni.chain.fold`:
  one ``pycni-chain`` plugin holding the list), the only shim installed being the chain's, so one
  exec per network: without a daemon (the shim runs the whole list in its one interpreter) and
  served by a ``pycni serve`` of their own (one request per network).
* ``netavark``: Debian's netavark 1.4 (the Podman peer) doing the equivalent setup/teardown
  per container with the same subnet, addresses and port mapping. It has no CHECK and no IPAM
  (Podman allocates), so each container gets the address host-local would give it: .2, .3, …

A backend that cannot run here is reported with the reason (:func:`problem`) and skipped.

A user's own chain (:func:`load_workload`, ``bench/run.py --conflist``) is measured by the
runtime backends only: ``exec`` (its plugins exec'd from a directory), ``pycni-inprocess``,
``pycni-exec`` and ``pycni-daemon`` (where every type in it is built into pycni), and with
``--fold`` the folded ones (a type not built in is exec'd by the chain from the directory).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from pycni import netns
from pycni.errors import CNIError

from .session import Cell

NETWORK = "pycni-bench"
BRIDGE = "pcbench0"
SUBNET = ipaddress.IPv4Network("198.18.0.0/16")
GATEWAY = SUBNET[1]
#: Containers per network (bridge): the kernel's bridge takes 1023 ports (BR_MAX_PORTS - 1).
PORTS_PER_BRIDGE = 1000
#: Networks k ≥ 1 take /22s of 198.19.0.0/16 below this address (the data plane's "outside" link is above).
_EXTRA_SUBNETS = ipaddress.IPv4Network("198.19.0.0/17")
HOST_PORT_BASE = 20000
CONTAINER_PORT = 80
CNI_VERSION = "1.0.0"  # the newest version the Debian 1.1.1 plugins speak
CHAIN = ("loopback", "bridge", "firewall", "portmap")
PLUGIN_TYPES = (*CHAIN, "host-local")
REFERENCE_DIR = "/usr/lib/cni"
NETAVARK = "/usr/lib/podman/netavark"
TIMEOUT = 60.0
ALL_OPS = ("add", "check", "del")
#: One exec per network: the workload folded into a ``pycni-chain`` plugin.
FOLDED_BACKENDS = ("pycni-exec-folded", "pycni-daemon-folded")
BACKENDS = ("reference-exec", "pycni-exec", "pycni-daemon", *FOLDED_BACKENDS, "pycni-inprocess", "netavark")
#: Not a backend under test: the same kernel objects as the built-in chain with the fewest raw
#: pyroute2/libnftables calls (bench/floor.py), run in every latency section of the built-in chain.
FLOOR = "floor"
#: Backends for a user's conflist: ``exec`` runs its plugins from the workload's plugin dir.
CONFLIST_BACKENDS = ("exec", "pycni-inprocess", "pycni-exec", "pycni-daemon")


class BackendError(Exception):
    """A non-CNI backend (netavark) failed a call."""


#: What a failed workload call raises (anything else is a harness bug and propagates).
FAILURES = (CNIError, BackendError)


def container_id(i: int) -> str:
    return f"{NETWORK}-{i:05d}"


def host_port(i: int) -> int:
    return HOST_PORT_BASE + i


def network_of(i: int) -> int:
    """The network (bridge) container ``i`` is on."""
    return i // PORTS_PER_BRIDGE


def network_name(k: int) -> str:
    return NETWORK if k == 0 else f"{NETWORK}-{k}"


def bridge_name(k: int) -> str:
    return BRIDGE if k == 0 else f"pcbench{k}"


def subnet(k: int) -> ipaddress.IPv4Network:
    """Network 0 is :data:`SUBNET`; the others are /22s (1022 addresses) of 198.19.0.0/17."""
    if k == 0:
        return SUBNET
    extra = list(_EXTRA_SUBNETS.subnets(new_prefix=22))
    if k > len(extra):
        raise ValueError(f"at most {(len(extra) + 1) * PORTS_PER_BRIDGE} containers per cell")
    return extra[k - 1]


def expected_address(i: int) -> str:
    """What host-local hands out to the i-th ADD on a fresh range (the gateway holds .1)."""
    return str(subnet(network_of(i))[i % PORTS_PER_BRIDGE + 2])


def conflist(ipam_dir: str, k: int = 0) -> bytes:
    """The built-in chain's conflist for network ``k``."""
    net = subnet(k)
    plugins: list[dict[str, Any]] = [
        {"type": "loopback"},
        {
            "type": "bridge",
            "bridge": bridge_name(k),
            "isGateway": True,
            "ipMasq": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": str(net), "gateway": str(net[1])}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": ipam_dir,
            },
        },
        {"type": "firewall", "backend": "iptables"},  # explicit: the default would ask firewalld over D-Bus
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    ]
    return json.dumps({"cniVersion": CNI_VERSION, "name": network_name(k), "plugins": plugins}).encode()


def port_mappings(i: int) -> list[dict[str, Any]]:
    return [{"hostPort": host_port(i), "containerPort": CONTAINER_PORT, "protocol": "tcp"}]


@dataclass(frozen=True)
class Workload:
    """The chain a cell runs: the built-in one (:data:`DEFAULT`) or a user's (:func:`load_workload`)."""

    name: str  # what the report calls it
    conflist: Callable[[str], bytes]  # the IPAM data dir -> the conflist's bytes
    chain: tuple[str, ...]  # the plugins' types, in order
    types: tuple[str, ...]  # every plugin type it runs, IPAM ones included
    cni_version: str
    port_mappings: bool  # whether a plugin declares the capability (so each container gets one)
    gateway: str | None  # the host's address on the network: the first-packet walk's destination
    subnet: str
    plugin_dir: str = REFERENCE_DIR  # where ``exec`` finds the plugins


DEFAULT = Workload("built-in", conflist, CHAIN, PLUGIN_TYPES, CNI_VERSION, True, str(GATEWAY), str(SUBNET))


def load_workload(path: str, plugin_dir: str = REFERENCE_DIR) -> Workload:
    """A user's conflist as a workload. Its IPAM state moves into each cell (every ``ipam`` object
    gets the cell's ``dataDir``, so nothing is written to /var/lib/cni); the rest is run as written,
    inside the cell's namespaces."""
    from pycni.config import conflist_from_bytes

    with open(path, "rb") as f:
        data = f.read()
    network = conflist_from_bytes(data, source=path)  # ConfigError (with the path) when it is no conflist
    doc = json.loads(data)
    chain = tuple(p["type"] for p in doc["plugins"])
    types: list[str] = []
    subnet, gateway, ports = "", None, False
    for plugin in doc["plugins"]:
        types.append(plugin["type"])
        ports = ports or bool((plugin.get("capabilities") or {}).get("portMappings"))
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and ipam.get("type"):
            types.append(ipam["type"])
            first = _first_range(ipam)
            if first and not subnet:
                subnet = first["subnet"]
                gateway = first.get("gateway") or str(ipaddress.ip_network(subnet, strict=False)[1])

    def build(ipam_dir: str) -> bytes:
        out = json.loads(data)
        for plugin in out["plugins"]:
            if isinstance(plugin.get("ipam"), dict):
                plugin["ipam"]["dataDir"] = ipam_dir
        return json.dumps(out).encode()

    return Workload(
        os.path.basename(path),
        build,
        chain,
        tuple(dict.fromkeys(types)),
        network.cni_version,
        ports,
        gateway,
        subnet or "(no host-local range)",
        plugin_dir,
    )


def folded(workload: Workload) -> Workload:
    """``workload`` in its folded form: its list inside one ``pycni-chain`` plugin."""
    from pycni.chain import CHAIN_TYPE, fold

    def build(ipam_dir: str) -> bytes:
        return fold(workload.conflist(ipam_dir))

    return dataclasses.replace(workload, conflist=build, types=(CHAIN_TYPE, *workload.types))


def _first_range(ipam: dict[str, Any]) -> dict[str, Any] | None:
    ranges = ipam.get("ranges")
    if isinstance(ranges, list) and ranges and isinstance(ranges[0], list) and ranges[0]:
        return ranges[0][0] if isinstance(ranges[0][0], dict) and "subnet" in ranges[0][0] else None
    return {"subnet": ipam["subnet"], "gateway": ipam.get("gateway")} if "subnet" in ipam else None


class Driver(Protocol):
    """Runs the workload for container ``i`` of a cell. Failures raise ``CNIError`` or
    :class:`BackendError`; ``add`` returns an opaque result that :meth:`address` reads later
    (outside the timed region)."""

    ops: tuple[str, ...]
    workload: Workload

    def add(self, i: int) -> object: ...

    def check(self, i: int) -> None: ...

    def delete(self, i: int) -> None: ...

    def address(self, result: object) -> str: ...


class RuntimeDriver:
    """pycni's runtime over the conflist, with the given backend and plugin path."""

    ops: tuple[str, ...] = ALL_OPS

    def __init__(self, cell: Cell, *, path: list[str], backend: Any, workload: Workload = DEFAULT) -> None:
        from pycni.config import conflist_from_bytes
        from pycni.runtime import Runtime
        from pycni.runtime_conf import RuntimeConf

        self.workload = workload
        self.runtime = Runtime(
            path,
            cache_dir=cell.cache_dir,
            state_dir=os.path.join(cell.dir, "state"),
            backend=backend,
            timeout=TIMEOUT,
            host_netns=cell.host,
        )
        ipam = os.path.join(cell.dir, "ipam")
        networks = network_of(len(cell.containers) - 1) + 1 if cell.containers else 1
        if networks > 1 and workload is not DEFAULT:
            raise ValueError(f"a --conflist cell holds at most {PORTS_PER_BRIDGE} containers (one bridge)")
        self.networks = [
            conflist_from_bytes(conflist(ipam, k) if workload is DEFAULT else workload.conflist(ipam))
            for k in range(networks)
        ]
        self.rts = [
            RuntimeConf(
                container_id(i),
                path_i,
                "eth0",
                capability_args={"portMappings": port_mappings(i)} if workload.port_mappings else {},
            )
            for i, path_i in enumerate(cell.containers)
        ]

    def add(self, i: int) -> object:
        return self.runtime.add_network_list(self.networks[network_of(i)], self.rts[i])

    def check(self, i: int) -> None:
        self.runtime.check_network_list(self.networks[network_of(i)], self.rts[i])

    def delete(self, i: int) -> None:
        self.runtime.delete_network_list(self.networks[network_of(i)], self.rts[i])

    def address(self, result: object) -> str:
        from pycni.types import AnyResult, convert

        return str(convert(cast("AnyResult", result), "1.1.0").ips[0].address.ip)  # what add returned

    def close(self) -> None:
        """Close the directory fds pycni keeps per process (:class:`pycni._fs.KeptDirs`, at most
        32): they are a cache of this cell's state dirs, which go with the cell."""
        from pycni._fs import kept_dirs

        kept_dirs.clear()


class NetavarkDriver:
    """``netavark setup|teardown <netns>`` with JSON network options on stdin, exec'd from a
    thread inside the cell's host namespace (netavark treats its own namespace as the host).

    Kept inside the cell: ``--config`` (aardvark-dns state) is the cell's work dir, DNS is off
    and ``--aardvark-binary`` names a file that does not exist, so no DNS daemon can start; the
    firewall driver is pinned to iptables (1.4's only working one) with ``NETAVARK_FW``. Its
    only other writes are per-namespace sysctls (ip_forward, route_localnet, autoconf).
    """

    ops: tuple[str, ...] = ("add", "del")
    workload = DEFAULT

    def __init__(self, cell: Cell) -> None:
        config_dir = os.path.join(cell.dir, "netavark")
        os.makedirs(config_dir)
        self.host = cell.host
        self.containers = cell.containers
        self.argv = netavark_argv(config_dir)
        self.env = {**os.environ, "NETAVARK_FW": "iptables"}
        self.stdin = [json.dumps(netavark_options(i)).encode() for i in range(len(cell.containers))]

    def _call(self, command: str, i: int) -> bytes:
        return netns.run_in(self.host, self._exec, [*self.argv, command, self.containers[i]], self.stdin[i])

    def _exec(self, argv: list[str], stdin: bytes) -> bytes:
        try:
            proc = subprocess.run(argv, input=stdin, capture_output=True, env=self.env, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise BackendError(f"netavark {argv[-2]} timed out after {TIMEOUT:g}s and was killed") from None
        if proc.returncode != 0:
            raise BackendError(f"netavark {argv[-2]} exit {proc.returncode}: {_netavark_error(proc)}")
        return proc.stdout

    def add(self, i: int) -> object:
        return self._call("setup", i)

    def check(self, i: int) -> None:
        raise NotImplementedError("netavark has no CHECK")

    def delete(self, i: int) -> None:
        self._call("teardown", i)

    def address(self, result: object) -> str:
        status = json.loads(cast(bytes, result))  # what add returned: netavark's stdout
        (network,) = status.values()  # the one network of the container
        ipnet: str = network["interfaces"]["eth0"]["subnets"][0]["ipnet"]
        return ipnet.split("/")[0]


def netavark_argv(config_dir: str) -> list[str]:
    """netavark's command line up to the subcommand: its aardvark-dns state dir is ``config_dir``
    and the aardvark binary it would start does not exist."""
    return [NETAVARK, "--config", config_dir, "--aardvark-binary", os.path.join(config_dir, "no-aardvark-dns")]


def _netavark_error(proc: subprocess.CompletedProcess[bytes]) -> str:
    try:
        return str(json.loads(proc.stdout)["error"])
    except (ValueError, KeyError, TypeError):
        return (proc.stderr or proc.stdout).decode(errors="replace").strip()[-500:]


def netavark_options(i: int) -> dict[str, Any]:
    """netavark 1.4's ``NetworkOptions`` (src/network/types.rs at v1.4.0) for container ``i``."""
    k = network_of(i)
    name, net = network_name(k), subnet(k)
    return {
        "container_id": container_id(i),
        "container_name": f"bench{i}",
        "port_mappings": [
            {"host_ip": "", "container_port": CONTAINER_PORT, "host_port": host_port(i), "range": 1, "protocol": "tcp"}
        ],
        "networks": {name: {"static_ips": [expected_address(i)], "interface_name": "eth0"}},
        "network_info": {
            name: {
                "name": name,
                "id": hashlib.sha256(name.encode()).hexdigest(),
                "driver": "bridge",
                "network_interface": bridge_name(k),
                "subnets": [{"subnet": str(net), "gateway": str(net[1])}],
                "ipv6_enabled": False,
                "internal": False,
                "dns_enabled": False,
                "ipam_options": {"driver": "host-local"},
            }
        },
    }


# -- availability and construction ------------------------------------------------------------


def _missing_builtins(types: tuple[str, ...] = PLUGIN_TYPES) -> list[str]:
    from pycni.sdk import builtin_plugin

    return [t for t in types if builtin_plugin(t) is None]


def problem(name: str, workload: Workload = DEFAULT) -> str | None:
    """Why backend ``name`` cannot run ``workload`` here, or ``None``."""
    if workload is not DEFAULT:
        return _conflist_problem(name, workload)
    if name == FLOOR:
        missing = _missing_builtins()  # the cell's bridge and tables are made by an in-process ADD
        return f"in-process plugins not available: {', '.join(missing)}" if missing else None
    if name not in BACKENDS:
        return f"unknown backend (choose from {', '.join(BACKENDS)})"
    if name in ("reference-exec", "netavark") and shutil.which("iptables") is None:
        return "iptables is not installed"
    if name == "reference-exec":
        missing = [t for t in PLUGIN_TYPES if not os.access(os.path.join(REFERENCE_DIR, t), os.X_OK)]
        if missing:
            return f"missing in {REFERENCE_DIR}: {', '.join(missing)} (apt install containernetworking-plugins)"
        return None
    if name == "netavark":
        return None if os.access(NETAVARK, os.X_OK) else f"{NETAVARK} missing (apt install netavark)"
    missing = _missing_builtins(folded(workload).types if name in FOLDED_BACKENDS else PLUGIN_TYPES)
    if missing:
        return f"in-process plugins not available yet: {', '.join(missing)}"
    if name in ("pycni-exec", "pycni-daemon", *FOLDED_BACKENDS):
        try:
            import pycni_plugins.install  # noqa: F401
        except ImportError as e:
            return f"pycni_plugins.install not available yet ({e})"
    if name in ("pycni-daemon", "pycni-daemon-folded") and shutil.which("nsenter") is None:
        return "nsenter missing (util-linux)"
    return None


def _conflist_problem(name: str, workload: Workload) -> str | None:
    if name not in (*CONFLIST_BACKENDS, *FOLDED_BACKENDS):
        return f"not applicable to a conflist (choose from {', '.join(CONFLIST_BACKENDS + FOLDED_BACKENDS)})"
    if name in ("exec", *FOLDED_BACKENDS):
        # The chain execs from the plugin dir what is not built into pycni, as the runtime would.
        elsewhere = _missing_builtins(workload.types) if name in FOLDED_BACKENDS else workload.types
        missing = [t for t in elsewhere if not os.access(os.path.join(workload.plugin_dir, t), os.X_OK)]
        return f"missing in {workload.plugin_dir}: {', '.join(missing)}" if missing else None
    missing = _missing_builtins(workload.types)
    return f"not applicable: not built into pycni: {', '.join(missing)}" if missing else None


@dataclass(frozen=True)
class Backend:
    name: str
    make: Callable[[Cell], Driver]
    plugin_dir: str = ""  # where its exec'd plugins are (pycni-exec, pycni-daemon)
    socket: str = ""  # the daemon's (pycni-daemon, pycni-daemon-folded)
    daemon_pid: int = 0  # the daemon's process


def backend(
    name: str,
    scratch: str,
    on_close: Callable[[Callable[[], None]], None] | None = None,
    workload: Workload = DEFAULT,
) -> Backend:
    """The driver factory for an available backend (check :func:`problem` first); ``scratch``
    is a session's temp root, where pycni's exec'able plugins are written once; ``on_close``
    registers what to stop when the session ends (the daemon of ``pycni-daemon``)."""
    w = workload
    if name == "reference-exec":
        return Backend(name, lambda cell: RuntimeDriver(cell, path=[REFERENCE_DIR], backend="exec", workload=w))
    if name == "exec":
        return Backend(name, lambda cell: RuntimeDriver(cell, path=[w.plugin_dir], backend="exec", workload=w))
    if name == "pycni-inprocess":
        return Backend(name, lambda cell: RuntimeDriver(cell, path=[], backend="inprocess", workload=w))
    if name == "pycni-exec":
        plugin_dir = install_pycni_plugins(scratch, w.types)
        return Backend(name, lambda cell: RuntimeDriver(cell, path=[plugin_dir], backend="exec", workload=w))
    if name == "pycni-daemon":
        served = _daemon(name, scratch, on_close)
        shims = install_pycni_plugins(scratch, w.types, socket=served.socket, dirname="pycni-shims")
        return Backend(
            name,
            lambda cell: RuntimeDriver(cell, path=[shims], backend="exec", workload=w),
            shims,
            served.socket,
            served.proc.pid,
        )
    if name in FOLDED_BACKENDS:
        # Only the chain's shim: every other plugin of the list runs inside its one exec (a type
        # not built into pycni is exec'd by the chain from the plugin dir, after the shims).
        f = folded(w)
        daemon = _daemon(name, scratch, on_close) if name == "pycni-daemon-folded" else None
        socket = daemon.socket if daemon else None
        shims = install_pycni_plugins(scratch, f.types[:1], socket=socket, dirname=f"{name}-shims")
        path = [shims, w.plugin_dir]
        return Backend(
            name,
            lambda cell: RuntimeDriver(cell, path=path, backend="exec", workload=f),
            shims,
            socket or "",
            daemon.proc.pid if daemon else 0,
        )
    if name == "netavark":
        return Backend(name, NetavarkDriver)
    if name == FLOOR:
        from .floor import FloorDriver

        return Backend(name, FloorDriver)
    raise ValueError(f"unknown backend {name!r}")


def install_pycni_plugins(
    scratch: str,
    types: tuple[str, ...] = PLUGIN_TYPES,
    *,
    socket: str | None = None,
    dirname: str = "pycni-plugins",
) -> str:
    """The shims for ``types`` in ``scratch/dirname``, talking to ``socket`` (default: one that
    never exists in the session, so that they run their plugins themselves whatever runs on the host)."""
    from pycni_plugins.install import install

    plugin_dir = os.path.join(scratch, dirname)
    if not os.path.isdir(plugin_dir):
        install(plugin_dir, types, socket=socket or os.path.join(scratch, "no-daemon", "none.sock"))
    return plugin_dir


class Served:
    """A ``pycni serve`` in a throwaway namespace of its own, its socket under ``scratch/dirname``."""

    def __init__(self, scratch: str, dirname: str) -> None:
        from pycni_plugins.serve.sockets import check

        self.dir = os.path.join(scratch, dirname)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.socket = os.path.join(self.dir, "pycni.sock")
        self.ns = netns.Throwaway(name=f"{os.path.basename(scratch.rstrip('/'))}-{dirname}")
        self.ns.__enter__()
        self.log = open(os.path.join(self.dir, "serve.log"), "wb")
        argv = ["nsenter", f"--net={self.ns.path}", sys.executable, "-m", "pycni.cli", "serve", "--socket", self.socket]
        env = {k: v for k, v in os.environ.items() if k not in ("PYCNI_SOCKET", "PYCNI_DAEMON")}
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while not check(self.socket, timeout=1.0)[0]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise OSError(f"pycni serve did not start (see {self.dir}/serve.log)")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(45)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.ns.__exit__(None, None, None)


def _daemon(name: str, scratch: str, on_close: Callable[[Callable[[], None]], None] | None) -> Served:
    """A daemon of the backend's own, stopped when the session closes."""
    if on_close is None:
        raise ValueError(f"{name} needs a session to stop its daemon")
    served = Served(scratch, name)
    on_close(served.stop)
    return served

"""The workload and the backends that run it, each behind the same small driver interface.

Workload: the default chain (loopback; bridge + host-local with ipMasq and isGateway; firewall;
portmap with one mapping per container, host port 20000+i → 80/tcp), N containers on one
bridge, subnet 198.18.0.0/16 (RFC 2544 benchmarking space, so 1000 containers fit).

Backends, by name:

* ``reference-exec``: Debian's Go reference plugins (/usr/lib/cni) exec'd by pycni's runtime.
* ``pycni-exec``: pycni_plugins exec'd as binaries (written by ``pycni_plugins.install``).
* ``pycni-inprocess``: pycni_plugins called in-process by the runtime.
* ``netavark``: Debian's netavark 1.4 (the Podman peer) doing the equivalent setup/teardown
  per container with the same subnet, addresses and port mapping. It has no CHECK and no IPAM
  (Podman allocates), so each container gets the address host-local would give it: .2, .3, …

A backend that cannot run here is reported with the reason (:func:`problem`) and skipped.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from pycni import netns
from pycni.errors import CNIError

from .session import Cell

NETWORK = "pycni-bench"
BRIDGE = "pcbench0"
SUBNET = ipaddress.ip_network("198.18.0.0/16")
GATEWAY = SUBNET[1]
HOST_PORT_BASE = 20000
CONTAINER_PORT = 80
CNI_VERSION = "1.0.0"  # the newest version the Debian 1.1.1 plugins speak
CHAIN = ("loopback", "bridge", "firewall", "portmap")
PLUGIN_TYPES = (*CHAIN, "host-local")
REFERENCE_DIR = "/usr/lib/cni"
NETAVARK = "/usr/lib/podman/netavark"
TIMEOUT = 60.0
ALL_OPS = ("add", "check", "del")
BACKENDS = ("reference-exec", "pycni-exec", "pycni-inprocess", "netavark")


class BackendError(Exception):
    """A non-CNI backend (netavark) failed a call."""


#: What a failed workload call raises (anything else is a harness bug and propagates).
FAILURES = (CNIError, BackendError)


def container_id(i: int) -> str:
    return f"{NETWORK}-{i:05d}"


def host_port(i: int) -> int:
    return HOST_PORT_BASE + i


def expected_address(i: int) -> str:
    """What host-local hands out to the i-th ADD on a fresh range (the gateway holds .1)."""
    return str(SUBNET[i + 2])


def conflist(ipam_dir: str) -> bytes:
    plugins: list[dict[str, Any]] = [
        {"type": "loopback"},
        {
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": True,
            "ipMasq": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": str(SUBNET), "gateway": str(GATEWAY)}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": ipam_dir,
            },
        },
        {"type": "firewall", "backend": "iptables"},  # explicit: the default would ask firewalld over D-Bus
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    ]
    return json.dumps({"cniVersion": CNI_VERSION, "name": NETWORK, "plugins": plugins}).encode()


def port_mappings(i: int) -> list[dict[str, Any]]:
    return [{"hostPort": host_port(i), "containerPort": CONTAINER_PORT, "protocol": "tcp"}]


class Driver(Protocol):
    """Runs the workload for container ``i`` of a cell. Failures raise ``CNIError`` or
    :class:`BackendError`; ``add`` returns an opaque result that :meth:`address` reads later
    (outside the timed region)."""

    ops: tuple[str, ...]

    def add(self, i: int) -> object: ...

    def check(self, i: int) -> None: ...

    def delete(self, i: int) -> None: ...

    def address(self, result: object) -> str: ...


class RuntimeDriver:
    """pycni's runtime over the conflist, with the given backend and plugin path."""

    ops: tuple[str, ...] = ALL_OPS

    def __init__(self, cell: Cell, *, path: list[str], backend: Any) -> None:
        from pycni.config import conflist_from_bytes
        from pycni.request import RuntimeConf
        from pycni.runtime import Runtime

        self.runtime = Runtime(
            path,
            cache_dir=cell.cache_dir,
            backend=backend,
            timeout=TIMEOUT,
            host_netns=cell.host,
        )
        self.network = conflist_from_bytes(conflist(os.path.join(cell.dir, "ipam")))
        self.rts = [
            RuntimeConf(container_id(i), path_i, "eth0", capability_args={"portMappings": port_mappings(i)})
            for i, path_i in enumerate(cell.containers)
        ]

    def add(self, i: int) -> object:
        return self.runtime.add_network_list(self.network, self.rts[i])

    def check(self, i: int) -> None:
        self.runtime.check_network_list(self.network, self.rts[i])

    def delete(self, i: int) -> None:
        self.runtime.delete_network_list(self.network, self.rts[i])

    def address(self, result: object) -> str:
        from pycni.types import AnyResult, convert

        return str(convert(cast("AnyResult", result), "1.1.0").ips[0].address.ip)  # what add returned


class NetavarkDriver:
    """``netavark setup|teardown <netns>`` with JSON network options on stdin, exec'd from a
    thread inside the cell's host namespace (netavark treats its own namespace as the host).

    Kept inside the cell: ``--config`` (aardvark-dns state) is the cell's work dir, DNS is off
    and ``--aardvark-binary`` names a file that does not exist, so no DNS daemon can start; the
    firewall driver is pinned to iptables (1.4's only working one) with ``NETAVARK_FW``. Its
    only other writes are per-namespace sysctls (ip_forward, route_localnet, autoconf).
    """

    ops: tuple[str, ...] = ("add", "del")

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
        ipnet: str = status[NETWORK]["interfaces"]["eth0"]["subnets"][0]["ipnet"]
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
    return {
        "container_id": container_id(i),
        "container_name": f"bench{i}",
        "port_mappings": [
            {"host_ip": "", "container_port": CONTAINER_PORT, "host_port": host_port(i), "range": 1, "protocol": "tcp"}
        ],
        "networks": {NETWORK: {"static_ips": [expected_address(i)], "interface_name": "eth0"}},
        "network_info": {
            NETWORK: {
                "name": NETWORK,
                "id": hashlib.sha256(NETWORK.encode()).hexdigest(),
                "driver": "bridge",
                "network_interface": BRIDGE,
                "subnets": [{"subnet": str(SUBNET), "gateway": str(GATEWAY)}],
                "ipv6_enabled": False,
                "internal": False,
                "dns_enabled": False,
                "ipam_options": {"driver": "host-local"},
            }
        },
    }


# -- availability and construction ------------------------------------------------------------


def _missing_builtins() -> list[str]:
    from pycni.plugin import builtin_plugin

    return [t for t in PLUGIN_TYPES if builtin_plugin(t) is None]


def problem(name: str) -> str | None:
    """Why backend ``name`` cannot run here, or ``None``."""
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
    missing = _missing_builtins()
    if missing:
        return f"in-process plugins not available yet: {', '.join(missing)}"
    if name == "pycni-exec":
        try:
            import pycni_plugins.install  # noqa: F401
        except ImportError as e:
            return f"pycni_plugins.install not available yet ({e})"
    return None


@dataclass(frozen=True)
class Backend:
    name: str
    make: Callable[[Cell], Driver]


def backend(name: str, scratch: str) -> Backend:
    """The driver factory for an available backend (check :func:`problem` first); ``scratch``
    is a session's temp root, where pycni's exec'able plugins are written once."""
    if name == "reference-exec":
        return Backend(name, lambda cell: RuntimeDriver(cell, path=[REFERENCE_DIR], backend="exec"))
    if name == "pycni-inprocess":
        return Backend(name, lambda cell: RuntimeDriver(cell, path=[], backend="inprocess"))
    if name == "pycni-exec":
        plugin_dir = install_pycni_plugins(scratch)
        return Backend(name, lambda cell: RuntimeDriver(cell, path=[plugin_dir], backend="exec"))
    if name == "netavark":
        return Backend(name, NetavarkDriver)
    raise ValueError(f"unknown backend {name!r}")


def install_pycni_plugins(scratch: str) -> str:
    from pycni_plugins.install import install

    plugin_dir = os.path.join(scratch, "pycni-plugins")
    if not os.path.isdir(plugin_dir):
        install(plugin_dir, PLUGIN_TYPES)
    return plugin_dir

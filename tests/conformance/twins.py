"""One plugin, three ways, in twin throwaway worlds: Debian's Go binary, pycni in-process, pycni exec'd.

Each :class:`Twin` has its own throwaway "host" namespace (every plugin runs there), a container
namespace, a pycni state dir and a scratch dir. ``go`` execs ``/usr/lib/cni/<type>``, ``exec``
execs the script ``pycni plugins install`` wrote, ``inproc`` calls the built-in plugin in this
process. Kernel state is read with pyroute2 directly (not through the plugins' helpers).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from pycni import netns
from pycni.errors import CNIError
from pycni.sdk import PluginRequest, builtin_plugin
from tests.conftest import REFERENCE_PLUGIN_DIR
from tests.helpers.slow import scaled

IMPLS = ("go", "inproc", "exec")
IFA_F_NODAD, IFA_F_TENTATIVE = 0x02, 0x40


@attrs.define
class Twin:
    impl: str
    host: netns.Throwaway
    ctr: netns.Throwaway
    root: Path
    bindir: str

    @property
    def state_dir(self) -> str:
        return str(self.root / "pycni-state")

    def run(
        self,
        plugin: str,
        command: str,
        conf: dict[str, Any],
        *,
        cid: str = "c1",
        ifname: str = "eth0",
        args: str = "",
        netns_path: str | None = None,
    ) -> dict[str, Any] | None:
        """One invocation from the host namespace; a CNI error result is raised as CNIError."""
        nspath = self.ctr.path if netns_path is None else netns_path
        path = (self.bindir,) if self.impl != "go" else (REFERENCE_PLUGIN_DIR,)
        request = PluginRequest(command, conf, cid, nspath, ifname, args, path)
        if self.impl == "inproc":
            plugin_obj = builtin_plugin(plugin)
            assert plugin_obj is not None, plugin
            with _env("PYCNI_STATE_DIR", self.state_dir):
                return netns.run_in(self.host.path, plugin_obj.handle, request)
        env = {"PATH": os.environ["PATH"], "PYCNI_STATE_DIR": self.state_dir, **request.env()}
        binary = os.path.join(path[0], plugin)
        p = netns.run_in(self.host.path, subprocess.run, [binary], input=request.stdin(), capture_output=True, env=env)
        out = json.loads(p.stdout) if p.stdout.strip() else None
        if p.returncode != 0:
            assert isinstance(out, dict), (p.stdout, p.stderr)
            raise CNIError(out.get("msg", ""), out.get("details", ""), code=out.get("code", 0))
        return out

    def outcome(self, plugin: str, command: str, conf: dict[str, Any], **kw: Any) -> Any:
        """``run``'s result, or ``("error", code, msg)`` for a CNI error."""
        try:
            return self.run(plugin, command, conf, **kw)
        except CNIError as e:
            return ("error", e.code, e.msg)

    def normalise(self, data: Any) -> Any:
        text = json.dumps(data, sort_keys=True)
        return json.loads(text.replace(self.ctr.path, "SANDBOX"))


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def make_twins(make_netns: Callable[[str], netns.Throwaway], tmp: Path, bindir: str) -> dict[str, Twin]:
    out = {}
    for impl in IMPLS:
        root = tmp / impl
        root.mkdir(parents=True, exist_ok=True)
        out[impl] = Twin(impl, make_netns(f"{impl}-host"), make_netns(f"{impl}-c"), root, bindir)
    return out


# --- kernel state (runs inside a namespace) -------------------------------------------------------

IFF_UP, IFF_PROMISC, IFF_ALLMULTI = 0x1, 0x100, 0x200


def read_state(path: str, sysctls: tuple[str, ...] = ()) -> dict[str, Any]:
    """Links (kind, flags, MTU, MAC, txqlen, addresses), main-table routes, qdiscs and sysctls."""
    return netns.run_in(path, _read_state, sysctls)


def _read_state(sysctls: tuple[str, ...]) -> dict[str, Any]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        by_index = {link["index"]: link for link in ipr.link("dump")}
        names = {i: link.get("ifname") for i, link in by_index.items()}
        links: dict[str, Any] = {}
        for link in by_index.values():
            flags = link["flags"]
            links[link.get("ifname")] = {
                "kind": link.get(("linkinfo", "kind")),
                "up": bool(flags & IFF_UP),
                "promisc": bool(flags & IFF_PROMISC),
                "allmulti": bool(flags & IFF_ALLMULTI),
                "mtu": link.get("mtu"),
                "mac": link.get("address"),
                "txqlen": link.get("txqlen"),
                "addresses": [],
            }
        for addr in ipr.addr("dump"):
            ip = addr.get("address")
            if not ip.startswith("fe80:"):
                links[names[addr["index"]]]["addresses"].append(f"{ip}/{addr['prefixlen']}")
        for link in links.values():
            link["addresses"].sort()
        routes = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in ipr.route("dump", family=family, table=254):
                if r.get("type") == 1 and not str(r.get("dst", "")).startswith("fe80:"):
                    routes.append(
                        f"{r.get('dst') or 'default'}/{r['dst_len']} via {r.get('gateway')} "
                        f"dev {names.get(r.get('oif'))} scope {r['scope']} metric {r.get('priority')}"
                    )
        qdiscs = []
        for q in ipr.get_qdiscs():
            kind = q.get("kind")
            if kind in ("noqueue", "pfifo_fast", "mq", "fq_codel", "noop"):
                continue
            qdiscs.append(f"{names.get(q['index'])} {kind} {q['handle']:x} parent {q['parent']:x}")
    state: dict[str, Any] = {"links": links, "routes": sorted(routes), "qdiscs": sorted(qdiscs)}
    state["sysctls"] = {name: read_sysctl(name) for name in sysctls}
    return state


def read_sysctl(name: str) -> str | None:
    """A sysctl of the calling thread's namespace (``None``: no such key)."""
    try:
        with open("/proc/sys/" + name) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def wait_no_tentative(timeout: float = 10.0) -> None:
    """Until no IPv6 address of the calling thread's namespace is tentative (DAD done)."""
    from pyroute2 import IPRoute

    deadline = time.monotonic() + scaled(timeout)
    with IPRoute() as ipr:
        while any(a.get("flags", 0) & IFA_F_TENTATIVE for a in ipr.addr("dump", family=socket.AF_INET6)):
            assert time.monotonic() < deadline, "IPv6 addresses still tentative"
            time.sleep(0.05)


def differences(go: Any, ours: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where two JSON-like values differ: ``(path, go's, ours)``, ``None`` for a missing key."""
    if isinstance(go, dict) and isinstance(ours, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in sorted(set(go) | set(ours)):
            out += differences(go.get(key), ours.get(key), f"{path}/{key}")
        return out
    return [] if go == ours else [(path, go, ours)]


def veth_to(
    other: str,
    name: str,
    peer: str,
    addrs: Sequence[tuple[str, int]] = (),
    peer_addrs: Sequence[tuple[str, int]] = (),
) -> None:
    """A veth ``name`` in the calling thread's namespace whose end ``peer`` is in ``other``, both
    up, with ``(ip, prefixlen)`` addresses on each end (no DAD)."""
    from pyroute2 import IPRoute

    fd = os.open(other, os.O_RDONLY)
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=name, kind="veth", peer={"ifname": peer, "net_ns_fd": fd}, state="up")
            index = ipr.link_lookup(ifname=name)[0]
            for ip, plen in addrs:
                ipr.addr("add", index=index, address=ip, prefixlen=plen, flags=IFA_F_NODAD)
    finally:
        os.close(fd)

    def far_end() -> None:
        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname=peer)[0]
            ipr.link("set", index=index, state="up")
            for ip, plen in peer_addrs:
                ipr.addr("add", index=index, address=ip, prefixlen=plen, flags=IFA_F_NODAD)

    netns.run_in(other, far_end)


def veth_into(twin: Twin, *, ctr_mac: str = "02:00:00:00:aa:01", host_name: str = "hveth0") -> None:
    """A veth ``eth0`` (fixed MAC) in the twin's container, peer ``host_name`` in its host, both up."""

    def body() -> None:
        from pyroute2 import IPRoute

        fd = os.open(twin.ctr.path, os.O_RDONLY)
        try:
            with IPRoute() as ipr:
                ipr.link(
                    "add",
                    ifname=host_name,
                    kind="veth",
                    state="up",
                    address="02:00:00:00:bb:01",
                    peer={"ifname": "eth0", "net_ns_fd": fd, "address": ctr_mac},
                )
        finally:
            os.close(fd)

    netns.run_in(twin.host.path, body)

    def up() -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="eth0")[0], state="up")

    netns.run_in(twin.ctr.path, up)


def without(data: Any, pattern: str) -> Any:
    """``data`` with every string matching ``pattern`` replaced by a placeholder."""
    return json.loads(re.sub(pattern, "X", json.dumps(data, sort_keys=True)))

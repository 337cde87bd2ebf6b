"""A small world for the crash and damage tests: a throwaway host namespace, the full chain
(loopback, bridge with host-local, ipMasq and macspoofchk, firewall, portmap) with its cache,
IPAM and state dirs under ``tmp_path``, and ways to look at everything an attachment can leave
behind (veths, leases, nftables elements, state records, cache files).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pycni import netns
from pycni.config import NetworkConfigList, conflist_from_bytes
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.testing import probes
from tests.helpers.kernel import links
from tests.helpers.slow import scaled

REPO = Path(__file__).parents[2]
NETWORK = "crashnet"
BRIDGE = "crash0"
SUBNET = "198.18.64.0/24"
HOST_PORT = 18080


def conflist(
    data_dir: str, *, network: str = NETWORK, bridge: str = BRIDGE, subnet: str = SUBNET, main: str = "bridge"
) -> dict[str, Any]:
    """The chain; ``main`` is the interface plugin: ``bridge`` (with macspoofchk) or ``ptp``."""
    ipam = {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": data_dir}
    if main == "bridge":
        iface = {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": True, "macspoofchk": True}
    else:
        iface = {"type": main, "ipMasq": True}
    return {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {"type": "loopback"},
            {**iface, "ipam": ipam},
            {"type": "firewall"},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


class World:
    """Everything one test's attachments live in (see the module docstring)."""

    def __init__(
        self,
        host: netns.Throwaway,
        make_netns: Callable[[str], netns.Throwaway],
        root: Path,
        conf: dict[str, Any] | None = None,
    ) -> None:
        self.host = host
        self.make_netns = make_netns
        self.root = root
        self.state_dir = root / "state"
        self.cache_dir = root / "cache"
        self.data_dir = root / "ipam"
        self.conf = conf or conflist(str(self.data_dir))
        self.conflist_text = json.dumps(self.conf)
        self.network: NetworkConfigList = conflist_from_bytes(self.conflist_text.encode())
        self.runtime = Runtime([], cache_dir=str(self.cache_dir), backend="inprocess", host_netns=host.path)

    # -- operations ------------------------------------------------------------------------

    @staticmethod
    def ports(cid: str) -> list[dict[str, Any]]:
        return [{"hostPort": HOST_PORT + sum(map(ord, cid)) % 1000, "containerPort": 80, "protocol": "tcp"}]

    def rt(self, cid: str, ns: str) -> RuntimeConf:
        return RuntimeConf(cid, ns, "eth0", capability_args={"portMappings": self.ports(cid)})

    def add(self, cid: str, ns: str) -> list[str]:
        result = self.runtime.add_network_list(self.network, self.rt(cid, ns))
        return [str(ip.address.ip) for ip in result.ips]

    def delete(self, cid: str, ns: str) -> None:
        self.runtime.delete_network_list(self.network, self.rt(cid, ns))

    def check(self, cid: str, ns: str) -> None:
        self.runtime.check_network_list(self.network, self.rt(cid, ns))

    def reconcile(self, *, dry_run: bool = False):
        return self.runtime.reconcile_network_list(self.network, dry_run=dry_run)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, PYCNI_STATE_DIR=str(self.state_dir), PYTHONPATH=str(REPO))
        env.pop("PYCNI_FAILPOINTS", None)
        env.update(extra)
        return env

    def spawn(self, op: str, cid: str = "", ns: str = "", *, failpoints: str = "", **spec: Any) -> subprocess.Popen:
        """The operation in a process of its own (``tests.faults.cni_driver``)."""
        full = {
            "op": op,
            "host": self.host.path,
            "cache_dir": str(self.cache_dir),
            "conflist": self.conflist_text,
            "cid": cid,
            "netns": ns,
            "ports": self.ports(cid),
            **spec,
        }
        env = self.env(PYCNI_FAILPOINTS=failpoints, PYCNI_FAILPOINTS_LOG=str(self.root / "failpoints.log"))
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.cni_driver", json.dumps(full)],
            cwd=str(REPO),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, op: str, cid: str = "", ns: str = "", *, failpoints: str = "", timeout: float = 120, **spec: Any):
        proc = self.spawn(op, cid, ns, failpoints=failpoints, **spec)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, out, err

    def cli(
        self, bindir: Path, conf_dir: Path, verb: str, ns: str, cid: str, *extra: str, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """``pycni VERB NETWORK NETNS ...`` inside the host namespace with the plugins exec'd from
        ``bindir`` (``--backend exec``) and this world's conflist in ``conf_dir``, as an operator
        would run it; ``env`` is added to :meth:`env`."""
        argv = [sys.executable, "-m", "pycni.cli", verb, self.network.name, ns, "--container-id", cid, *extra]
        argv += ["--conf-dir", str(conf_dir), "--cache-dir", str(self.cache_dir)]
        argv += ["--plugin-path", str(bindir), "--backend", "exec"]
        return subprocess.run(
            ["nsenter", f"--net={self.host.path}", *argv],
            cwd=str(REPO),
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def reached(self) -> list[tuple[str, int]]:
        """``(failpoint, pid)`` of every failpoint that acted in a spawned process."""
        path = self.root / "failpoints.log"
        if not path.exists():
            return []
        return [(name, int(pid)) for name, pid in (line.split() for line in path.read_text().splitlines())]

    # -- what is left ----------------------------------------------------------------------

    def veths(self) -> dict[str, dict[str, Any]]:
        return {n: link for n, link in links(self.host.path).items() if link["kind"] == "veth"}

    def leases(self) -> dict[str, str]:
        """ip -> owner (``cid`` or ``cid/ifname``) of every lease of the network."""
        out = {}
        directory = self.data_dir / self.network.name
        if directory.exists():
            for f in directory.iterdir():
                try:
                    ipaddress.ip_address(f.name)
                except ValueError:
                    continue
                cid, _, ifname = f.read_bytes().decode().strip().partition("\r\n")
                out[f.name] = f"{cid}/{ifname}" if ifname else cid
        return out

    def nft_groups(self) -> dict[str, dict[str, Any]]:
        from pycni_plugins.kernel import nft

        return netns.run_in(self.host.path, nft.attachments, str(self.state_dir))

    def nft_elements(self) -> list[str]:
        """Every element of pycni's tables with a comment (``<set> <key> of <owner> <comment>``)."""
        return [
            f"{e['set']} {e['key']} of {owner} {group['comment'].split(' ', 2)[-1]}"
            for group in self.nft_groups().values()
            for owner, elements in group["elements"].items()
            for e in elements
        ]

    def records(self) -> list[str]:
        """State records other than the nftables epoch (``kind/name``)."""
        out = []
        if self.state_dir.exists():
            for kind in self.state_dir.iterdir():
                out += [f"{kind.name}/{f.name}" for f in kind.iterdir() if not f.name.startswith(".")]
        return sorted(r for r in out if r != "nft/epoch")

    def cached(self) -> list[str]:
        return [f"{a.container_id}/{a.ifname}" for a in self.runtime.get_cached_attachments()]

    def leftovers(self, ns: netns.Throwaway | None = None) -> dict[str, Any]:
        """Whatever is left of every attachment (empty when all converged)."""
        left = {
            "veths": sorted(self.veths()),
            "leases": self.leases(),
            "nft": self.nft_elements(),
            "records": self.records(),
            "cache": self.cached(),
        }
        if ns is not None and os.path.exists(ns.path):
            left["container links"] = sorted(set(links(ns.path)) - {"lo"})
        return {k: v for k, v in left.items() if v}

    def ping(self, ip: str) -> bool:
        try:
            return probes.ping(self.host.path, ip, timeout=scaled(2))
        except OSError:  # no route to it at all
            return False

    def works(self, cid: str, ns: netns.Throwaway) -> list[str]:
        """A fresh ADD of ``cid`` succeeds, CHECK passes and the container answers ping."""
        ips = self.add(cid, ns.path)
        self.check(cid, ns.path)
        assert self.ping(ips[0]), f"{cid} at {ips[0]} does not answer"
        return ips


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def world(host_ns, make_netns, tmp_path, monkeypatch) -> Iterator[World]:
    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "state"))
    yield World(host_ns, make_netns, tmp_path)

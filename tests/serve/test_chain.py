"""A folded network list (one ``pycni-chain`` plugin holding the list) is the same network as
the list itself: for each chain, the same result, the same kernel state after ADD, a passing
CHECK and nothing left after DEL — in-process, through the shims with ``pycni serve``, and
through the shims without it (each shim runs the plugin in its own interpreter)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pycni import netns
from pycni.chain import CHAIN_TYPE, fold
from pycni.config import conflist_from_bytes
from pycni.nomad.conflist import NomadBridgeConfig, bridge_conflist
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from tests.helpers import kernel

from .conftest import Daemon

pytestmark = pytest.mark.privileged

SUBNET, GATEWAY = "198.18.40.0/24", "198.18.40.1"
ONE_IP = "198.18.40.10"  # a one-address range: host-local hands out the same one every time
PORTS = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
BANDWIDTH = {"ingressRate": 800000, "ingressBurst": 80000, "egressRate": 800000, "egressBurst": 80000}
#: A Go reference plugin under a type pycni does not build in, so every path execs it.
GO_TUNING = "go-tuning"


def _ipam(data_dir: Path) -> dict[str, Any]:
    return {
        "type": "host-local",
        "dataDir": str(data_dir),
        "ranges": [[{"subnet": SUBNET, "rangeStart": ONE_IP, "rangeEnd": ONE_IP, "gateway": GATEWAY}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    }


def _listed(name: str, version: str, *plugins: dict[str, Any]) -> bytes:
    return json.dumps({"cniVersion": version, "name": name, "plugins": list(plugins)}).encode()


def _nomad(data_dir: Path) -> bytes:
    # Nomad's conflist, but for a one-address range.
    nomad = json.loads(bridge_conflist(NomadBridgeConfig("pchain0", SUBNET, ipam_data_dir=str(data_dir))))
    nomad["plugins"][1]["ipam"]["ranges"] = _ipam(data_dir)["ranges"]
    return json.dumps(nomad, indent="\t").encode()


def _podman(data_dir: Path) -> bytes:
    # podman's 87-podman-bridge.conflist but for the subnet and the bridge's name.
    bridge = {"type": "bridge", "bridge": "pchain0", "isGateway": True, "ipMasq": True, "hairpinMode": True}
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}}
    return _listed(
        "podman", "0.4.0", {**bridge, "ipam": _ipam(data_dir)}, portmap, {"type": "firewall"}, {"type": "tuning"}
    )


def _ptp_portmap(data_dir: Path) -> bytes:
    ptp = {"type": "ptp", "ipMasq": True, "ipam": _ipam(data_dir)}
    return _listed("ptpnet", "1.0.0", ptp, {"type": "portmap", "capabilities": {"portMappings": True}})


def _bridge_bandwidth(data_dir: Path) -> bytes:
    bridge = {"type": "bridge", "bridge": "pchain0", "isGateway": True, "ipam": _ipam(data_dir)}
    return _listed("bwnet", "1.0.0", bridge, {"type": "bandwidth", "capabilities": {"bandwidth": True}})


def _go_in_the_middle(data_dir: Path) -> bytes:
    bridge = {"type": "bridge", "bridge": "pchain0", "isGateway": True, "ipMasq": True, "ipam": _ipam(data_dir)}
    go = {"type": GO_TUNING, "mtu": 1280, "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"}}
    return _listed("gonet", "1.0.0", bridge, go, {"type": "portmap", "capabilities": {"portMappings": True}})


CHAINS: dict[str, Callable[[Path], bytes]] = {
    "nomad": _nomad,
    "podman": _podman,
    "ptp+portmap": _ptp_portmap,
    "bridge+bandwidth": _bridge_bandwidth,
    "go-in-the-middle": _go_in_the_middle,
}
CAPABILITY_ARGS = {"portMappings": PORTS, "bandwidth": BANDWIDTH}

_MAC = re.compile(r"\b[0-9a-f]{2}(?::[0-9a-f]{2}){5}\b")
_VETH = re.compile(r"\bveth[0-9a-f]{8}\b")


def _normalised(value: Any) -> Any:
    """``value`` as JSON with what the kernel or the plugins draw at random (MACs, host veth
    names) numbered in order of appearance, so two attachments compare."""
    text = json.dumps(value, sort_keys=True)
    for pattern, label in ((_MAC, "mac"), (_VETH, "veth")):
        seen: dict[str, str] = {}
        for drawn in pattern.findall(text):
            seen.setdefault(drawn, f"<{label}{len(seen)}>")
        text = pattern.sub(lambda m, seen=seen: seen[m.group(0)], text)
    return json.loads(text)


def _links(path: str) -> dict[str, Any]:
    """The namespace's links; their operational state and link-local IPv6 addresses (derived
    from random MACs) left out: the kernel changes them in its own time."""
    found = kernel.links(path)
    for link in found.values():
        del link["state"]
        link["addresses"] = [a for a in link["addresses"] if not a.startswith("fe80:")]
    return found


def _qdiscs(path: str) -> list[tuple[str, str]]:
    def read() -> list[tuple[str, str]]:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
            return sorted(
                (names.get(q["index"], "?"), q.get_attr("TCA_KIND"))
                for q in ipr.get_qdiscs()
                if q.get_attr("TCA_KIND") not in ("noqueue", "noop")
            )

    return netns.run_in(path, read)


def _nft_elements(path: str) -> dict[str, list[Any]]:
    def read() -> dict[str, list[Any]]:
        import nftables

        rc, out, err = nftables.Nftables().json_cmd({"nftables": [{"list": {"ruleset": None}}]})
        assert rc == 0, err
        found: dict[str, list[Any]] = {}
        for obj in out["nftables"]:
            for kind in ("set", "map"):
                if kind in obj:
                    body = obj[kind]
                    found[f"{body['family']} {body['table']} {body['name']}"] = body.get("elem", [])
        return found

    return netns.run_in(path, read)


def _state(host: str, ctr: str, data_dir: Path) -> dict[str, Any]:
    """Everything an attachment changes: links, addresses, routes and qdiscs of both sides, the
    host's nftables set and map elements, host-local's leases."""
    leases = sorted(p.name for p in data_dir.rglob("*") if p.name[:1].isdigit()) if data_dir.exists() else []
    return _normalised(
        {
            "host": {"links": _links(host), "routes": kernel.routes(host), "qdiscs": _qdiscs(host)},
            "container": {"links": _links(ctr), "routes": kernel.routes(ctr), "qdiscs": _qdiscs(ctr)},
            "nft": _nft_elements(host),
            "leases": leases,
        }
    )


def _go_dir(tmp_path: Path) -> str:
    path = tmp_path / "go"
    path.mkdir()
    (path / GO_TUNING).symlink_to("/usr/lib/cni/tuning")
    return str(path)


@pytest.fixture
def runtimes(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    host_ns: netns.Throwaway,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[], Runtime]:
    """The runtime of the parametrized path: in-process (built-ins in this process, the Go
    plugin exec'd) or exec'ing the installed shims, with or without ``pycni serve``."""
    path: str = request.param
    go = _go_dir(tmp_path)
    cache = str(tmp_path / "cache")
    if path == "inprocess":
        return lambda: Runtime([go], cache_dir=cache, backend="auto", host_netns=host_ns.path)
    bindir = request.getfixturevalue("bindir")
    if path == "daemon":
        daemon: Daemon = request.getfixturevalue("daemon")
        monkeypatch.setenv("PYCNI_SOCKET", daemon.socket)
        monkeypatch.setenv("PYCNI_DAEMON", "required")  # a fallback would hide a daemon failure
    else:
        monkeypatch.setenv("PYCNI_DAEMON", "off")
    return lambda: Runtime([bindir, go], cache_dir=cache, backend="exec", host_netns=host_ns.path)


def _attach(runtime: Runtime, data: bytes, rt: RuntimeConf, host: str, ctr: str, data_dir: Path) -> tuple[Any, Any]:
    """ADD, the state after it, CHECK, DEL: ``(result JSON, state)``; asserts one cache entry."""
    net = conflist_from_bytes(data)
    result = runtime.add_network_list(net, rt).to_json()
    state = _state(host, ctr, data_dir)
    (entry,) = runtime.get_cached_attachments(rt.container_id)
    assert entry.config == data
    runtime.check_network_list(net, rt)
    runtime.delete_network_list(net, rt)
    assert runtime.get_cached_attachments(rt.container_id) == []
    return _normalised(result), state


@pytest.mark.parametrize("runtimes", ["inprocess", "daemon", "no-daemon"], indirect=True)
@pytest.mark.parametrize("chain", list(CHAINS))
def test_folded_list_gives_the_unfolded_result_and_kernel_state_and_leaves_nothing(
    chain: str,
    runtimes: Callable[[], Runtime],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    host_ns: netns.Throwaway,
    make_netns: Callable[[str], netns.Throwaway],
) -> None:
    ctr = make_netns("c").path
    data_dir = tmp_path / "ipam"
    unfolded = CHAINS[chain](data_dir)
    folded = fold(unfolded)
    rt = RuntimeConf(container_id="chain-c1", netns=ctr, ifname="eth0", capability_args=CAPABILITY_ARGS)
    runtime = runtimes()
    before = _state(host_ns.path, ctr, data_dir)

    result, state = _attach(runtime, unfolded, rt, host_ns.path, ctr, data_dir)
    after_unfolded = _state(host_ns.path, ctr, data_dir)
    folded_result, folded_state = _attach(runtime, folded, rt, host_ns.path, ctr, data_dir)
    after_folded = _state(host_ns.path, ctr, data_dir)

    assert folded_result == result
    assert folded_state == state
    assert state != before  # the comparison saw the attachment
    assert after_folded == after_unfolded
    assert after_folded["container"]["links"].keys() == {"lo"}
    assert [n for n in after_folded["host"]["links"] if n.startswith("<veth")] == []
    assert {k: v for k, v in after_folded["nft"].items() if v and not k.endswith(" epoch")} == {}
    assert after_folded["leases"] == before["leases"] == []
    if request.node.callspec.params["runtimes"] == "daemon":
        # The unfolded ADD is a request per plugin, the folded one a single request.
        served = [line.split()[:2] for line in request.getfixturevalue("daemon").requests() if " ADD " in line]
        assert served[-1] == [CHAIN_TYPE, "ADD"]
        assert [kind for kind, _ in served[:-1]] == [
            p["type"] for p in json.loads(unfolded)["plugins"] if p["type"] != GO_TUNING
        ]
    if chain == "go-in-the-middle":
        assert state["container"]["links"]["eth0"]["mtu"] == 1280
    if chain == "bridge+bandwidth":
        assert any(kind == "tbf" for _, kind in state["host"]["qdiscs"])

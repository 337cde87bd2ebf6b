"""Many runtimes at once through the shims (Nomad starting allocations together): 16 concurrent
clients are served at least as fast as one, with no errors and distinct addresses."""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from typing import Any

import pytest

from pycni.config import conflist_from_bytes
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.types import convert

pytestmark = pytest.mark.privileged

N = 32
SUBNET = ipaddress.ip_network("198.18.96.0/22")


def _conflist(data_dir: str) -> bytes:
    plugins: list[dict[str, Any]] = [
        {"type": "loopback"},
        {
            "type": "bridge",
            "bridge": "pconc0",
            "isGateway": True,
            "ipMasq": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": str(SUBNET)}]], "dataDir": data_dir},
        },
        {"type": "firewall", "backend": "iptables"},
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    ]
    return json.dumps({"cniVersion": "1.0.0", "name": "concnet", "plugins": plugins}).encode()


def _run(clients: int, runtime: Runtime, network: Any, rts: list[RuntimeConf], op: str) -> tuple[float, list, list]:
    """``op`` for every attachment, split over ``clients`` threads: (seconds, results, errors)."""
    results: list[Any] = [None] * len(rts)
    errors: list[BaseException] = []
    fn = {"add": runtime.add_network_list, "del": runtime.delete_network_list}[op]

    def client(k: int) -> None:
        for i in range(k, len(rts), clients):
            try:
                results[i] = fn(network, rts[i])
            except Exception as e:
                errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started, results, errors


def test_sixteen_clients_are_served_at_least_as_fast_as_one(daemon, bindir, host_ns, make_netns, tmp_path, monkeypatch):
    monkeypatch.setenv("PYCNI_SOCKET", daemon.socket)
    monkeypatch.setenv("PYCNI_DAEMON", "required")
    network = conflist_from_bytes(_conflist(str(tmp_path / "ipam")))
    runtime = Runtime([bindir], cache_dir=str(tmp_path / "cache"), backend="exec", host_netns=host_ns.path, timeout=120)
    namespaces = [make_netns("c").path for _ in range(N)]
    rts = [
        RuntimeConf(
            f"conc-{i}",
            path,
            "eth0",
            capability_args={"portMappings": [{"hostPort": 30000 + i, "containerPort": 80, "protocol": "tcp"}]},
        )
        for i, path in enumerate(namespaces)
    ]
    runtime.add_network_list(network, rts[0])  # the bridge and the nftables skeleton exist before timing
    runtime.delete_network_list(network, rts[0])
    rates = {}
    for clients in (1, 16):
        seconds, results, errors = _run(clients, runtime, network, rts, "add")
        assert errors == [], errors[:3]
        addresses = [str(convert(r, "1.1.0").ips[0].address.ip) for r in results]
        assert len(set(addresses)) == N, addresses
        rates[clients] = N / seconds
        _, _, errors = _run(clients, runtime, network, rts, "del")
        assert errors == [], errors[:3]
    print(f"chain ADD throughput through the shims: 1 client {rates[1]:.1f}/s, 16 clients {rates[16]:.1f}/s")
    assert rates[16] >= rates[1], rates
    assert not [line for line in daemon.requests() if " ok " not in line]

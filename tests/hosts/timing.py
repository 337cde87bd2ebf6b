"""The cost of the iptables compatibility step: in-process ADD/DEL p50 on a plain host against
Docker hosts (iptables-nft, legacy), the Nomad-style chain with Nomad's admin rule, N containers.

    .venv/bin/python -m tests.hosts.timing [--n 20] [--rounds 5]

State and cache on a tmpfs (/dev/shm), as on a systemd host. Everything happens in throwaway
namespaces (a host per profile, the containers), removed after.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from pycni import netns
from pycni.config import conflist_from_bytes
from pycni.nomad.conflist import NomadBridgeConfig, bridge_conflist
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni_plugins import nomad

from .conftest import BRIDGE, SUBNET
from .profiles import DOCKER_LEGACY, DOCKER_NFT, PLAIN, HostProfile


def measure(profile: HostProfile, n: int) -> tuple[list[float], list[float], list[float]]:
    """ADD, CHECK and DEL times (ms) of ``n`` containers on a fresh host of ``profile``."""
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        host = stack.enter_context(netns.Throwaway(prefix="pycni-timing-host"))
        profile.build(host.path, BRIDGE)
        stack.callback(profile.teardown, host.path)
        (Path(tmp) / "state").mkdir(mode=0o700)
        raw = bridge_conflist(NomadBridgeConfig(BRIDGE, SUBNET, ipam_data_dir=f"{tmp}/ipam"))
        network = conflist_from_bytes(raw)
        runtime = Runtime(
            [], cache_dir=f"{tmp}/cache", state_dir=f"{tmp}/state", backend="inprocess", host_netns=host.path
        )
        netns.run_in(host.path, nomad.ensure_forwarding_rules, "NOMAD-ADMIN", BRIDGE, SUBNET)
        confs = []
        adds: list[float] = []
        checks: list[float] = []
        dels: list[float] = []
        for i in range(n):
            ns = stack.enter_context(netns.Throwaway(prefix="pycni-timing-c"))
            rt = RuntimeConf(f"t{i}", ns.path, "eth0", capability_args={"portMappings": []})
            t0 = time.perf_counter()
            runtime.add_network_list(network, rt)
            adds.append((time.perf_counter() - t0) * 1000)
            confs.append(rt)
        for rt in confs:
            t0 = time.perf_counter()
            runtime.check_network_list(network, rt)
            checks.append((time.perf_counter() - t0) * 1000)
        for rt in confs:
            t0 = time.perf_counter()
            runtime.delete_network_list(network, rt)
            dels.append((time.perf_counter() - t0) * 1000)
        return adds, checks, dels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="hosts of each profile, interleaved (noise)")
    args = parser.parse_args()
    profiles = (PLAIN, DOCKER_NFT, DOCKER_LEGACY)
    samples: dict[str, list[list[float]]] = {p.name: [[], [], []] for p in profiles}
    for _ in range(args.rounds):
        for profile in profiles:
            for kept, got in zip(samples[profile.name], measure(profile, args.n)):
                kept.extend(got)
    rows = [(name, *(statistics.median(t) for t in ops)) for name, ops in samples.items()]
    base = rows[0][1:]
    print(f"N={args.n} × {args.rounds} rounds, p50 ms per container (in-process, Nomad chain + admin rule)")
    print(f"{'host':<14}" + "".join(f" {op:>8} {'×plain':>7}" for op in ("ADD", "CHECK", "DEL")))
    for name, *values in rows:
        print(f"{name:<14}" + "".join(f" {v:8.2f} {v / b:6.2f}×" for v, b in zip(values, base)))


if __name__ == "__main__":
    main()

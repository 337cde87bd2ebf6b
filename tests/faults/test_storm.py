"""A storm: hundreds of containers, ADD/CHECK/DEL interleaved by 16 worker processes in random
order, with workers SIGKILLed at failpoints at a rate, in the runtime and inside the in-process
plugins (every failpoint of ADD and DEL, see ``test_crash_points``). Afterwards the invariants
hold: no address was ever handed out twice, every live container is reachable, nothing is left
of deleted ones, pycni's nftables elements are exactly the live attachments', and a reconcile
(dry run) finds nothing to collect.

Crashed operations are recovered as an orchestrator would: a DEL of that container follows.
``PYCNI_STORM_CONTAINERS`` (default 500) and ``PYCNI_STORM_REPORT`` (a JSON path) tune it.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pycni import netns
from pycni.testing import probes
from tests.faults.test_crash_points import ADD_FAILPOINTS as ADD_POINTS
from tests.faults.test_crash_points import DEL_FAILPOINTS as DEL_POINTS
from tests.helpers.kernel import links
from tests.helpers.slow import scaled

pytestmark = pytest.mark.privileged

CONTAINERS = int(os.environ.get("PYCNI_STORM_CONTAINERS", "500"))
WORKERS = 16
FAULT_RATE = 0.06
SEED = int(os.environ.get("PYCNI_STORM_SEED", "20261130"))


def _kill(point: str) -> str:
    name, _, nth = point.partition("@")
    return f"{name}=kill@{nth or 1}"


ADD_FAILPOINTS = [_kill(p) for p in ADD_POINTS]
DEL_FAILPOINTS = [_kill(p) for p in DEL_POINTS]
WORKER = [sys.executable, "-m", "tests.faults.storm_worker"]


def conflist(data_dir: str) -> str:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "storm",
            "plugins": [
                {"type": "loopback"},
                {
                    "type": "bridge",
                    "bridge": "storm0",
                    "isGateway": True,
                    "ipMasq": True,
                    "macspoofchk": True,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.0.0/16"}]], "dataDir": data_dir},
                },
                {"type": "firewall"},
                {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
            ],
        }
    )


class Worker:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, cwd=str(Path(__file__).parents[2])
        )
        self.task: dict[str, Any] | None = None

    def send(self, task: dict[str, Any]) -> None:
        self.task = task
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def next_op(state: str, rng: random.Random, left: int) -> str | None:
    if state == "unknown":
        return "del"
    if left <= 0:
        return None
    if state == "absent":
        return "add"
    return rng.choice(["check", "del", "del"])


def test_storm(host_ns, tmp_path, monkeypatch):
    began = time.monotonic()
    rng = random.Random(SEED)
    state_dir, data_dir, cache_dir = tmp_path / "state", tmp_path / "ipam", tmp_path / "cache"
    monkeypatch.setenv("PYCNI_STATE_DIR", str(state_dir))
    env = dict(os.environ, PYCNI_STATE_DIR=str(state_dir), PYTHONPATH=str(Path(__file__).parents[2]))
    argv = WORKER + [host_ns.path, str(cache_dir), conflist(str(data_dir))]

    namespaces = [netns.Throwaway(prefix=f"{host_ns.name.rsplit('-', 2)[0]}-s{i}") for i in range(CONTAINERS)]
    made: list[netns.Throwaway] = []
    workers: list[Worker] = []
    try:
        for ns in namespaces:
            ns.__enter__()
            made.append(ns)
        cid = {i: f"storm-{i}" for i in range(CONTAINERS)}
        state = {i: "absent" for i in range(CONTAINERS)}
        budget = {i: rng.randint(1, 5) for i in range(CONTAINERS)}
        ips: dict[int, list[str]] = {}
        holds: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        counts = collections.Counter()
        killed_at: collections.Counter = collections.Counter()
        history: dict[int, list[str]] = collections.defaultdict(list)
        pending = list(range(CONTAINERS))
        rng.shuffle(pending)
        # Every failpoint in turn (in a shuffled order), so that each is crashed at a few times.
        add_points = itertools.cycle(rng.sample(ADD_FAILPOINTS, len(ADD_FAILPOINTS)))
        del_points = itertools.cycle(rng.sample(DEL_FAILPOINTS, len(DEL_FAILPOINTS)))

        workers = [Worker(argv, env) for _ in range(WORKERS)]
        sel = selectors.DefaultSelector()
        for w in workers:
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)

        def dispatch(w: Worker) -> None:
            while pending:
                i = pending.pop()
                op = next_op(state[i], rng, budget[i])
                if op is None:
                    continue
                budget[i] -= 1
                task = {
                    "op": op,
                    "cid": cid[i],
                    "netns": namespaces[i].path,
                    "i": i,
                    "ports": [{"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"}],
                }
                if op != "check" and rng.random() < FAULT_RATE:
                    task["failpoints"] = next(add_points if op == "add" else del_points)
                w.send(task)
                return
            w.task = None

        for w in workers:
            dispatch(w)
        deadline = time.monotonic() + 900
        while any(w.task is not None for w in workers):
            assert time.monotonic() < deadline, "storm did not finish"
            for key, _ in sel.select(5):
                w: Worker = key.data
                line = w.proc.stdout.readline()
                task = w.task
                i = task["i"]
                counts[task["op"]] += 1
                history[i].append(f"{task['op']}{'!' + task['failpoints'] if 'failpoints' in task else ''}")
                if not line:  # the worker was killed at a failpoint
                    counts["faults"] += 1
                    killed_at[task["failpoints"].replace("=kill", "")] += 1
                    sel.unregister(w.proc.stdout)
                    w.proc.wait()
                    assert w.proc.returncode == -9, f"worker died unexpectedly ({w.proc.returncode})"
                    state[i] = "unknown"
                    replacement = Worker(argv, env)
                    workers[workers.index(w)] = replacement
                    sel.register(replacement.proc.stdout, selectors.EVENT_READ, replacement)
                    pending.append(i)
                    dispatch(replacement)
                    continue
                out = json.loads(line)
                holders = {ip: [cid[h["i"]] for h in hs] for ip in out["ips"] or ips.get(i, []) for hs in [holds[ip]]}
                assert out["ok"], f"{task['op']} of {task['cid']} failed: {out['error']} ({history[i]}, {holders})"
                if task["op"] == "add":
                    state[i], ips[i] = "live", out["ips"]
                    for ip in out["ips"]:
                        holds[ip].append({"i": i, "add_end": out["end"], "del_start": None})
                elif task["op"] == "del":
                    for ip in ips.pop(i, []):
                        holds[ip][-1]["del_start"] = out["start"]
                    state[i] = "absent"
                pending.append(i)
                rng.shuffle(pending)
                dispatch(w)

        live = {i for i, s in state.items() if s == "live"}
        report = {
            "containers": CONTAINERS,
            "workers": WORKERS,
            "operations": dict(counts),
            "live": len(live),
            "failpoints_hit": len(killed_at),
            "killed_at": dict(sorted(killed_at.items())),
        }

        # 1. no address handed to a second container while the first still held it
        duplicates = []
        for ip, hs in holds.items():
            for a, b in zip(hs, hs[1:]):
                if a["del_start"] is None or b["add_end"] < a["del_start"]:
                    duplicates.append((ip, a["i"], b["i"]))
        # 2. every live container reachable from the host namespace
        unreachable = [i for i in sorted(live) if not probes.ping(host_ns.path, ips[i][0], timeout=scaled(3))]
        # 3. nothing left for deleted ones, everything there for live ones
        leases = {
            f.name: f.read_bytes().split(b"\r\n")[0].decode()
            for f in (data_dir / "storm").iterdir()
            if f.name[0].isdigit()
        }
        from pycni.config import conflist_from_bytes
        from pycni.runtime import Runtime

        runtime = Runtime([], cache_dir=str(cache_dir), backend="inprocess", host_netns=host_ns.path)
        cached = {a.container_id for a in runtime.get_cached_attachments()}
        reconcile = runtime.reconcile_network_list(conflist_from_bytes(conflist(str(data_dir)).encode()), dry_run=True)
        veths = [n for n, link in links(host_ns.path).items() if link["master"] == "storm0"]
        from pycni_plugins.kernel import nft

        groups = netns.run_in(host_ns.path, nft.attachments, str(state_dir))
        owners = {nft.Comment.parse(g["comment"]).container_id for g in groups.values() if g["comment"]}
        hostports = sum(
            len(obj["map"].get("elem", []))
            for obj in netns.run_in(host_ns.path, nft.list_table, "inet", "pycni") or []
            if "map" in obj and obj["map"]["name"] == "hostports4"
        )
        live_ids = {cid[i] for i in live}
        recorded = collections.defaultdict(set)  # kind -> container IDs with a state record
        for kind in ("bridge", "nft"):
            directory = state_dir / kind
            for f in directory.iterdir() if directory.exists() else ():
                if not f.name.startswith(".") and f.name != "epoch":
                    recorded[kind].add(json.loads(f.read_text())["attachment"]["container_id"])
        leaks = {
            "duplicate_addresses": duplicates,
            "unreachable": unreachable,
            "stale_leases": sorted(set(leases.values()) - live_ids),
            "missing_leases": sorted(live_ids - set(leases.values())),
            "stale_cache": sorted(cached - live_ids),
            "stale_nft_owners": sorted(owners - live_ids),
            "stale_records": sorted((recorded["bridge"] | recorded["nft"]) - live_ids),
            "missing_records": sorted(live_ids - recorded["bridge"]),
            "veths_vs_live": [len(veths), len(live)] if len(veths) != len(live) else [],
            "hostport_elements_vs_live": [hostports, len(live)] if hostports != len(live) else [],
            "reconcile_would_collect": list(reconcile.collected + reconcile.stale_attachments + reconcile.errors),
        }
        report["leaks"] = {k: len(v) for k, v in leaks.items()}
        report["seconds"] = round(time.monotonic() - began, 1)
        print("\nstorm report: " + json.dumps(report))
        if os.environ.get("PYCNI_STORM_REPORT"):
            Path(os.environ["PYCNI_STORM_REPORT"]).write_text(json.dumps(report, indent=2))
        assert counts["faults"] > 0, "the storm injected no faults"
        assert not any(leaks.values()), leaks
    finally:
        for w in workers:
            w.close()
        for ns in reversed(made):
            ns.__exit__(None, None, None)

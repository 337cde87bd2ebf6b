"""The measurements: latency cells, the runtime's own overhead, and concurrency.

A *cell* is one backend at one N in fresh namespaces: ADD every container, snapshot the host
firewall (rule counts, first-packet walk), CHECK every container, DEL every container, snapshot
again. Every call is timed alone with ``time.perf_counter``; a failed call is still a sample and
is counted (with the first message) instead of aborting the cell.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from pycni import netns
from pycni.backends import Backend as PluginBackend
from pycni.backends import ExecBackend
from pycni.sdk import PluginRequest
from pycni.sdk.invoke import VersionInfo, find_plugin, raw_exec

from . import rules
from .drivers import (
    CONTAINER_PORT,
    FAILURES,
    REFERENCE_DIR,
    TIMEOUT,
    Backend,
    BackendError,
    RuntimeDriver,
    host_port,
)
from .session import Session
from .stats import summarize


class Progress:
    """Progress on stderr: a line per finished phase, a live counter when stderr is a TTY."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self._last = 0.0

    def line(self, text: str) -> None:
        if self.live:
            sys.stderr.write("\r\033[K")
        print(text, file=sys.stderr, flush=True)

    def tick(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if self.live and (now - self._last > 0.25 or done == total):
            self._last = now
            sys.stderr.write(f"\r\033[K    {label} {done}/{total}")
            sys.stderr.flush()


def _settle(threads_before: set[threading.Thread], timeout: float = 5.0) -> list[str]:
    """Wait for threads a backend started and left running (pycni's link deletion hands the
    kernel's acknowledgement to a helper thread); returns the names of those still alive."""
    deadline = time.monotonic() + timeout
    for thread in set(threading.enumerate()) - threads_before:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sorted(t.name for t in set(threading.enumerate()) - threads_before)


def _open_fds() -> dict[str, str]:
    """Open descriptors (number → target) once garbage is collected: what a backend still holds,
    not what awaits GC."""
    gc.collect()
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, already closed
            continue
    return found


def _phase(
    backend: str, n: int, op: str, call: Callable[[int], object], progress: Progress
) -> tuple[list[object], dict[str, Any]]:
    samples: list[float] = []
    outcomes: list[object] = []
    errors, first = 0, None
    gc.collect()  # the harness's own garbage (ruleset snapshots, the last phase) is not the backend's to collect
    for i in range(n):
        start = time.perf_counter()
        try:
            outcome = call(i)
        except FAILURES as e:
            outcome = None
            errors += 1
            first = first or f"container {i}: {e}"
        samples.append((time.perf_counter() - start) * 1000)
        outcomes.append(outcome)
        progress.tick(f"{backend} n={n} {op}", i + 1, n)
    return outcomes, _row(backend, n, op, samples, errors, first)


def _row(backend: str, n: int, op: str, samples: list[float], errors: int, first: str | None) -> dict[str, Any]:
    return {
        "backend": backend,
        "n": n,
        "op": op,
        **summarize(samples),
        "errors": errors,
        "first_error": first,
        "samples": [round(s, 3) for s in samples],
    }


def _pooled(row: dict[str, Any], earlier: list[dict[str, Any]], progress: Progress) -> dict[str, Any]:
    """``row`` with the samples and errors of the same op's ``earlier`` rounds pooled in
    (they come first), as printed."""
    if earlier:
        rows = [*earlier, row]
        first = next((r["first_error"] for r in rows if r["first_error"]), None)
        samples = [s for r in rows for s in r["samples"]]
        row = _row(row["backend"], row["n"], row["op"], samples, sum(r["errors"] for r in rows), first)
    progress.line(
        f"    {row['backend']:<16} n={row['n']:<5} {row['op']:<5} p50 {row['p50_ms']:8.1f} ms"
        f"  p90 {row['p90_ms']:8.1f} ms  p99 {row['p99_ms']:8.1f} ms"
        + (f"  errors {row['errors']}: {row['first_error']}" if row["errors"] else "")
    )
    return row


def latency_cell(
    backend: Backend, n: int, session: Session, progress: Progress, rounds: int = 1
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One backend at one N: rows for each op, and the cell's facts (rules, first packet, …).

    With ``rounds`` > 1 the cell's N containers are added and deleted ``rounds`` − 1 times
    first, and each op's row pools the samples of every round (CHECK runs in the last one): at
    small N one cell's first ADDs (the bridge made, and the kernel's work that follows it) are
    otherwise a fifth of the samples.
    """
    fds_before = _open_fds()
    threads_before = set(threading.enumerate())
    load = os.getloadavg()
    started = time.perf_counter()
    rows = []
    with session.cell(f"{backend.name}-n{n}", n) as cell:
        driver = backend.make(cell)
        earlier: dict[str, list[dict[str, Any]]] = {"add": [], "del": []}
        for _ in range(rounds - 1):
            for op, call in (("add", driver.add), ("del", driver.delete)):
                earlier[op].append(_phase(backend.name, n, op, call, progress)[1])
        results, row = _phase(backend.name, n, "add", driver.add, progress)
        rows.append(_pooled(row, earlier["add"], progress))
        addresses = [driver.address(r) for r in results if r is not None]
        snap = rules.snapshot(cell.host)
        last = results[-1]
        workload = driver.workload
        first_packet: dict[str, Any]
        if not workload.port_mappings or workload.gateway is None:
            first_packet = {"port": None, "error": "no port mappings in this chain"}
        elif last is None:
            first_packet = {"port": host_port(n - 1), "error": "the last ADD failed"}
        else:
            target = f"{driver.address(last)}:{CONTAINER_PORT}"
            first_packet = rules.first_packet(snap, host_port(n - 1), workload.gateway, target)
        after_add = rules.count(snap)
        for op, call in (("check", driver.check), ("del", driver.delete)):
            if op in driver.ops:
                rows.append(_pooled(_phase(backend.name, n, op, call, progress)[1], earlier.get(op, []), progress))
        after_del = rules.count(rules.snapshot(cell.host))
        close = getattr(driver, "close", None)
        if close is not None:  # sockets a driver keeps for the cell (the floor's) are no backend's leftovers
            close()
    threads_left = _settle(threads_before)
    fds_after = _open_fds()
    facts = {
        "backend": backend.name,
        "n": n,
        "rounds": rounds,
        "wall_s": round(time.perf_counter() - started, 3),
        "loadavg_1m_at_start": round(load[0], 2),
        "addresses": len(addresses),
        "distinct_addresses": len(set(addresses)) == len(addresses),
        "rules_after_add": after_add,
        "rules_after_del": after_del,
        "first_packet": first_packet,
        "open_fds_delta": len(fds_after) - len(fds_before),
        "open_fds_new": sorted(target for fd, target in fds_after.items() if fds_before.get(fd) != target),
        "threads_left": threads_left,
    }
    fp = first_packet.get("rules_evaluated", first_packet.get("error"))
    progress.line(
        f"    {backend.name:<16} n={n:<5} after ADD: {after_add['nft_rules']} nft rules,"
        f" {after_add['nft_elements']} set/map elements, {after_add['iptables_rules']} iptables rules;"
        f" first packet: {fp} rule evaluations; after DEL: {after_del['nft_rules']} nft rules"
    )
    return rows, facts


# -- the runtime's own overhead ----------------------------------------------------------------


class _Timed:
    """A backend wrapper recording each call's request and the time spent inside the backend
    (the exec itself, or the in-process plugin), as the runtime calls it."""

    def __init__(self, inner: PluginBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple[str, PluginRequest, float]] = []

    def find(self, plugin_type: str, paths: Sequence[str]) -> str:
        return self.inner.find(plugin_type, paths)

    def version_info(self, plugin_type: str, paths: Sequence[str]) -> VersionInfo:
        return self.inner.version_info(plugin_type, paths)

    def is_builtin(self, plugin_type: str) -> bool:
        return self.inner.is_builtin(plugin_type)

    def validate(self, plugin_type: str, request: PluginRequest) -> None:
        self.inner.validate(plugin_type, request)

    def run(self, plugin_type: str, request: PluginRequest) -> dict[str, Any] | None:
        start = time.perf_counter()
        try:
            return self.inner.run(plugin_type, request)
        finally:
            self.calls.append((plugin_type, request, (time.perf_counter() - start) * 1000))

    def timed(self, call: Callable[[], object]) -> tuple[float, float]:
        """``(wall ms, wall ms − ms inside the backend)`` of one runtime call."""
        self.calls.clear()
        start = time.perf_counter()
        call()
        wall = (time.perf_counter() - start) * 1000
        return wall, wall - sum(ms for _, _, ms in self.calls)


Prepared = Sequence[tuple[str, str, bytes, dict[str, str]]]


def _replay(prepared: Prepared) -> dict[str, float]:
    """Raw-exec the recorded ADDs in order (in the calling thread's namespace); ms per plugin."""
    per_plugin: dict[str, float] = {}
    for plugin_type, path, stdin, env in prepared:
        start = time.perf_counter()
        outcome = raw_exec(path, stdin, env, timeout=TIMEOUT)
        per_plugin[plugin_type] = (time.perf_counter() - start) * 1000
        if outcome.returncode != 0:
            raise BackendError(f"raw exec of {plugin_type} failed: {outcome.stdout[:300]!r} {outcome.stderr[:300]!r}")
    return per_plugin


def _undo(prepared: Prepared) -> None:
    """DEL what the replay added: the same stdin (it carries prevResult and the port mappings)."""
    for _, path, stdin, env in reversed(prepared):
        raw_exec(path, stdin, {**env, "CNI_COMMAND": "DEL"}, timeout=TIMEOUT)


def runtime_overhead(samples: int, inprocess: bool, session: Session, progress: Progress) -> dict[str, Any]:
    """What pycni's runtime adds on top of running the plugins.

    Exec path, reference plugins, per sample: runtime ADD (recording each request and the time
    inside each backend call) → runtime DEL → raw replay of the recorded ADD requests with
    :func:`pycni.sdk.invoke.raw_exec` (same binaries, stdin and env) from a thread already inside the
    host namespace → raw DEL. Both sides start from the same state.

    * ``overhead`` = runtime ADD − Σ raw exec of the replay (the two are separate runs, so on a
      loaded machine their noise dominates single samples; look at p50 over many);
    * ``accounted`` = runtime ADD − Σ time inside the backend's calls of the *same* ADD: config
      and request building, the thread hop into the host namespace per plugin, result parsing
      and conversion, locks and the results cache, without exec noise (``del_accounted``: DEL).

    With ``inprocess``, the same accounting for the in-process backend (ADD and DEL), where the
    per-plugin thread hop also carries whatever the plugins leave to thread exit.
    """
    recording = _Timed(ExecBackend(TIMEOUT))
    runtime_ms: list[float] = []
    raw_ms: list[float] = []
    accounted: list[float] = []
    del_accounted: list[float] = []
    per_plugin: dict[str, list[float]] = {}
    with session.cell("overhead-exec", samples + 1) as cell:
        driver = RuntimeDriver(cell, path=[REFERENCE_DIR], backend=recording)
        for i in range(samples + 1):
            wall, outside = recording.timed(partial(driver.add, i))
            prepared = [
                (t, find_plugin(t, req.path), req.stdin(), {**os.environ, **req.env()}) for t, req, _ in recording.calls
            ]
            del_outside = recording.timed(partial(driver.delete, i))[1]
            each = netns.run_in(cell.host, _replay, prepared)
            netns.run_in(cell.host, _undo, prepared)
            if i == 0:  # warm-up (first cache write, first bridge, cold page cache): not counted
                continue
            runtime_ms.append(wall)
            accounted.append(outside)
            del_accounted.append(del_outside)
            raw_ms.append(sum(each.values()))
            for plugin_type, ms in each.items():
                per_plugin.setdefault(plugin_type, []).append(ms)
            progress.tick("overhead (exec)", i, samples)
    overhead = [r - w for r, w in zip(runtime_ms, raw_ms)]
    result: dict[str, Any] = {
        "backend": "reference-exec",
        "samples": samples,
        "runtime_add": summarize(runtime_ms),
        "raw_exec_sum": summarize(raw_ms),
        "overhead": summarize(overhead),
        "accounted": summarize(accounted),
        "del_accounted": summarize(del_accounted),
        "raw_exec_p50_ms_by_plugin": {t: summarize(v)["p50_ms"] for t, v in per_plugin.items()},
        "overhead_samples": [round(o, 3) for o in overhead],
        "accounted_samples": [round(a, 3) for a in accounted],
    }
    progress.line(
        f"    exec: runtime ADD p50 {result['runtime_add']['p50_ms']:.1f} ms, raw exec sum p50"
        f" {result['raw_exec_sum']['p50_ms']:.1f} ms → overhead p50 {result['overhead']['p50_ms']:.2f} ms;"
        f" accounted inside the same ADD p50 {result['accounted']['p50_ms']:.2f} ms"
        f" (DEL {result['del_accounted']['p50_ms']:.2f} ms)"
    )
    if inprocess:
        result["inprocess"] = _inprocess_accounting(samples, session, progress)
    return result


def _inprocess_accounting(samples: int, session: Session, progress: Progress) -> dict[str, Any]:
    from pycni.backends import InProcessBackend

    timed = _Timed(InProcessBackend())
    walls: dict[str, list[float]] = {"add": [], "del": []}
    outside: dict[str, list[float]] = {"add": [], "del": []}
    with session.cell("overhead-inprocess", samples + 1) as cell:
        driver = RuntimeDriver(cell, path=[], backend=timed)
        for op, call in (("add", driver.add), ("del", driver.delete)):
            for i in range(samples + 1):
                wall, rest = timed.timed(partial(call, i))
                if i == 0:  # warm-up, as for the exec path
                    continue
                walls[op].append(wall)
                outside[op].append(rest)
                progress.tick(f"overhead (in-process {op})", i, samples)
    result = {
        f"{op}{suffix}": summarize(values[op])
        for op in ("add", "del")
        for suffix, values in (("", walls), ("_accounted", outside))
    }
    progress.line(
        f"    in-process: ADD p50 {result['add']['p50_ms']:.1f} ms of which outside the plugins"
        f" {result['add_accounted']['p50_ms']:.2f} ms; DEL p50 {result['del']['p50_ms']:.1f} ms of which"
        f" outside the plugins {result['del_accounted']['p50_ms']:.2f} ms"
    )
    return result


# -- concurrency --------------------------------------------------------------------------------


def concurrency(backend: Backend, n: int, workers: int, session: Session, progress: Progress) -> dict[str, Any]:
    """ADD then DEL ``n`` containers from ``workers`` threads sharing one runtime."""
    row: dict[str, Any] = {"backend": backend.name, "containers": n, "workers": workers}
    with session.cell(f"{backend.name}-w{workers}", n) as cell:
        driver = backend.make(cell)
        for op, call in (("add", driver.add), ("del", driver.delete)):
            outcomes, wall = _concurrently(call, n, workers)
            failures = [o for o in outcomes if isinstance(o[1], BaseException)]
            row[op] = {
                "wall_s": round(wall, 3),
                "throughput_per_s": round((n - len(failures)) / wall, 2),
                "errors": len(failures),
                "first_error": str(failures[0][1]) if failures else None,
                **summarize([ms for ms, _ in outcomes]),
            }
            if op == "add":
                addresses = [driver.address(r) for _, r in outcomes if not isinstance(r, BaseException)]
                row["add"]["addresses"] = len(addresses)
                row["add"]["distinct_addresses"] = len(set(addresses)) == len(addresses)
    add, delete = row["add"], row["del"]
    progress.line(
        f"    {backend.name:<16} workers={workers:<3} ADD {add['throughput_per_s']:7.1f}/s"
        f" (errors {add['errors']}, distinct addresses {add['distinct_addresses']})"
        f"  DEL {delete['throughput_per_s']:7.1f}/s (errors {delete['errors']})"
    )
    return row


def _concurrently(call: Callable[[int], object], n: int, workers: int) -> tuple[list[tuple[float, Any]], float]:
    def timed(i: int) -> tuple[float, Any]:
        start = time.perf_counter()
        try:
            outcome: Any = call(i)
        except FAILURES as e:
            outcome = e
        return (time.perf_counter() - start) * 1000, outcome

    pool = ThreadPoolExecutor(workers, thread_name_prefix="bench")
    start = time.perf_counter()
    try:
        outcomes = list(pool.map(timed, range(n)))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on Ctrl-C: no queued ADD starts
    return outcomes, time.perf_counter() - start

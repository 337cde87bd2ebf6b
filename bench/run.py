"""Benchmark pycni against the Go reference plugins and netavark; write the results as JSON.

Run from the repository root, as root (everything happens in namespaces the harness creates):

    .venv/bin/python bench/run.py --quick --json /tmp/bench.json
    .venv/bin/python bench/run.py --n 1,10,100,1000 --json results.json
    .venv/bin/python bench/report.py --json results.json --markdown results.md --png results.png

Sections (``--sections``): ``latency`` (ADD/CHECK/DEL per backend × N, with rule counts and the
first-packet walk per cell), ``overhead`` (runtime vs raw exec), ``concurrency``, ``memory``,
``parsing``; on request only: ``steps`` (per kernel request timings of in-process ADDs at each N)
and ``dataplane`` (connections per second and throughput through N containers' rules). The
latency section of the built-in chain also times the ``floor`` (bench/floor.py: the same kernel
objects with the fewest raw pyroute2/libnftables calls) in the same rotation.

Backends are alternated per N with a rotating start so machine drift hits all of them alike;
one untimed-in-the-table warm-up cell per backend runs first.

``--conflist FILE [--plugin-dir DIR]`` measures your own chain instead of the built-in one
(sections latency, concurrency, parsing): exec'd from DIR (backend ``exec``), and with pycni's
plugins in-process or exec'd where every type in it is built into pycni. ``--fold`` adds its
folded form (one ``pycni-chain`` exec per network), without and with a daemon.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere

from bench import dataplane, drivers, machine, measure, memory, parsing, report, shim, steps
from bench.session import PREFIX, Session, claim_run, install_signal_handlers
from pycni.errors import CNIError

SECTIONS = ("latency", "overhead", "concurrency", "memory", "parsing")
EXTRA_SECTIONS = ("steps", "dataplane")  # long; run only when asked for
CONFLIST_SECTIONS = ("latency", "concurrency", "parsing")  # the others are about the built-in chain
SCHEMA = 1


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected a comma-separated list of positive integers")
    return values


def _names(choices: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {', '.join(choices)}")
        return names

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N in 1,10,100 (overrides --n)")
    p.add_argument("--n", type=_ints, default=[1, 10, 100, 1000], help="containers per cell (default 1,10,100,1000)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="R",
        help="latency: add and delete each cell's containers R times, the samples of every round pooled"
        " (CHECK in the last): at small N one round's first ADDs weigh on its p50",
    )
    every = tuple(dict.fromkeys(drivers.BACKENDS + drivers.CONFLIST_BACKENDS))
    folded = ",".join(drivers.FOLDED_BACKENDS)
    p.add_argument(
        "--backends",
        type=_names(every),
        help=f"default {','.join(drivers.BACKENDS)}; with --conflist {','.join(drivers.CONFLIST_BACKENDS)}"
        f" (and {folded} with --fold)",
    )
    p.add_argument("--conflist", metavar="FILE", help="measure this conflist instead of the built-in chain")
    p.add_argument("--fold", action="store_true", help=f"with --conflist: measure its folded form too ({folded})")
    p.add_argument(
        "--plugin-dir",
        default=drivers.REFERENCE_DIR,
        metavar="DIR",
        help=f"where the exec backend finds the conflist's plugins (default {drivers.REFERENCE_DIR})",
    )
    p.add_argument("--json", metavar="PATH", help="write the results here")
    p.add_argument(
        "--no-floor",
        action="store_true",
        help="leave out the latency section's floor row (the chain's kernel objects by raw pyroute2/libnftables calls)",
    )
    p.add_argument(
        "--sections",
        type=_names(SECTIONS + EXTRA_SECTIONS),
        help=f"default {','.join(SECTIONS)}; with --conflist {','.join(CONFLIST_SECTIONS)};"
        f" on request: {','.join(EXTRA_SECTIONS)}",
    )
    p.add_argument("--steps-window", type=int, default=10, metavar="K", help="ADDs timed per step before each N")
    p.add_argument("--dataplane-n", type=_ints, default=[10, 100, 1000], metavar="LIST")
    p.add_argument(
        "--dataplane-backends",
        type=_names(drivers.BACKENDS),
        default=list(dataplane.BACKENDS),
        metavar="LIST",
        help=f"default {','.join(dataplane.BACKENDS)}",
    )
    p.add_argument("--dataplane-seconds", type=float, default=3.0, metavar="S", help="per measurement")
    p.add_argument("--dataplane-workers", type=int, default=2, metavar="W", help="connection generator processes")
    p.add_argument(
        "--dataplane-repeat", type=int, default=5, metavar="R", help="rounds (median, min, max of the runs kept)"
    )
    p.add_argument(
        "--dataplane-group",
        choices=("n", "backend"),
        default="n",
        help="cells held and measured interleaved: every backend at one N (n), or every N of one backend",
    )
    p.add_argument("--dataplane-pin", action="store_true", help="the generator on CPU 0, the server on CPU 1 (taskset)")
    p.add_argument("--overhead-samples", type=int, default=20, metavar="K")
    p.add_argument("--shim-samples", type=int, default=200, metavar="K", help="execs per shim measurement")
    p.add_argument("--concurrency-n", type=int, default=100, metavar="N")
    p.add_argument("--concurrency-workers", type=_ints, default=[1, 4, 16], metavar="LIST")
    p.add_argument(
        "--concurrency-backends",
        type=_names(every),
        metavar="LIST",
        help="default pycni-inprocess,reference-exec; with --conflist exec,pycni-inprocess",
    )
    p.add_argument(
        "--memory-backends",
        type=_names(drivers.BACKENDS),
        default=["pycni-inprocess", "reference-exec", "netavark"],
        metavar="LIST",
        help="measured at each N of the run, up to the largest",
    )
    p.add_argument("--parse-time", type=float, default=0.1, metavar="S", help="seconds per parsing measurement")
    p.add_argument(
        "--max-n",
        type=_limits,
        default={},
        metavar="BACKEND=N,...",
        help="skip a backend's cells above N (e.g. pycni-exec=100: ~0.5 s per exec'd call makes N=1000 take an hour)",
    )
    p.add_argument(
        "--volatile",
        choices=("tmpfs", "disk"),
        default="tmpfs",
        help="where volatile state lives (IPAM leases, pycni's state, netavark's config): a private tmpfs, "
        "as /run is on a systemd host (default), or the temp dir's disk; the results cache is always on disk",
    )
    args = p.parse_args(argv)
    if args.json and not os.access(Path(args.json).resolve().parent, os.W_OK):
        p.error(f"--json {args.json}: its directory does not exist or is not writable")  # fail before, not after, a run
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: at least 1")
    if args.quick:
        args.n = [1, 10, 100]
    args.workload = drivers.DEFAULT
    if args.fold and not args.conflist:
        p.error(f"--fold is for --conflist (the built-in chain's folded backends are {folded})")
    if args.conflist:
        try:
            args.workload = drivers.load_workload(args.conflist, args.plugin_dir)
        except (OSError, CNIError) as e:
            p.error(f"--conflist {args.conflist}: {e}")
        wrong = [s for s in args.sections or () if s not in CONFLIST_SECTIONS]
        if wrong:
            only = ",".join(CONFLIST_SECTIONS)
            p.error(f"--sections {','.join(wrong)}: these measure the built-in chain (with --conflist: {only})")
    defaults: tuple[tuple[str, ...], tuple[str, ...], list[str]]
    conflist_backends = drivers.CONFLIST_BACKENDS + (drivers.FOLDED_BACKENDS if args.fold else ())
    defaults = (conflist_backends, CONFLIST_SECTIONS, ["exec", "pycni-inprocess"])
    if not args.conflist:
        defaults = (drivers.BACKENDS, SECTIONS, ["pycni-inprocess", "reference-exec"])
    args.backends = args.backends or list(defaults[0])
    args.sections = args.sections or list(defaults[1])
    args.concurrency_backends = args.concurrency_backends or list(defaults[2])
    return args


def _limits(text: str) -> dict[str, int]:
    out = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        every = (*drivers.BACKENDS, *drivers.CONFLIST_BACKENDS)
        if not sep or name not in every or not value.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r}: expected BACKEND=N with BACKEND in {list(every)}")
        out[name] = int(value)
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _rotate(names: list[str], k: int) -> list[str]:
    k %= len(names)
    return names[k:] + names[:k]


def run(args: argparse.Namespace, session: Session, doc: dict[str, Any], progress: measure.Progress) -> None:
    """Fill ``doc`` section by section (what finished stays there if a later section fails)."""
    available: dict[str, drivers.Backend] = {}
    for name in args.backends:
        why = drivers.problem(name, args.workload)
        if why is None:
            try:
                available[name] = drivers.backend(name, session.root, session.on_close, args.workload)
            except (OSError, ValueError, ImportError) as e:
                why = f"setup failed: {e}"
        if why is not None:
            doc["skipped"][name] = why
            progress.line(f"skipping {name}: {why}")
    names = list(available)
    if not names:
        raise RuntimeError(f"no backend can run here: {doc['skipped']}")

    if "latency" in args.sections and "pycni-daemon" in available:
        daemon = available["pycni-daemon"]
        # Any shim of the workload: a shim is the same few lines whatever its type.
        first = args.workload.types[0]
        doc["shim"] = shim.measure(
            os.path.join(daemon.plugin_dir, first), daemon.socket, session.root, args.shim_samples
        )
        s = doc["shim"]
        progress.line(
            f"== shim: start-up (exec → first byte sent) p50 {s['startup']['p50_ms']:.2f} ms,"
            f" VERSION round trip through the daemon p50 {s['version_round_trip']['p50_ms']:.2f} ms,"
            f" bare interpreter (exec → exit) p50 {s['bare_interpreter']['p50_ms']:.2f} ms"
        )

    if "latency" in args.sections:
        timed = names + _floor(args, session, doc, available, progress)
        progress.line(f"== warm-up: one cell of 1 container per backend ({', '.join(timed)})")
        for name in timed:
            doc["warmup"].extend(measure.latency_cell(available[name], 1, session, progress)[0])
        for k, n in enumerate(args.n):
            order = [b for b in _rotate(timed, k) if n <= args.max_n.get(b, n)]
            progress.line(f"== latency n={n}: {' → '.join(order)}")
            for position, name in enumerate(order):
                rows, facts = measure.latency_cell(available[name], n, session, progress, args.rounds)
                doc["rows"].extend(rows)
                doc["cells"].append({**facts, "position": position})

    if "overhead" in args.sections:
        progress.line(f"== runtime overhead: {args.overhead_samples} ADDs, runtime vs raw exec of the same requests")
        if "reference-exec" in available:
            try:
                doc["overhead"] = measure.runtime_overhead(
                    args.overhead_samples, "pycni-inprocess" in available, session, progress
                )
            except drivers.FAILURES as e:  # the measurement needs every call to succeed
                doc["overhead"] = {"error": str(e)}
                progress.line(f"    failed: {e}")
        else:
            doc["overhead"] = {"skipped": "needs the reference plugins (reference-exec)"}

    if "concurrency" in args.sections:
        progress.line(f"== concurrency: {args.concurrency_n} containers, workers {args.concurrency_workers}")
        for name in args.concurrency_backends:
            if name not in available:
                continue
            for workers in args.concurrency_workers:
                doc["concurrency"].append(
                    measure.concurrency(available[name], args.concurrency_n, workers, session, progress)
                )

    if "memory" in args.sections:
        checkpoints = sorted(set(args.n))
        progress.line(f"== memory: peak RSS of a fresh process doing the ADDs, at N = {checkpoints}")
        for name in args.memory_backends:
            if name not in available:
                continue
            result = memory.measure(name, [n for n in checkpoints if n <= args.max_n.get(name, n)], session)
            doc["memory"].append(result)
            if "error" in result:
                progress.line(f"    {name:<16} failed: {result['error']}")
                continue
            first, last = result["points"][0], result["points"][-1]
            served = f"; daemon {last['daemon_vm_hwm_kib'] / 1024:.1f} MiB" if "daemon_vm_hwm_kib" in last else ""
            progress.line(
                f"    {name:<16} VmHWM {first['vm_hwm_kib'] / 1024:.1f} MiB after imports,"
                f" {last['vm_hwm_kib'] / 1024:.1f} MiB at n={last['n']};"
                f" largest child {last['children_maxrss_kib'] / 1024:.1f} MiB{served}"
            )

    if "steps" in args.sections:
        progress.line(f"== steps: kernel requests of in-process ADDs before N = {sorted(set(args.n))}")
        if "pycni-inprocess" in available:
            doc["steps"] = steps.measure(sorted(set(args.n)), args.steps_window, session, progress)
            for row in doc["steps"]["growth"][:8]:
                progress.line(f"    {row['step']:<48} {row['low_ms']:8.3f} → {row['high_ms']:8.3f} ms per ADD")
        else:
            doc["steps"] = {"skipped": "needs pycni-inprocess"}

    if "dataplane" in args.sections:
        why = dataplane.problem()
        if why is None:
            binary = dataplane.build(session.root)
            progress.line(f"== dataplane: N = {args.dataplane_n}, {args.dataplane_seconds:g} s per measurement")
            for group in _dataplane_groups(args, available):
                doc["dataplane"].extend(
                    dataplane.measure(
                        group,
                        binary,
                        args.dataplane_seconds,
                        args.dataplane_workers,
                        args.dataplane_repeat,
                        args.dataplane_pin,
                        session,
                        progress,
                    )
                )
        else:
            doc["skipped"]["dataplane"] = why
            progress.line(f"skipping dataplane: {why}")

    if "parsing" in args.sections:
        progress.line("== parsing: results per second per spec version")
        doc["parsing"] = parsing.measure(args.parse_time)
        for row in doc["parsing"]:
            progress.line(
                f"    {row['version']}: json.loads {row['json_loads_per_s']:>9,}/s  parse {row['parse_per_s']:>9,}/s"
                f"  parse+convert {row['parse_convert_per_s']:>9,}/s"
            )


def _dataplane_groups(
    args: argparse.Namespace, available: dict[str, drivers.Backend]
) -> list[list[tuple[drivers.Backend, int]]]:
    """The data plane's cells, in the groups measured interleaved: every backend at one N
    (``--dataplane-group n``: the stacks compared at each N) or every N of one backend
    (``backend``: each stack's ×N₀ from runs seconds apart)."""
    names = [name for name in args.dataplane_backends if name in available]
    if args.dataplane_group == "backend":
        return [[(available[name], n) for n in args.dataplane_n] for name in names]
    return [[(available[name], n) for name in names] for n in args.dataplane_n]


def _floor(
    args: argparse.Namespace,
    session: Session,
    doc: dict[str, Any],
    available: dict[str, drivers.Backend],
    progress: measure.Progress,
) -> list[str]:
    """The floor joins the latency rotation of the built-in chain (``[]`` with --conflist or --no-floor)."""
    if args.no_floor or args.workload is not drivers.DEFAULT:
        return []
    why = drivers.problem(drivers.FLOOR)
    if why is None:
        available[drivers.FLOOR] = drivers.backend(drivers.FLOOR, session.root)
        return [drivers.FLOOR]
    doc["skipped"][drivers.FLOOR] = why
    progress.line(f"skipping {drivers.FLOOR}: {why}")
    return []


_TMPFS_ENV = "PYCNI_BENCH_TMPFS"
_RUN_ENV = "PYCNI_BENCH_RUN"  # "<run id>:<lock fd>" handed to the re-exec'd child


def _in_private_tmpfs(argv: list[str] | None, script: str = __file__) -> int:
    """Re-run ``script`` (this harness, or another bench tool) in a private mount namespace with a
    tmpfs for volatile state; the mount exists only there and disappears with the process."""
    run_id, lock_fd = claim_run()  # held here too, so a sweep never takes the mountpoint of a live run
    mountpoint = tempfile.mkdtemp(prefix=f"{PREFIX}{run_id}-tmpfs-")
    mount_then_exec = 'mount -t tmpfs -o mode=0700 pycni-bench "$0" && exec "$@"'
    cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        mount_then_exec,
        mountpoint,
        sys.executable,
        os.path.abspath(script),
        *(sys.argv[1:] if argv is None else argv),
    ]
    env = dict(os.environ, **{_TMPFS_ENV: mountpoint, _RUN_ENV: f"{run_id}:{lock_fd}"})
    child = subprocess.Popen(cmd, env=env, pass_fds=(lock_fd,))

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)  # the child cleans up; this process only waits for it

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        return child.wait()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(mountpoint)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench/run.py needs root: it creates network namespaces (and touches nothing else)", file=sys.stderr)
        return 2
    if args.volatile == "tmpfs" and _TMPFS_ENV not in os.environ:
        return _in_private_tmpfs(argv)
    install_signal_handlers()
    progress = measure.Progress()
    claimed = None
    if _RUN_ENV in os.environ:
        run_id, fd = os.environ[_RUN_ENV].split(":")
        claimed = (run_id, int(fd))
    session = Session(claimed, root=os.environ.get(_TMPFS_ENV))
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "run_id": session.run_id,
        "started": _now(),
        "argv": sys.argv[1:] if argv is None else argv,
        "config": {
            "n": args.n,
            "rounds": args.rounds,
            "backends": args.backends,
            "max_n": args.max_n,
            "sections": args.sections,
            "cni_version": args.workload.cni_version,
            "chain": list(args.workload.chain),
            "subnet": args.workload.subnet,
            "conflist": os.path.abspath(args.conflist) if args.conflist else None,
            "fold": args.fold,
            "plugin_dir": args.plugin_dir if args.conflist else None,
            "reference_backend": "exec" if args.conflist else "reference-exec",
            "host_port_base": drivers.HOST_PORT_BASE,
            "container_port": drivers.CONTAINER_PORT,
            "netavark_argv": [*drivers.netavark_argv("<cell dir>/netavark"), "setup|teardown", "<container netns>"],
            "temp_root": session.root,
            "volatile": args.volatile,
            "cache_root": session.disk_root,
            "namespace_prefix": session.prefix,
        },
        "machine": {},
        "skipped": {},
        "warmup": [],
        "rows": [],
        "cells": [],
        "overhead": {},
        "concurrency": [],
        "memory": [],
        "parsing": [],
        "shim": {},
        "steps": {},
        "dataplane": [],
    }
    status = 0
    started = time.monotonic()
    progress.line(f"pycni bench run {session.run_id}: namespaces {session.prefix}*, temp {session.root}")
    if session.swept:
        progress.line(f"  swept {len(session.swept)} leftovers of dead runs (namespace files, temp dirs, locks)")
    try:
        doc["machine"] = machine.describe()
        run(args, session, doc, progress)
    except KeyboardInterrupt:
        doc["interrupted"] = True
        status = 130
        progress.line("interrupted: cleaning up")
    except BaseException:
        doc["error"] = traceback.format_exc()
        status = 1
        raise
    finally:
        swept = session.close()
        doc["cleanup"] = {"swept_namespaces": swept, "temp_root_removed": session.root_removed()}
        doc["finished"] = _now()
        doc["wall_s"] = round(time.monotonic() - started, 1)
        doc["loadavg_at_end"] = list(os.getloadavg())
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
            progress.line(f"wrote {args.json}")
    print(report.markdown(doc))
    return status


if __name__ == "__main__":
    sys.exit(main())

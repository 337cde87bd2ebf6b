"""Where a daemon backend's time goes: inside ``pycni serve`` (what its log says each request
took) and outside it, per exec (the runtime's spawn, the shim's interpreter, the socket).

    .venv/bin/python -m bench.daemon_split [--n 30] [--backends pycni-daemon,pycni-daemon-folded]

Run as root from the repository root. Each backend gets its daemon and one cell of N
containers (ADD all, CHECK all, DEL all), and the shim measurement of :mod:`bench.shim` (bare
interpreter, VERSION round trip) in the same minute, for scale. Volatile state is on a private
tmpfs, as ``bench/run.py`` keeps it by default.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere

from bench import drivers, shim
from bench.run import _RUN_ENV, _TMPFS_ENV, _in_private_tmpfs  # the harness's own re-exec
from bench.session import Session, install_signal_handlers

_SERVED = re.compile(r"serve: (\S+) (ADD|CHECK|DEL) \S+ ok ([\d.]+)ms")


def split(session: Session, name: str, n: int) -> list[str]:
    """One line for the shim, one per operation: wall p50, p50 in the daemon per type, the rest per exec."""
    backend = drivers.backend(name, session.root, session.on_close)
    log = os.path.join(session.root, name, "serve.log")
    first = os.path.join(backend.plugin_dir, sorted(os.listdir(backend.plugin_dir))[0])
    s = shim.measure(first, backend.socket, session.root, 100)
    lines = [
        f"{name}: bare interpreter p50 {s['bare_interpreter']['p50_ms']:.1f} ms,"
        f" shim VERSION round trip p50 {s['version_round_trip']['p50_ms']:.1f} ms"
    ]
    walls: dict[str, list[float]] = {}
    with session.cell("split", n) as cell:
        driver = backend.make(cell)
        for op, call in (("ADD", driver.add), ("CHECK", driver.check), ("DEL", driver.delete)):
            for i in range(n):
                start = time.perf_counter()
                call(i)
                walls.setdefault(op, []).append((time.perf_counter() - start) * 1000)
    served: dict[str, dict[str, list[float]]] = {}
    with open(log) as f:
        for m in _SERVED.finditer(f.read()):
            served.setdefault(m[2], {}).setdefault(m[1], []).append(float(m[3]))
    for op, wall in walls.items():
        inside = {t: statistics.median(ms[-n:]) for t, ms in served.get(op, {}).items()}
        p50, execs = statistics.median(wall), max(1, len(inside))
        each = ", ".join(f"{t} {ms:.1f}" for t, ms in inside.items())
        lines.append(
            f"  {op}: wall p50 {p50:.1f} ms; in the daemon {sum(inside.values()):.1f} ms ({each});"
            f" outside, per exec {(p50 - sum(inside.values())) / execs:.1f} ms × {execs}"
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=30, help="containers (default 30)")
    p.add_argument("--backends", default="pycni-daemon,pycni-daemon-folded")
    args = p.parse_args()
    names = args.backends.split(",")
    wrong = [b for b in names if b not in ("pycni-daemon", "pycni-daemon-folded") or drivers.problem(b)]
    if wrong:
        p.error(f"cannot split {wrong}: choose daemon backends that can run here")
    if os.geteuid() != 0:
        p.error("needs root: it creates network namespaces (and touches nothing else)")
    if _TMPFS_ENV not in os.environ:
        return _in_private_tmpfs(sys.argv[1:], script=__file__)
    install_signal_handlers()
    run_id, fd = os.environ[_RUN_ENV].split(":")
    session = Session((run_id, int(fd)), root=os.environ[_TMPFS_ENV])
    try:
        for name in names:
            print("\n".join(split(session, name, args.n)), flush=True)
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

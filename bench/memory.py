"""Peak memory of the process doing the ADDs, in a fresh interpreter per backend.

The parent (:func:`measure`) makes the cell (namespaces, work dir) and starts
``python -m bench.memory SPEC`` with the cell's paths; the child imports only what its backend
needs, ADDs the containers one by one, and at each checkpoint N reports its own ``VmHWM``
(peak RSS) and ``VmRSS`` from /proc/self/status, plus ``ru_maxrss`` of its largest finished
child process (the exec'd plugins, or netavark), and for a daemon backend the daemon's own
``VmHWM``/``VmRSS`` (a daemon of the child's, stopped when it ends). It does not DEL: the cell's
namespaces and files are removed by the parent, which takes every rule, link and lease with them.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from .session import JOIN_DEADLINE, Cell, Session, install_signal_handlers, join_netns_threads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_TIMEOUT = 3600.0


def measure(backend: str, checkpoints: list[int], session: Session) -> dict[str, Any]:
    n = max(checkpoints)
    with session.cell(f"{backend}-mem", n) as cell:
        # A scratch of its own (a daemon backend's socket and shims), named so a sweep finds
        # its daemon's namespace: the parent's daemons may still be running in session.root.
        scratch = tempfile.mkdtemp(prefix=f"{session.prefix}m", dir=session.root)
        spec = {"backend": backend, "cell": asdict(cell), "checkpoints": checkpoints, "scratch": scratch}
        spec_path = os.path.join(cell.dir, "memory-spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.memory", spec_path], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        try:
            out, _ = proc.communicate(timeout=CHILD_TIMEOUT)
        finally:
            if proc.poll() is None:  # interrupted or timed out: the child is ours to end
                proc.terminate()  # it lets its in-flight plugin call finish, then exits
                try:
                    proc.wait(JOIN_DEADLINE + 5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if proc.returncode != 0:
        return {"backend": backend, "error": f"memory child exited {proc.returncode}"}
    report: dict[str, Any] = json.loads(out)
    return report


def _status_kib(field: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise KeyError(field)


def _point(n: int, daemon_pid: int) -> dict[str, int]:
    point = {
        "n": n,
        "vm_hwm_kib": _status_kib("VmHWM"),
        "vm_rss_kib": _status_kib("VmRSS"),
        "children_maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    }
    if daemon_pid:
        point["daemon_vm_hwm_kib"] = _status_kib("VmHWM", daemon_pid)
        point["daemon_vm_rss_kib"] = _status_kib("VmRSS", daemon_pid)
    return point


def child(spec_path: str) -> dict[str, Any]:
    from .drivers import FAILURES, backend

    with open(spec_path) as f:
        spec = json.load(f)
    cell = Cell(**{**spec["cell"], "containers": tuple(spec["cell"]["containers"])})
    closers: list[Callable[[], None]] = []
    try:
        made = backend(spec["backend"], spec["scratch"], closers.append)
        driver = made.make(cell)
        checkpoints = set(spec["checkpoints"])
        points = [_point(0, made.daemon_pid)]
        errors, first = 0, None
        for i in range(len(cell.containers)):
            try:
                driver.add(i)
            except FAILURES as e:
                errors += 1
                first = first or f"container {i}: {e}"
            if i + 1 in checkpoints:
                points.append(_point(i + 1, made.daemon_pid))
    finally:
        for close in reversed(closers):
            close()
    return {"backend": spec["backend"], "points": points, "errors": errors, "first_error": first}


if __name__ == "__main__":
    install_signal_handlers()
    try:
        print(json.dumps(child(sys.argv[1])))
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        join_netns_threads()  # an exec'd plugin still running must finish before the parent removes its namespace

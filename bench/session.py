"""Everything the harness creates, and the guarantee that all of it goes away.

A :class:`Session` owns one temporary directory and names every namespace it makes
``pycni-bench-<run id>-…``. A :meth:`Session.cell` is one measured unit (a throwaway host
namespace, N container namespaces, a work dir with the IPAM dataDir, the results cache and
pycni's state dir, which the drivers pass to the runtime), torn down when its block ends however
it ends. :meth:`Session.close` waits for in-flight plugin threads, then sweeps any namespace
left with the session's prefix (a Ctrl-C in the middle of a ``create`` can leave one) and
removes the directory. SIGINT,
SIGTERM and SIGHUP raise KeyboardInterrupt (SIGINT even when a shell started the harness with
it ignored), so ``finally`` blocks run; signals are ignored while closing, so a second Ctrl-C
cannot interrupt the cleanup itself.

A run killed outright (SIGKILL, a machine restart) cleans nothing, and where ``/run`` is not a
tmpfs its namespace files outlive it. Each session therefore holds a lock on
``<tmp>/pycni-bench-<run id>.lock`` while it lives, and every new session first sweeps the
namespaces and directories of runs whose lock nobody holds (:func:`sweep_dead_runs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pycni import netns

PREFIX = "pycni-bench-"
JOIN_DEADLINE = 15.0  # an exec'd plugin call finishes well within this; its timeout is 60 s


@dataclass(frozen=True)
class Cell:
    """Paths of one measured unit; plain strings so a child process can be handed them."""

    label: str
    host: str
    containers: tuple[str, ...]
    dir: str  # volatile state (IPAM leases, pycni's state dir, netavark's config): /run on a real host
    cache_dir: str  # the results cache: /var/lib/cni on a real host, always on disk


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def install_signal_handlers() -> None:
    # SIGINT too: a shell starts background jobs with SIGINT ignored, and `kill -INT` must still clean up.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


_RUN_ID = re.compile(r"^pycni-bench-([0-9a-f]{6})[-.]")


def _lock_path(run_id: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"{PREFIX}{run_id}.lock")


def claim_run() -> tuple[str, int]:
    """A fresh run id and the fd of its held lock (inheritable, so a re-exec'd child keeps it)."""
    while True:
        run_id = secrets.token_hex(3)
        try:
            fd = os.open(_lock_path(run_id), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.set_inheritable(fd, True)
        return run_id, fd


def _run_is_live(run_id: str) -> bool:
    try:
        fd = os.open(_lock_path(run_id), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock taken just now
    return False


def sweep_dead_runs() -> list[str]:
    """Remove the namespaces, temp dirs and lock files of runs that are no longer alive."""
    tmp = tempfile.gettempdir()
    found: dict[str, list[str]] = {}
    for base in (netns.RUN_DIR, tmp):
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(base):
                m = _RUN_ID.match(name)
                if m:
                    found.setdefault(m.group(1), []).append(os.path.join(base, name))
    removed = []
    for run_id, paths in sorted(found.items()):
        if _run_is_live(run_id):
            continue
        for path in sorted(paths, key=lambda p: p.endswith(".lock")):  # the lock file last
            if path.startswith(netns.RUN_DIR + "/"):
                if os.path.ismount(path):
                    netns.remove(path)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            elif os.path.isdir(path) and not os.path.ismount(path):
                shutil.rmtree(path, ignore_errors=True)
            elif not os.path.isdir(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            removed.append(path)
    return removed


def namespaces_with_prefix(prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(netns.RUN_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


class Session:
    """One harness run: its run id, temp root and namespaces (``prefix`` = ``pycni-bench-<id>-``)."""

    def __init__(self, claimed: tuple[str, int] | None = None, *, root: str | None = None) -> None:
        """``claimed``: the run id and lock fd from :func:`claim_run`, when a parent already did."""
        self.swept = sweep_dead_runs()
        self.run_id, self._lock = claimed or claim_run()
        self.prefix = f"{PREFIX}{self.run_id}-"
        self.root = root or tempfile.mkdtemp(prefix=self.prefix)
        os.makedirs(self.root, exist_ok=True)
        self.disk_root = tempfile.mkdtemp(prefix=f"{self.prefix}cache-")
        self._cells = 0
        self._closers: list[Callable[[], None]] = []

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` first thing in :meth:`close` (e.g. stop a daemon the run started)."""
        self._closers.append(fn)

    @contextlib.contextmanager
    def cell(self, label: str, n: int) -> Iterator[Cell]:
        """A host namespace + ``n`` container namespaces + a work dir, for the block."""
        self._cells += 1
        tag = f"{self._cells:03d}-{label}"
        work = tempfile.mkdtemp(prefix=f"{tag}-", dir=self.root)
        cache = tempfile.mkdtemp(prefix=f"{tag}-", dir=self.disk_root)
        with contextlib.ExitStack() as stack:
            stack.callback(shutil.rmtree, work, True)
            stack.callback(shutil.rmtree, cache, True)
            host = stack.enter_context(netns.Throwaway(name=f"{self.prefix}{tag}-host"))
            containers = [stack.enter_context(netns.Throwaway(name=f"{self.prefix}{tag}-c{i}")) for i in range(n)]
            yield Cell(label, host.path, tuple(c.path for c in containers), work, cache)

    def close(self) -> list[str]:
        """Remove everything left; returns the namespaces the sweep had to remove."""
        with signals_ignored():
            for fn in reversed(self._closers):
                fn()
            join_netns_threads()
            leftovers = namespaces_with_prefix(self.prefix)
            for name in leftovers:
                netns.remove(name)
            if os.path.ismount(self.root):  # the private tmpfs: empty it; it goes with the process
                for entry in os.listdir(self.root):
                    shutil.rmtree(os.path.join(self.root, entry), ignore_errors=True)
            else:
                shutil.rmtree(self.root, ignore_errors=True)
            shutil.rmtree(self.disk_root, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_lock_path(self.run_id))
            os.close(self._lock)
            return leftovers

    def root_removed(self) -> bool:
        gone = not os.path.exists(self.root) or (os.path.ismount(self.root) and not os.listdir(self.root))
        return gone and not os.path.exists(self.disk_root)


def join_netns_threads() -> None:
    """Wait for worker threads still inside a namespace (pycni's ``run_in`` names them ``netns:``):
    after a Ctrl-C they may still be running an exec'd plugin, which must finish before its
    namespace and files go away."""
    deadline = time.monotonic() + JOIN_DEADLINE
    for thread in threading.enumerate():
        if thread.name.startswith("netns:") and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))

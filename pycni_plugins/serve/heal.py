"""Self-healing: the daemon puts pycni's nftables state back after someone removed it.

A firewall reload (``nft flush ruleset``, ``nft -f`` of a ruleset that starts with it, a
``systemctl reload nftables``) takes pycni's tables with it, and with them every container's
masquerade, host ports and firewall accepts. For each host network namespace it served an ADD
in, the daemon keeps a watcher thread subscribed to the namespace's nftables change
notifications (:func:`pycni_plugins.kernel.nfnl.watching`, pyroute2's nfnetlink socket). When a
transaction committed by another process removes one of pycni's tables, chains, rules or sets
(or notifications were lost), it waits :data:`DEBOUNCE` for the rest of the reload and then, in
that namespace, for every state dir it served there, repairs the skeleton the records need and
puts back every recorded element that is missing (:func:`pycni_plugins.kernel.nft.restore_all`:
the records name their sections, so no plugin config is needed, and their namespace, so a
state dir shared by several host namespaces heals each with its own), logging one line per heal.

It does not fight pycni's own transactions: the daemon's own commits (its plugins' ADDs and DELs,
its heals) are ignored, and a transaction that only removes elements is never a reason to heal
(that is what every DEL does, and the DEL's record goes after its commit); a repair some other
pycni process makes (a chain flushed to be refilled) only triggers a check that finds nothing
missing. Elements someone deletes one by one are reported by CHECK instead, and
``pycni gc --reconcile`` restores them.

A watched namespace pins itself (the watcher's socket holds it), so the watcher checks every
:data:`ALIVE_EVERY` seconds whether anything else still refers to it: a process in it, or a bind
mount of it in the daemon's mount namespace (where the callers are too). When nothing does, the
watcher closes its socket and ends, and the namespace goes. (A namespace held only by another
process's open fd is not seen: its watcher ends, and the next ADD served there starts a new one.)
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from pycni import netns

from ..kernel import layout, nfnl, nft
from .logs import log

__all__ = ["DEBOUNCE", "ALIVE_EVERY", "Healer"]

#: Seconds to wait after a change that removed pycni's state before healing (the rest of a
#: reload's transactions come meanwhile); the wait never exceeds :data:`DEBOUNCE_MAX`.
DEBOUNCE = 0.1
DEBOUNCE_MAX = 0.4
#: Seconds between two checks that a watched namespace is still referred to by anything else.
ALIVE_EVERY = 2.0
_POLL = 0.5  # the longest a watcher waits before looking at the stop flag again
_SHOWN = 12  # restored items named in the log line


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def referenced(ino: int) -> bool:
    """Whether a process (its main thread) is in namespace ``net:[ino]`` or a mount in this
    mount namespace binds it."""
    tag = f"net:[{ino}]"
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" ", 4)
            if len(fields) > 3 and fields[3] == tag:
                return True
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink(f"/proc/{pid}/ns/net") == tag:
                    return True
            except OSError:
                continue
    return False


class _Watch:
    """One host namespace: the fd the watcher enters it by, and the state dirs served there."""

    def __init__(self, ident: tuple[int, int], fd: int, state_dir: str) -> None:
        self.ident = ident
        self.fd = fd
        self.state_dirs = {state_dir}
        self.thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return f"net:[{self.ident[1]}]"


class Healer:
    """The watchers of the daemon's host namespaces: :meth:`watch` after each ADD served."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[tuple[int, int], _Watch] = {}
        self._stopping = threading.Event()
        self.heals = 0

    def watch(self, netns_fd: int, state_dir: str) -> None:
        """Watch the namespace of ``netns_fd`` (which stays the caller's: it is duplicated)
        and heal ``state_dir``'s records there."""
        if self._stopping.is_set():
            return
        ident = _ident(netns_fd)
        with self._lock:
            watch = self._watches.get(ident)
            if watch is not None:
                watch.state_dirs.add(state_dir)
                return
            fd = os.dup(netns_fd)
            watch = self._watches[ident] = _Watch(ident, fd, state_dir)
            thread = threading.Thread(target=self._run, args=(watch,), name="pycni-serve-heal", daemon=True)
            watch.thread = thread
            try:
                thread.start()
            except RuntimeError:  # no thread to be had: no healing there until the next ADD
                del self._watches[ident]
                os.close(fd)

    def watched(self) -> list[str]:
        """The namespaces watched now (``net:[inode]``)."""
        with self._lock:
            return sorted(w.name for w in self._watches.values())

    def stop(self, timeout: float = 2.0) -> None:
        """End every watcher (they look at the flag every half second)."""
        self._stopping.set()
        with self._lock:
            threads = [w.thread for w in self._watches.values() if w.thread is not None]
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, watch: _Watch) -> None:
        try:
            with contextlib.ExitStack() as stack:
                with netns.entered(watch.fd):
                    watcher = stack.enter_context(nfnl.watching())
                log.info("heal: watching nftables in netns %s (thread %d)", watch.name, threading.get_native_id())
                self._loop(watch, watcher)
        except Exception as e:  # a watcher's failure must not take the daemon down
            log.warning("heal: stopped watching netns %s: %s: %s", watch.name, type(e).__name__, e)
        finally:
            with self._lock:
                if self._watches.get(watch.ident) is watch:
                    del self._watches[watch.ident]
                os.close(watch.fd)

    def _loop(self, watch: _Watch, watcher: nfnl.Watcher) -> None:
        me = os.getpid()
        due: float | None = None
        first = 0.0
        cause = ""
        alive_checked = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            wait = _POLL if due is None else max(0.0, min(_POLL, due - now))
            batches = watcher.batches(wait)
            now = time.monotonic()
            for batch in batches:
                if batch.pid == me and not batch.lost:
                    continue  # the daemon's own commits: its plugins' and its heals
                if batch.lost or batch.removes(nft.TABLE, ("table", "chain", "rule", "set")):
                    if due is None:
                        first = now
                        cause = "lost notifications" if batch.lost else f"a change by pid {batch.pid}"
                    due = min(now + DEBOUNCE, first + DEBOUNCE_MAX)
            if due is not None and now >= due:
                due = None
                self._heal(watch, first, cause)
                alive_checked = time.monotonic()
            elif due is None and now - alive_checked >= ALIVE_EVERY:
                alive_checked = now
                if not referenced(watch.ident[1]):
                    log.info("heal: netns %s is gone: stopped watching it", watch.name)
                    return

    def _heal(self, watch: _Watch, first: float, cause: str) -> None:
        started = time.monotonic()
        restored: list[str] = []
        problems: list[str] = []
        with self._lock:
            state_dirs = sorted(watch.state_dirs)
        with netns.entered(watch.fd):
            for state_dir in state_dirs:
                try:
                    restored += nft.restore_all(state_dir, layout.record_sections)
                except Exception as e:  # e.g. an NftError, a state dir refused: report, go on
                    problems.append(f"{state_dir}: {e}")
        done = time.monotonic()
        if not restored and not problems:
            return
        self.heals += 1
        elements = sum(1 for r in restored if r.startswith("restored "))
        repaired = sum(1 for r in restored if r.startswith("repaired: "))
        shown = "; ".join(restored[:_SHOWN]) + (
            f"; … and {len(restored) - _SHOWN} more" if len(restored) > _SHOWN else ""
        )
        failed = f"; FAILED: {'; '.join(problems)}" if problems else ""
        log.info(
            "heal: netns %s after %s: repaired %d skeleton problem(s), restored %d element(s) in %.1f ms, "
            "%.1f ms after the change (%s)%s",
            watch.name,
            cause,
            repaired,
            elements,
            (done - started) * 1000,
            (done - first) * 1000,
            shown,
            failed,
        )

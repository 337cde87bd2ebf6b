"""Self-healing: the daemon puts pycni's firewall state back after someone removed it.

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

The firewall plugin's iptables compatibility step is healed too, from its records alone
(:func:`pycni_plugins.kernel.iptables.recorded.restore`). iptables-nft's tables are nftables
tables, so the same watcher sees a transaction that removes ``table ip``/``ip6 filter``, a rule
or chain of ``FORWARD`` or of ``PYCNI-FORWARD`` (``iptables -F``, a Docker restart's
``iptables-restore``) or makes the table anew (Docker starting after a flushed ruleset), and
puts back what is missing of the chain, the jump and the recorded rules, where the table is
iptables' own (a table that went away is not made again). Legacy iptables sends nothing: every
:data:`LEGACY_EVERY` seconds the watcher compares a fingerprint of each legacy ``filter`` table
holding recorded rules (one ``getsockopt``) and checks on a change. Rules and records go
together under the state dir's iptables lock (ADD, DEL, GC, the heal), so a DEL is never put
back. After an ADD that recorded firewalld zone sources, a thread per state dir and system bus
runs :func:`pycni_plugins.firewalld_zone.heal_on_reload` (firewalld's ``Reloaded`` signal)
until the daemon stops.

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
from collections.abc import Callable

from pycni import netns

from .. import firewalld_zone
from ..kernel import iptables, layout, nfnl, nft
from ..kernel.iptables import recorded
from .logs import log

__all__ = ["DEBOUNCE", "ALIVE_EVERY", "LEGACY_EVERY", "Healer"]

#: Seconds to wait after a change that removed pycni's state before healing (the rest of a
#: reload's transactions come meanwhile); the wait never exceeds :data:`DEBOUNCE_MAX`.
DEBOUNCE = 0.1
DEBOUNCE_MAX = 0.4
#: Seconds between two checks that a watched namespace is still referred to by anything else.
ALIVE_EVERY = 2.0
#: Seconds between two looks at legacy iptables' filter tables that hold pycni's recorded rules
#: (legacy iptables sends no notifications).
LEGACY_EVERY = 0.5
_POLL = 0.5  # the longest a watcher waits before looking at the stop flag again
_SHOWN = 12  # restored items named in the log line
#: What a heal puts back: pycni's nftables tables, the compatibility step's rules in
#: iptables-nft's tables, in legacy iptables'.
NFT, IPTABLES_NFT, IPTABLES_LEGACY = "nft", "iptables-nft", "iptables-legacy"
_IPTABLES_TABLES = {("ip", "filter"), ("ip6", "filter")}
_IPTABLES_CHAINS = {"FORWARD", iptables.CHAIN}


def _what(batch: nfnl.Batch) -> set[str]:
    """What ``batch`` (another process's transaction) may have taken that a heal puts back:
    pycni's own tables (a table, chain, rule or set of theirs removed — never only elements,
    which is what every DEL removes), or the compatibility step's rules in iptables-nft's
    tables (``table ip``/``ip6 filter`` removed or made anew, a rule or chain of ``FORWARD`` or
    pycni's chain removed: ``iptables -F``, a Docker restart's ``iptables-restore``)."""
    if batch.lost:
        return {NFT, IPTABLES_NFT}
    out = {NFT} if batch.removes(nft.TABLE, ("table", "chain", "rule", "set")) else set()
    if (
        any(kind == "table" and (family, table) in _IPTABLES_TABLES for kind, family, table in batch.removed)
        or any((f, t) in _IPTABLES_TABLES and c in _IPTABLES_CHAINS for f, t, c in batch.chains)
        or batch.created & _IPTABLES_TABLES
    ):
        out.add(IPTABLES_NFT)
    return out


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
        self.cookie: int | None = None  # the namespace's, once the watcher is in it
        # Per state dir: the iptables records dir's mtime and the legacy places recorded then.
        self.legacy: dict[str, tuple[int, frozenset[iptables.Place]]] = {}
        self.fingerprints: dict[iptables.Place, tuple[int, ...] | None] = {}

    def legacy_places(self, state_dirs: list[str]) -> dict[str, frozenset[iptables.Place]]:
        """Per state dir served here, the legacy iptables places its records (of this
        namespace) put rules in; read again only when the records changed (their dir's mtime)."""
        out: dict[str, frozenset[iptables.Place]] = {}
        for state_dir in state_dirs:
            try:
                mtime = os.stat(os.path.join(state_dir, recorded.SUB)).st_mtime_ns
            except OSError:
                continue
            known = self.legacy.get(state_dir)
            if known is None or known[0] != mtime:
                try:
                    places = recorded.recorded_places(state_dir, self.cookie)
                except Exception:  # a refused state dir, a torn record: look again next time
                    continue
                known = self.legacy[state_dir] = (mtime, frozenset(p for p in places if p.flavour == "legacy"))
            if known[1]:
                out[state_dir] = known[1]
        return out

    @property
    def name(self) -> str:
        return f"net:[{self.ident[1]}]"


class Healer:
    """The watchers of the daemon's host namespaces: :meth:`watch` after each ADD served."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[tuple[int, int], _Watch] = {}
        self._firewalld: dict[tuple[str, str], threading.Thread] = {}
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

    def watch_firewalld(self, state_dir: str, address: str) -> None:
        """Re-add ``state_dir``'s recorded firewalld zone sources whenever firewalld on the
        system bus at ``address`` signals ``Reloaded`` (a thread per state dir and bus, until
        the daemon stops: :func:`pycni_plugins.firewalld_zone.heal_on_reload`)."""
        if self._stopping.is_set():
            return
        key = (state_dir, address)
        with self._lock:
            if key in self._firewalld:
                return

            def report(text: str) -> None:
                self.heals += 1
                log.info("heal: firewalld on %s for %s: %s", address, state_dir, text)

            thread = threading.Thread(
                target=self._firewalld_run, args=(state_dir, address, report), name="pycni-serve-heal-fw", daemon=True
            )
            self._firewalld[key] = thread
            try:
                thread.start()
            except RuntimeError:  # no thread to be had: no healing there until the next ADD
                del self._firewalld[key]

    def _firewalld_run(self, state_dir: str, address: str, report: Callable[[str], None]) -> None:
        log.info("heal: watching firewalld's Reloaded signal on %s for %s", address, state_dir)
        try:
            firewalld_zone.heal_on_reload(state_dir, self._stopping, report, address=address)
        except Exception as e:  # a watcher's failure must not take the daemon down
            log.warning("heal: stopped watching firewalld on %s: %s: %s", address, type(e).__name__, e)
            with self._lock:
                self._firewalld.pop((state_dir, address), None)

    def watched(self) -> list[str]:
        """The namespaces watched now (``net:[inode]``)."""
        with self._lock:
            return sorted(w.name for w in self._watches.values())

    def stop(self, timeout: float = 2.0) -> None:
        """End every watcher (they look at the flag every half second)."""
        self._stopping.set()
        with self._lock:
            threads = [w.thread for w in self._watches.values() if w.thread is not None]
            threads += self._firewalld.values()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, watch: _Watch) -> None:
        try:
            with contextlib.ExitStack() as stack:
                with netns.entered(watch.fd):
                    watcher = stack.enter_context(nfnl.watching())
                    watch.cookie = recorded.here()
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
        what: set[str] = set()
        alive_checked = time.monotonic()
        next_poll = alive_checked
        polled_failed = False
        while not self._stopping.is_set():
            now = time.monotonic()
            wait = min(_POLL, max(0.0, next_poll - now))
            if due is not None:
                wait = max(0.0, min(wait, due - now))
            batches = watcher.batches(wait)
            now = time.monotonic()
            for batch in batches:
                if batch.pid == me and not batch.lost:
                    continue  # the daemon's own commits: its plugins' and its heals
                found = _what(batch)
                if found:
                    if due is None:
                        first = now
                        cause = "lost notifications" if batch.lost else f"a change by pid {batch.pid}"
                    what |= found
                    due = min(now + DEBOUNCE, first + DEBOUNCE_MAX)
            if due is not None and now >= due:
                due = None
                self._heal(watch, first, cause, what)
                what = set()
                alive_checked = time.monotonic()
            elif due is None and now - alive_checked >= ALIVE_EVERY:
                alive_checked = now
                if not referenced(watch.ident[1]):
                    log.info("heal: netns %s is gone: stopped watching it", watch.name)
                    return
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + LEGACY_EVERY
                try:
                    self._poll_legacy(watch)
                except Exception as e:  # the nftables watcher goes on; the next poll tries again
                    if not polled_failed:
                        log.warning("heal: cannot look at legacy iptables in netns %s: %s", watch.name, e)
                    polled_failed = True
                else:
                    polled_failed = False

    def _poll_legacy(self, watch: _Watch) -> None:
        """Legacy iptables sends no notifications: every :data:`LEGACY_EVERY` seconds, compare
        the fingerprints of the legacy ``filter`` tables that hold recorded rules (one
        ``getsockopt`` each, no exec) with the last ones, and on a change (or the first look)
        put back what is missing (one ``-save``, and a ``-restore`` if something is)."""
        with self._lock:
            state_dirs = sorted(watch.state_dirs)
        places = watch.legacy_places(state_dirs)
        if not places:
            watch.fingerprints.clear()
            return
        started = time.monotonic()
        wanted = frozenset().union(*places.values())
        with netns.entered(watch.fd):
            now = {p: recorded.fingerprint(p) for p in wanted}
        changed = any(fp is not None and watch.fingerprints.get(p) != fp for p, fp in now.items())
        # Stored before the heal: its own -restore changes them, and the next look then checks
        # once more (a change made between the heal and a fingerprint read after it is not missed).
        watch.fingerprints = dict(now)
        if changed:
            cause = f"a change of legacy iptables' filter table (seen by the {LEGACY_EVERY:g} s poll)"
            self._heal(watch, started, cause, {IPTABLES_LEGACY}, list(places), since="it was seen")

    def _heal(
        self,
        watch: _Watch,
        first: float,
        cause: str,
        what: set[str],
        state_dirs: list[str] | None = None,
        since: str = "the change",
    ) -> None:
        started = time.monotonic()
        restored: list[str] = []
        rules: list[str] = []
        problems: list[str] = []
        if state_dirs is None:
            with self._lock:
                state_dirs = sorted(watch.state_dirs)
        flavours = [f for f, kind in (("nft", IPTABLES_NFT), ("legacy", IPTABLES_LEGACY)) if kind in what]
        with netns.entered(watch.fd):
            for state_dir in state_dirs:
                try:
                    if NFT in what:
                        restored += nft.restore_all(state_dir, layout.record_sections)
                    if flavours:
                        rules += recorded.restore(state_dir, flavours)
                except Exception as e:  # e.g. an NftError, an IptablesError, a state dir refused: report, go on
                    problems.append(f"{state_dir}: {e}")
        done = time.monotonic()
        if not restored and not rules and not problems:
            return
        self.heals += 1
        parts: list[str] = []
        if restored or not rules:
            elements = sum(1 for r in restored if r.startswith("restored "))
            repaired = sum(1 for r in restored if r.startswith("repaired: "))
            parts.append(f"repaired {repaired} skeleton problem(s), restored {elements} element(s)")
        if rules:
            parts.append(f"restored {sum(1 for r in rules if ' chain ' not in r)} iptables rule(s)")
        items = restored + rules
        shown = "; ".join(items[:_SHOWN]) + (f"; … and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")
        failed = f"; FAILED: {'; '.join(problems)}" if problems else ""
        log.info(
            "heal: netns %s after %s: %s in %.1f ms, %.1f ms after %s (%s)%s",
            watch.name,
            cause,
            ", ".join(parts),
            (done - started) * 1000,
            (done - first) * 1000,
            since,
            shown,
            failed,
        )

"""The one place libnftables is called: what pycni owns, contexts, transactions, typed errors, and
the per-namespace memo of what was last verified."""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from logging import DEBUG
from typing import TYPE_CHECKING, Any

import attrs

from pycni import netns
from pycni._libnftables import Nftables
from pycni.errors import CNIError, ErrorCode

from .. import changes, nfnl

if TYPE_CHECKING:
    from .ownership import Element

__all__ = [
    "TABLE",
    "FAMILIES",
    "VERIFY_EVERY",
    "table",
    "NftError",
    "ElementConflict",
    "NftNotFound",
    "NftBusy",
    "NftInterrupted",
    "error",
    "context",
    "memo",
    "generation",
    "commits_since",
    "has_table",
    "settled",
    "run",
    "run_json",
    "list_table",
    "status",
]

#: pycni's own tables: ``table inet pycni`` and ``table bridge pycni``. Nothing here lists,
#: flushes or edits anyone else's table (:func:`list_table` and :func:`run_json` excepted: the
#: hooks that read or program another owner's table on purpose).
TABLE = "pycni"
FAMILIES = ("inet", "bridge")
#: Seconds what no ruleset generation tracks (:mod:`..hostfw`'s legacy iptables, sysctls,
#: uplinks; a state dir's epoch token) is trusted for.
VERIFY_EVERY = 1.0
#: Seconds after which an unused namespace's memo is dropped (its namespace may be gone).
FORGET_AFTER = 60.0
_GENERATION_MASK = 0xFFFFFFFF  # NFTA_GEN_ID is 32 bits: it wraps
#: The commands of a transaction that leaves what the memo knows (sections whole, epochs
#: present) as it was: only additions, and deletions of elements (never of an epoch's: those
#: go through :func:`run_json`).
_KEEPS = ("add ", "create ", "insert ", "delete element ")
_ELEMENT = re.compile(r"(?:add|create|delete) element (\S+) \S+ (\S+) ")
READ_RETRIES = 5


def table(family: str) -> str:
    """pycni's table of ``family`` as nft names it in commands and messages."""
    return f"table {family} {TABLE}"


class NftError(CNIError):
    """libnftables refused a transaction; ``msg`` is its error text (first line)."""

    default_code = ErrorCode.INTERNAL


class ElementConflict(NftError):
    """An element's key is held by another attachment (EEXIST); ``holder`` is its comment
    (``""``: an element without one) when known."""

    element: Element | None = None
    holder: str | None = None


class NftNotFound(NftError):
    """A table, chain, set or object named by the transaction does not exist (ENOENT)."""


class NftBusy(NftError):
    """An object the transaction deletes is still in use, e.g. a counter a rule references (EBUSY)."""


class NftInterrupted(NftError):
    """The kernel interrupted a read because the ruleset changed under it (EINTR): retry."""


#: libnftables reports the kernel's errno only as its strerror text: the one place it is read.
_BY_TEXT: tuple[tuple[str, type[NftError]], ...] = (
    ("File exists", ElementConflict),
    ("No such file or directory", NftNotFound),
    ("Device or resource busy", NftBusy),
    ("Interrupted system call", NftInterrupted),
)


def error(err: str | None) -> NftError:
    """libnftables' error text as the typed :class:`NftError` it stands for."""
    text = (err or "").strip()
    first = text.splitlines()[0] if text else "unknown nftables error"
    cls = next((c for marker, c in _BY_TEXT if marker in first), NftError)
    return cls(first, text)


@attrs.define(eq=False)
class Memo:
    """What was last learned about one namespace's table, shared by the threads working in it.

    ``ensured`` (the sections found whole), ``bare`` and ``authoritative`` (per state dir: its
    epoch token and the answer) hold at ruleset generation ``generation``. Every committed transaction
    increments the generation, so :func:`settled` forgets them as soon as the generation is
    another one — unless the step was one of our own transactions that only add things or
    delete elements, after which :func:`run` reads the generation: when it is the memo's plus
    one, nothing but that transaction happened since the memo's was read, and it removed no
    rule, chain or epoch, so what was known still holds (``generation`` moves on).
    Someone else's change (``nft flush ruleset``, a firewall reload) is therefore seen by the
    next ADD, at the cost of a ~0.01 ms read. Also the last dump of each family's chains and
    rules with the generation it shows, and the host's own filtering (:mod:`..hostfw`)."""

    generation: int | None = None
    ensured: set[tuple[str, str]] = attrs.Factory(set)
    #: (family, set) of sets and maps found without a commented element; a transaction of ours
    #: with an element command on one drops it (before and after its commit).
    bare: set[tuple[str, str]] = attrs.Factory(set)
    #: By state dir: (monotonic time its token was read, the token, the answer).
    authoritative: dict[str, tuple[float, str, bool]] = attrs.Factory(dict)
    dumps: dict[str, tuple[int, dict[str, list[nfnl.Rule]] | None]] = attrs.Factory(dict)
    #: The host's own forward filtering (:mod:`..hostfw`): nftables by generation; legacy
    #: iptables, br_netfilter's sysctls and the uplinks by the monotonic time they were read at.
    host_filters: tuple[int, Any] | None = None
    host_legacy: tuple[float, Any] | None = None
    #: The namespace's cookie (never reused while the machine runs); ``None`` where the kernel has none.
    cookie: int | None = None
    used: float = attrs.Factory(time.monotonic)
    lock: threading.Lock = attrs.Factory(threading.Lock)

    def stale(self, now: float) -> bool:
        return now - self.used >= FORGET_AFTER

    def learned(
        self,
        at: int,
        *,
        sections: Iterable[tuple[str, str]] = (),
        authority: tuple[str, tuple[float, str, bool]] | None = None,
        bare: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Keep what was found at generation ``at`` (:func:`settled`'s): ``sections`` whole,
        ``authority`` = (state dir, (when its token was read, the token, the answer)), ``bare``
        sets; dropped if the memo moved on since."""
        with self.lock:
            if self.generation != at:
                return
            self.ensured.update(sections)
            self.bare.update(bare)
            if authority is not None:
                self.authoritative[authority[0]] = authority[1]

    def _touching(self, sets: set[tuple[str, str]]) -> None:
        with self.lock:
            self.bare -= sets

    def _committed(self, before: int | None, after: int | None, sets: set[tuple[str, str]]) -> None:
        with self.lock:
            self.bare -= sets
            if before is not None and after is not None and self.generation == before:
                if after in (before, (before + 1) & _GENERATION_MASK):
                    self.generation = after


_local = threading.local()
# By netns cookie, which the kernel never reuses (inode numbers are reused as soon as a namespace
# dies), so a thread that starts after another one finished still finds what it learned.
_memos: dict[int, Memo] = {}
_memos_lock = threading.Lock()
_SO_NETNS_COOKIE = 71  # asm-generic/socket.h, Linux 5.14


def _netns_ident() -> tuple[int, int]:
    # An fstat of the fd the enclosing netns.entered() holds, where a stat of the path costs ~1 us more.
    return netns.own_identity()


def _shared_memo() -> Memo:
    """The calling thread's namespace's memo; a private one where the kernel has no cookies."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            cookie = int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8), sys.byteorder)
    except OSError:
        return Memo()
    with _memos_lock:
        memo = _memos.get(cookie)
        if memo is None:
            now = time.monotonic()
            for old in [c for c, m in _memos.items() if m.stale(now)]:
                del _memos[old]
            memo = _memos[cookie] = Memo(cookie=cookie)
        return memo


def context() -> Any:
    """The calling thread's libnftables context for its current network namespace.

    A context's netlink socket is bound to the namespace it was created in. It is kept: closing
    a socket that committed deletions makes the kernel flush its deferred-free work, an RCU
    grace period (~13 ms) that a kept socket never waits for.
    """
    ident = _netns_ident()
    cached = getattr(_local, "ctx", None)
    if cached is not None and cached[0] == ident:
        return cached[1]
    ctx = _LoggedNftables()
    _local.ctx = (ident, ctx)
    _local.memo = _shared_memo()
    old = getattr(_local, "probe", None)
    if old is not None:
        old.close()
        _local.probe = None
    return ctx


class _LoggedNftables(Nftables):
    """A context whose changes are logged at debug (:mod:`..changes`); ``json_cmd`` calls
    ``cmd`` too."""

    def cmd(self, cmdline: str) -> tuple[int, Any, str]:
        rc, out, err = super().cmd(cmdline)
        if changes.log.isEnabledFor(DEBUG):
            changes.nft_transaction(cmdline, rc, err)
        return rc, out, err


def memo() -> Memo:
    """The memo of the calling thread's current namespace."""
    context()
    found: Memo = _local.memo
    return found


def _probe() -> nfnl.Probe:
    """The calling thread's probe, for the namespace :func:`context` was last called in (call
    it first: it finds the namespace)."""
    probe: nfnl.Probe | None = getattr(_local, "probe", None)
    if probe is None:
        probe = _local.probe = nfnl.Probe()
    return probe


def _generation_here() -> int:
    try:
        return _probe().generation()
    except nfnl.NetlinkError as e:
        raise NftError(f"cannot read the nftables generation: {e.strerror}") from None


def generation() -> int:
    """The calling thread's namespace's ruleset generation (:class:`~..nfnl.Probe`, kept per
    thread beside its context); :class:`NftError` if the kernel does not answer."""
    context()
    return _generation_here()


def has_table(family: str, name: str) -> bool:
    """Whether the calling thread's namespace has ``table <family> <name>`` (any owner's): one
    netlink lookup, where a libnftables listing fetches its cache first."""
    context()
    try:
        return _probe().has_table(family, name)
    except nfnl.NetlinkError as e:
        raise NftError(f"cannot look up table {family} {name}: {e.strerror}") from None


def commits_since(before: int) -> int:
    """How many transactions were committed in the calling thread's namespace, by anyone,
    since :func:`generation` said ``before``."""
    return (generation() - before) & _GENERATION_MASK


def settled() -> tuple[Memo, int]:
    """The calling thread's namespace's memo, rid of what the ruleset changed since it was
    learned (see :class:`Memo`), and the generation that holds at: pass it to
    :meth:`Memo.learned` with what is then found."""
    shared = memo()
    now = _generation_here()
    with shared.lock:
        shared.used = time.monotonic()
        if shared.generation != now:
            shared.generation = now
            shared.ensured.clear()
            shared.bare.clear()
            shared.authoritative.clear()
    return shared, now


def run(commands: Iterable[str]) -> None:
    """Apply ``commands`` as one transaction; :class:`NftError` (nothing applied) on failure.

    After a transaction of additions and element deletions only, the generation is read, so
    the memo keeps what it knows across it when nothing else happened (:class:`Memo`)."""
    lines = list(commands)
    if not lines:
        return
    ctx = context()
    shared: Memo = _local.memo
    sets = {(m.group(1), m.group(2)) for m in map(_ELEMENT.match, lines) if m}
    shared._touching(sets)
    # The memo's generation was read before this commit, so one step from it to the read after
    # is this commit and nothing else (a read right before the commit would narrow the window
    # for other processes' commits, at one more read per transaction).
    before = shared.generation if all(c.startswith(_KEEPS) for c in lines) else None
    rc, _, err = ctx.cmd("\n".join(lines))
    if rc != 0:
        raise error(err)
    shared._committed(before, _generation_here() if before is not None else None, sets)


def run_json(commands: Sequence[Mapping[str, Any]]) -> None:
    """Apply libnftables JSON ``commands`` as one transaction; :class:`NftError` on failure."""
    rc, _, err = context().json_cmd({"nftables": list(commands)})
    if rc != 0:
        raise error(err)


def list_table(family: str, name: str) -> list[dict[str, Any]] | None:
    """The JSON objects (chains, sets, rules, …) of ``table <family> <name>`` in the calling
    thread's namespace, or ``None`` when there is no such table. For small tables of one owner
    (it lists every element of every set in the table)."""
    rc, out, err = context().json_cmd({"nftables": [{"list": {"table": {"family": family, "name": name}}}]})
    if rc != 0:
        found = error(err)
        if isinstance(found, NftNotFound):
            return None
        raise found
    return [obj for obj in (out or {}).get("nftables", ()) if "metainfo" not in obj]


def status() -> None:
    """STATUS of an nftables plugin: code 50 (plugin not available) unless libnftables loads
    (:class:`~pycni._libnftables.LibnftablesMissing` names the package) and answers in the
    calling thread's namespace."""
    rc, _, err = context().cmd("list tables")
    if rc != 0:
        raise CNIError(
            "nftables is not usable", f"libnftables: {err.strip() or rc}", code=ErrorCode.PLUGIN_NOT_AVAILABLE
        )

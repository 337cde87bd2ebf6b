"""nftables for every pycni plugin: one transaction per operation, in pycni's own tables.

Design (what and why)
---------------------
* **Own tables only.** Everything lives in ``table inet pycni`` (and ``table bridge pycni`` for
  the MAC spoof check). Nothing here lists, flushes or edits anyone else's table.
* **Per-container state is set/map elements, never rules.** The rules are a fixed skeleton that
  looks containers up in hash sets and maps (see :mod:`.layout`), so the first packet of a
  connection costs the same at 10 containers as at 10,000, and an ADD or DEL adds or deletes a
  handful of elements whatever the table holds. Interval sets are avoided on purpose: libnftables
  loads an interval set's elements into userspace to merge ranges, which makes every update
  O(n); the same goes for ``get element``, ``list chain`` and dry runs, which are therefore kept
  off the ADD/DEL path.
* **One transaction.** An operation's changes are one ``Nftables.cmd`` call, which libnftables
  sends as one netlink batch: it applies completely or not at all.
* **The skeleton is created lazily, race-free, and repaired.** A :class:`Section` (chains,
  sets, maps and rules that belong together) is created by one transaction that starts with
  ``create chain <sentinel>``; if a concurrent caller created it first, the sentinel's EEXIST
  rolls ours back whole. Before an ADD's transaction, and at most once a second per namespace
  whichever thread works in it (:data:`VERIFY_EVERY`), the sections are verified with a
  kernel-filtered netlink dump of pycni's chains and rules (:mod:`.nfnl`; no set element is
  read, so it costs the same at any number of containers): a table deleted
  or flushed behind our back (``nft flush ruleset``, a firewall reload) is rebuilt, lost rules
  are put back. CHECK reports such damage precisely (:func:`check`, :func:`skeleton_problems`);
  GC also puts back the recorded elements of the still-valid attachments (:func:`restore`).
* **Who owns what.** Each element carries a ``comment`` naming its attachment
  (``<key> <owner> <network> <containerID> <ifname>``, where ``key`` hashes the (network, container
  ID, ifname) triple), and each (attachment, owner) has a record under the state dir listing its
  elements (:class:`~.state.Records`). DEL reads the record, so it removes exactly what ADD added,
  in O(1), even when the runtime passes no port mappings, no netns or no prevResult. Without a
  record (state dir lost, or a second DEL) it falls back to a search by comment, which is O(n)
  but also finds orphans; :func:`attachments` and :func:`remove` expose that for a GC.
* **Deleting is "add, then delete" in one transaction.** nftables 1.0.6 has no ``destroy``: a
  plain delete of a missing element fails the batch. Adding the element first makes the pair a
  no-op when it is already gone, and when a *different* attachment now holds the key (a map
  element with other data), the add fails with EEXIST and nothing of theirs is touched. With
  the *same* data, or in a plain set, the pair would delete the other holder's element, so a
  record only ever lists elements this attachment created (next point).
* **An element is never taken from another attachment.** ADD creates its elements with
  ``create element`` (EEXIST when the key is there at all, whoever holds it, whatever the
  data): an ADD whose addresses or host ports another attachment holds, even a stale one, is
  refused with nothing changed (:class:`ElementConflict` names the holder; its DEL, or GC,
  removes it). Only an element this attachment's own record lists is re-used (a repeated ADD).
  The record names the new elements *pending* before the commit and confirms them after; DEL
  removes a pending element only if it carries this attachment's comment (a crash between
  record and commit, or a refused ADD, must not let DEL delete the holder's element).
* **The state dir claims one table instance** (the ``epoch`` token, in the dir and in ``set inet
  pycni epoch``): only then does DEL trust a missing record. A state dir claims a table only
  when no other did (a lost state dir must not vouch for elements it has no record of), and
  claims it again when the table had to be rebuilt.
* **Keys are exclusive.** ``create element`` of a key anyone holds fails with EEXIST; that is
  how a host port or an address already held by another attachment is refused with no change
  (see :class:`ElementConflict`). A repeated ADD finds its own elements by their comment (after
  the EEXIST, so only then at O(n) per set) and keeps them, which makes it idempotent.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from pycni.errors import CNIError, ErrorCode
from pycni.failpoints import failpoint
from pycni.sdk import Attachment

from . import nfnl
from .state import Records

__all__ = [
    "TABLE",
    "NftError",
    "ElementConflict",
    "NftNotFound",
    "NftBusy",
    "NftInterrupted",
    "comment",
    "Element",
    "Section",
    "run",
    "ensure",
    "apply",
    "release",
    "missing",
    "holder",
    "map_elements",
    "recorded",
    "Found",
    "attachments",
    "remove",
    "remove_attachments",
    "list_table",
    "run_json",
    "collect",
    "gc",
    "skeleton_problems",
    "repair",
    "check",
    "chains",
    "restore",
]

TABLE = "pycni"
FAMILIES = ("inet", "bridge")
_EPOCH = "epoch"
_COMMENT_MAX = 127
_READ_RETRIES = 5
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/@+=-]")
_COMMENT = re.compile(r'comment "([^"]*)"')
_RULE = re.compile(r"(?:add|insert) rule (\S+) \S+ (\S+) ")
_JUMP = re.compile(r" jump (\S+)$")
#: Seconds between two verifications of the skeleton (its rules) in one namespace.
VERIFY_EVERY = 1.0


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


def _error(err: str | None) -> NftError:
    """libnftables' error text as the typed :class:`NftError` it stands for."""
    text = (err or "").strip()
    first = _first_line(text)
    cls = next((c for marker, c in _BY_TEXT if marker in first), NftError)
    return cls(first, text)


def comment(attachment: Attachment, owner: str) -> str:
    """The comment an ``owner``'s element carries: the attachment's key, the owner, then the
    attachment in nft-safe characters (for a reader), within nft's comment length."""
    parts = (attachment.key, owner, attachment.network, attachment.container_id, attachment.ifname)
    return " ".join(_UNSAFE.sub("_", p) for p in parts)[:_COMMENT_MAX]


@attrs.frozen
class Element:
    """An element of set/map ``set`` in ``table <family> pycni``, as nft text (key [: data])."""

    set: str
    key: str
    data: str | None = None
    family: str = "inet"

    def _body(self, comment: str | None) -> str:
        text = self.key
        if comment is not None:
            text += f' comment "{comment}"'
        if self.data is not None:
            text += f" : {self.data}"
        return text

    def add(self, comment: str | None = None) -> str:
        return f"add element {self.family} {TABLE} {self.set} {{ {self._body(comment)} }}"

    def create(self, comment: str) -> str:
        """Fails the transaction (EEXIST) when the key is present, whatever its data."""
        return f"create element {self.family} {TABLE} {self.set} {{ {self._body(comment)} }}"

    def delete(self) -> str:
        return f"delete element {self.family} {TABLE} {self.set} {{ {self.key} }}"

    def to_json(self) -> list[str | None]:
        return [self.family, self.set, self.key, self.data]

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> Element:
        family, name, key, data = row
        return cls(set=name, key=key, data=data, family=family)


@attrs.frozen
class Section:
    """Shared structure created once per namespace by one transaction.

    ``sentinel`` is the chain whose ``create`` (with ``spec``, e.g. a base chain's hook) opens
    the transaction; ``body`` are the commands that follow it (sets and maps before the rules
    that use them). Sections are ensured in the order given, so a later one may use an earlier.
    """

    family: str
    sentinel: str
    body: tuple[str, ...] = ()
    spec: str = ""

    def rules(self) -> list[tuple[str, str]]:
        """``(chain, command)`` of every rule the body adds (or inserts), in order."""
        out = []
        for command in self.body:
            m = _RULE.match(command)
            if m:
                out.append((m.group(2), command))
        return out

    def structure(self) -> list[str]:
        """The body's commands that are not rules (sets, maps, chains: all idempotent ``add``)."""
        return [c for c in self.body if not _RULE.match(c)]


_local = threading.local()


@attrs.define(eq=False)
class _Memo:
    """What was last learned about one namespace's table, shared by the threads working in it:
    sections verified (monotonic time per section), whether each state dir is authoritative, and
    the last dump of each family's chains and rules with the ruleset generation it shows."""

    ensured: dict[tuple[str, str], float] = attrs.Factory(dict)
    authoritative: dict[str, tuple[float, bool]] = attrs.Factory(dict)  # by state dir
    dumps: dict[str, tuple[int, dict[str, list[nfnl.Rule]] | None]] = attrs.Factory(dict)

    def stale(self, now: float) -> bool:
        times = [*self.ensured.values(), *(t for t, _ in self.authoritative.values())]
        return all(now - t >= VERIFY_EVERY for t in times)


# By netns cookie, which the kernel never reuses (inode numbers are reused as soon as a namespace
# dies), so a thread that starts after another one finished still finds what it learned.
_memos: dict[int, _Memo] = {}
_memos_lock = threading.Lock()
_SO_NETNS_COOKIE = 71  # asm-generic/socket.h, Linux 5.14


def _netns_ident() -> tuple[int, int]:
    st = os.stat("/proc/thread-self/ns/net")
    return st.st_dev, st.st_ino


def _shared_memo() -> _Memo:
    """The calling thread's namespace's memo; a private one where the kernel has no cookies."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            cookie = int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8), sys.byteorder)
    except OSError:
        return _Memo()
    with _memos_lock:
        memo = _memos.get(cookie)
        if memo is None:
            now = time.monotonic()
            for old in [c for c, m in _memos.items() if m.stale(now)]:
                del _memos[old]
            memo = _memos[cookie] = _Memo()
        return memo


def _context() -> Any:
    """The calling thread's libnftables context for its current network namespace.

    A context's netlink socket is bound to the namespace it was created in. It is kept: closing
    a socket that committed deletions makes the kernel flush its deferred-free work, an RCU
    grace period (~13 ms) that a kept socket never waits for.
    """
    ident = _netns_ident()
    cached = getattr(_local, "ctx", None)
    if cached is not None and cached[0] == ident:
        return cached[1]
    import nftables

    ctx = nftables.Nftables()
    _local.ctx = (ident, ctx)
    _local.memo = _shared_memo()
    return ctx


def _memo() -> _Memo:
    _context()
    memo: _Memo = _local.memo
    return memo


def _first_line(err: str) -> str:
    return err.strip().splitlines()[0] if err.strip() else "unknown nftables error"


def run(commands: Iterable[str]) -> None:
    """Apply ``commands`` as one transaction; :class:`NftError` (nothing applied) on failure."""
    text = "\n".join(commands)
    if not text:
        return
    rc, _, err = _context().cmd(text)
    if rc != 0:
        raise _error(err)


def ensure(sections: Iterable[Section], *, force: bool = False) -> None:
    """Make each section whole: created unless its sentinel chain exists (concurrent creators
    are fine), its lost rules put back (:func:`repair`).

    Sections this thread verified in this namespace less than :data:`VERIFY_EVERY` seconds ago
    are skipped unless ``force``; a verification is one kernel-filtered dump of pycni's chains
    and rules (no set element is read), so it costs the same whatever the sets hold.
    """
    done = _memo().ensured
    now = time.monotonic()
    due = [s for s in sections if force or now - done.get((s.family, s.sentinel), -VERIFY_EVERY) >= VERIFY_EVERY]
    if not due:
        return
    repair(due)
    now = time.monotonic()
    for s in due:
        done[(s.family, s.sentinel)] = now


def _create(s: Section) -> None:
    spec = f" {s.spec}" if s.spec else ""
    try:
        run([f"add table {s.family} {TABLE}", f"create chain {s.family} {TABLE} {s.sentinel}{spec}", *s.body])
    except ElementConflict:
        pass


def _records(state_dir: str) -> Records:
    return Records("nft", state_dir)


def _commit(commands: list[str], sections: Sequence[Section], records: Records) -> None:
    try:
        run(commands)
    except ElementConflict:
        raise
    except NftError:
        if not sections:
            raise
        # Something is missing: the table is new (first use, or someone deleted or flushed
        # pycni's table), so the skeleton is rebuilt and the state dir may claim the table.
        ensure(sections, force=True)
        _reclaim(records)
        run(commands)


def _record_name(attachment: Attachment, owner: str) -> str:
    return f"{attachment.key}.{owner}"


def _load(records: Records, attachment: Attachment, owner: str) -> tuple[list[Element], list[Element]] | None:
    """The attachment's confirmed and pending elements (see the module docstring), or ``None``."""
    rec = records.load(_record_name(attachment, owner))
    if rec is None:
        return None
    return [Element.from_json(r) for r in rec.get("elements", ())], [
        Element.from_json(r) for r in rec.get("pending", ())
    ]


def _epoch(records: Records) -> str | None:
    rec = records.load(_EPOCH)
    return rec if isinstance(rec, str) else None


def _store(
    records: Records, attachment: Attachment, owner: str, elements: Iterable[Element], pending: Iterable[Element] = ()
) -> None:
    if _epoch(records) is None:
        _claim(records)
    record = {"attachment": attrs.asdict(attachment), "owner": owner, "elements": [e.to_json() for e in elements]}
    if pending:
        record["pending"] = [e.to_json() for e in pending]
    records.store(_record_name(attachment, owner), record)


def _epoch_tokens() -> list[str] | None:
    """The tokens in ``set inet pycni epoch`` (``None``: no such set). One tiny set is listed."""
    rc, out, _ = _context().json_cmd(
        {"nftables": [{"list": {"set": {"family": "inet", "table": TABLE, "name": _EPOCH}}}]}
    )
    if rc != 0:
        return None
    for obj in (out or {}).get("nftables", ()):
        if "set" in obj:
            return [e if isinstance(e, str) else str(e.get("elem", {}).get("val")) for e in obj["set"].get("elem", ())]
    return []


def _claim(records: Records) -> None:
    """First record in this state dir: tie the dir to this table instance (see _authoritative),
    unless another state dir already claimed the table: then its elements may be recorded
    elsewhere, and this dir never becomes authoritative (DEL without a record searches)."""
    token = secrets.token_hex(7)
    if not records.create(_EPOCH, token):
        return  # a concurrent first writer won; its token stands
    if _epoch_tokens():
        return
    run([f"add table inet {TABLE}", f"add set inet {TABLE} {_EPOCH} {{ type ifname; }}", _epoch_element(token).add()])
    _memo().authoritative.clear()


def _reclaim(records: Records) -> None:
    """After the skeleton had to be rebuilt: when the table's epoch set is gone or empty (a new
    table instance nobody claimed), every element in it was added since, with a record in this
    state dir, so the dir's token is put back and DEL may trust a missing record again."""
    token = _epoch(records)
    if token is None or holder(_epoch_element(token)) is not None or _epoch_tokens():
        return
    run([f"add set inet {TABLE} {_EPOCH} {{ type ifname; }}", _epoch_element(token).add()])
    _memo().authoritative.clear()


def _drop(elements: Iterable[Element]) -> list[str]:
    out = []
    for e in elements:
        out += [e.add(), e.delete()]
    return out


def _conflict(attachment: Attachment, elements: Iterable[Element]) -> ElementConflict | None:
    """The first of ``elements`` held by another attachment (an error naming it), else ``None``.
    O(n) per set (``get element``): only after a transaction failed with EEXIST."""
    prefix = attachment.key + " "
    for e in elements:
        held = holder(e)
        if held is not None and not held.startswith(prefix):
            owner = " ".join(held.split(" ")[2:]) or "an element without an owner"
            kind = "set" if e.data is None else "map"
            error = ElementConflict(
                f"element {e.key} of {kind} {e.set} of table {e.family} {TABLE} belongs to another attachment ({owner})"
            )
            error.element, error.holder = e, held
            return error
    return None


def apply(
    owner: str,
    attachment: Attachment,
    elements: Sequence[Element],
    sections: Sequence[Section] = (),
    shared: Sequence[Element] = (),
    absent: Sequence[Element] = (),
    *,
    state_dir: str,
) -> None:
    """Make ``elements`` the attachment's elements for ``owner``, in one transaction, with the
    record under ``state_dir``.

    Elements recorded by an earlier ADD of the same attachment and not wanted now are removed
    in the same transaction. The record is written before the commit (the new elements as
    pending), so a crash in between can leak nothing a later DEL would not find. ``shared``
    elements (e.g. a bridge's isolation entries) are added in the same transaction but belong
    to no attachment: they are neither recorded nor commented, and no DEL removes them. A
    wanted element another attachment holds refuses the whole ADD (:class:`ElementConflict`),
    nothing changed; so does an ``absent`` element's key (probed in the same transaction by
    "create, delete": EEXIST when anyone holds it) held by another attachment.
    """
    if sections:
        ensure(sections)  # a no-op within VERIFY_EVERY of the last verification
    records = _records(state_dir)
    loaded = _load(records, attachment, owner)
    old = _owned(attachment, loaded)
    wanted = list(dict.fromkeys(elements))
    stale = [e for e in old if e not in wanted]
    _store(records, attachment, owner, [*stale, *(e for e in wanted if e in old)], [e for e in wanted if e not in old])
    failpoint(f"nft.apply.{owner}.after-record")
    text = comment(attachment, owner)
    extra = [e.add() for e in shared]
    keys = {(e.family, e.set, e.key) for e in wanted}
    probes = [e for e in absent if (e.family, e.set, e.key) not in keys]
    try:
        try:
            _commit([*_drop(stale), *(e.create(text) for e in wanted), *_probe(probes), *extra], sections, records)
        except ElementConflict:
            conflict = _conflict(attachment, [*wanted, *probes])
            if conflict is not None:
                raise conflict from None
            # Every key that is there is ours already (a repeated ADD): keep those.
            prefix = attachment.key + " "
            ours = {e for e in [*wanted, *probes] if (holder(e) or "").startswith(prefix)}
            again = [e.add(text) if e in ours else e.create(text) for e in wanted]
            _commit([*_drop(stale), *again, *_probe([e for e in probes if e not in ours]), *extra], sections, records)
    except BaseException:
        if loaded is not None:
            _store(records, attachment, owner, *loaded)
        else:
            records.remove(_record_name(attachment, owner))
        raise
    _store(records, attachment, owner, wanted)


def _probe(elements: Iterable[Element]) -> list[str]:
    return [c for e in elements for c in (e.create("probe"), e.delete())]


def map_elements(family: str, name: str) -> list[Found]:
    """The commented elements of one map of pycni's table. O(its size): no other set is read
    (for small maps, such as the host-IP-specific host ports)."""
    command = {"nftables": [{"list": {"map": {"family": family, "table": TABLE, "name": name}}}]}
    rc, out, _ = _context().json_cmd(command)
    found: list[Found] = []
    for obj in (out or {}).get("nftables", ()) if rc == 0 else ():
        for key, data in (obj.get("map") or {}).get("elem", ()):
            if isinstance(key, dict) and "elem" in key and key["elem"].get("comment"):
                found.append(Found(key["elem"]["comment"], family, name, key["elem"]["val"], data))
    return found


def recorded(owner: str, attachment: Attachment, *, state_dir: str) -> list[Element] | None:
    """The attachment's committed elements for ``owner`` (``None``: no record)."""
    loaded = _load(_records(state_dir), attachment, owner)
    return None if loaded is None else _owned(attachment, loaded)


def _owned(attachment: Attachment, loaded: tuple[list[Element], list[Element]] | None) -> list[Element]:
    """A record's confirmed elements, and its pending ones that carry the attachment's comment
    (left by an ADD killed between its commit and the confirmation: rare, so ``holder`` is fine)."""
    if loaded is None:
        return []
    prefix = attachment.key + " "
    return [*loaded[0], *(e for e in loaded[1] if (holder(e) or "").startswith(prefix))]


def _epoch_element(token: str) -> Element:
    return Element(_EPOCH, f'"{token}"')


def _authoritative(records: Records) -> bool:
    """Whether the state dir's records describe this table: then a missing record means "no
    elements" (a repeated DEL) and the O(n) search by comment can be skipped. The first record
    written to a state dir puts a random token both in the dir and in ``set inet pycni epoch``;
    a lost state dir, or a table rebuilt behind our back, breaks the pair."""
    # Remembered for VERIFY_EVERY per namespace, as ensure() does: every DEL asks
    # for each owner, and the answer only changes when someone rebuilds the table.
    memo = _memo()
    now = time.monotonic()
    cached = memo.authoritative.get(records.root)
    if cached is not None and now - cached[0] < VERIFY_EVERY:
        return cached[1]
    token = _epoch(records)
    answer = token is not None and holder(_epoch_element(token)) is not None
    memo.authoritative[records.root] = (now, answer)
    return answer


def release(owner: str, attachment: Attachment, *, state_dir: str) -> None:
    """Remove the attachment's elements for ``owner``; a no-op when there are none."""
    records = _records(state_dir)
    loaded = _load(records, attachment, owner)
    if loaded is None:
        if not _authoritative(records):
            _remove_found(_search(attachment.key, owner))
        return
    # Pending elements only if ours: the ADD may have been killed before its commit.
    recorded = _owned(attachment, loaded)
    if recorded:
        try:
            run(_drop(recorded))
        except NftError:
            # The table or a set is gone, or another attachment holds one of the keys now:
            # go element by element and leave alone what is not ours.
            for e in recorded:
                try:
                    run(_drop([e]))
                except NftError:
                    continue
    failpoint(f"nft.release.{owner}.after-commit")
    records.remove(_record_name(attachment, owner))


def missing(attachment: Attachment, elements: Iterable[Element]) -> list[Element]:
    """The ``elements`` not present as this attachment's (for CHECK; O(n) per set)."""
    prefix = attachment.key + " "
    return [e for e in elements if not (holder(e) or "").startswith(prefix)]


def holder(element: Element) -> str | None:
    """The comment of the element holding ``element``'s key (``""`` if uncommented), or ``None``."""
    # libnftables 1.0.6 prints nothing for "get element" in JSON mode, so read the text form.
    # A concurrent transaction makes the kernel answer EINTR (the set changed under the
    # lookup); libnftables does not retry a get, so do it here.
    command = f"get element {element.family} {TABLE} {element.set} {{ {element.key} }}"
    for _ in range(_READ_RETRIES):
        rc, out, err = _context().cmd(command)
        if rc == 0 or not isinstance(_error(err), NftInterrupted):
            break
    if rc != 0 or "elements = {" not in out:
        return None
    found = _COMMENT.search(out)
    return found.group(1) if found else ""


@attrs.frozen
class Found:
    """An element found in pycni's tables by listing them (JSON values as libnftables gives them)."""

    comment: str
    family: str
    set: str
    key: Any
    data: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "set": self.set, "key": self.key, "data": self.data}

    def _elem(self) -> dict[str, Any]:
        return {"family": self.family, "table": TABLE, "name": self.set}

    def drop(self) -> list[dict[str, Any]]:
        value = self.key if self.data is None else [self.key, self.data]
        return [
            {"add": {"element": {**self._elem(), "elem": [value]}}},
            {"delete": {"element": {**self._elem(), "elem": [self.key]}}},
        ]


def _listing() -> list[Found]:
    """Every commented element of pycni's tables (O(n): the GC and fallback path only)."""
    found: list[Found] = []
    ctx = _context()
    for family in FAMILIES:
        rc, out, _ = ctx.json_cmd({"nftables": [{"list": {"table": {"family": family, "name": TABLE}}}]})
        if rc != 0:
            continue
        for obj in out.get("nftables", ()):
            for kind in ("set", "map"):
                body = obj.get(kind)
                for elem in (body or {}).get("elem", ()):
                    key, data = (elem[0], elem[1]) if kind == "map" else (elem, None)
                    if isinstance(key, dict) and "elem" in key and key["elem"].get("comment"):
                        found.append(Found(key["elem"]["comment"], family, body["name"], key["elem"]["val"], data))
    return found


def _search(key: str, owner: str | None = None) -> list[Found]:
    out = []
    for f in _listing():
        parts = f.comment.split(" ")
        if parts[0] == key and (owner is None or (len(parts) > 1 and parts[1] == owner)):
            out.append(f)
    return out


def _remove_found(found: Sequence[Found]) -> None:
    if not found:
        return
    ctx = _context()
    rc, _, _ = ctx.json_cmd({"nftables": [c for f in found for c in f.drop()]})
    if rc != 0:
        for f in found:
            ctx.json_cmd({"nftables": f.drop()})


def attachments(state_dir: str) -> dict[str, dict[str, Any]]:
    """pycni-owned elements grouped by attachment key (for GC/reconcile; O(n)).

    ``{key: {"comment": str, "record": {network, container_id, ifname} | None,
    "elements": {owner: [{"family", "set", "key", "data"}, ...]}}}``; a key with a record but
    no elements is listed too (records: those under ``state_dir``).
    """
    return _groups(_listing(), _records(state_dir))


def _groups(listing: Iterable[Found], records: Records) -> dict[str, dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for f in listing:
        parts = f.comment.split(" ")
        group = groups.setdefault(parts[0], {"comment": f.comment, "record": None, "elements": {}})
        group["elements"].setdefault(parts[1] if len(parts) > 1 else "", []).append(f.to_json())
    for name in records.names():
        rec = records.load(name) if name != _EPOCH else None
        if isinstance(rec, dict):
            group = groups.setdefault(name.split(".", 1)[0], {"comment": "", "record": None, "elements": {}})
            group["record"] = rec.get("attachment")
    return groups


def remove(key: str, *, state_dir: str) -> None:
    """Remove every element and record of the attachment with this key, whatever its owner."""
    _remove_found(_search(key))
    records = _records(state_dir)
    for name in records.names():
        if name != _EPOCH and name.split(".", 1)[0] == key:
            records.remove(name)


# -- appended: whole-table listing and JSON transactions (consul-cni's CHECK, forced cleanup) ------


def list_table(family: str, name: str) -> list[dict[str, Any]] | None:
    """The JSON objects (chains, sets, rules, …) of ``table <family> <name>`` in the calling
    thread's namespace, or ``None`` when there is no such table. For small tables of one owner
    (it lists every element of every set in the table)."""
    rc, out, err = _context().json_cmd({"nftables": [{"list": {"table": {"family": family, "name": name}}}]})
    if rc != 0:
        error = _error(err)
        if isinstance(error, NftNotFound):
            return None
        raise error
    return [obj for obj in (out or {}).get("nftables", ()) if "metainfo" not in obj]


def run_json(commands: Sequence[Mapping[str, Any]]) -> None:
    """Apply libnftables JSON ``commands`` as one transaction; :class:`NftError` on failure."""
    rc, _, err = _context().json_cmd({"nftables": list(commands)})
    if rc != 0:
        raise _error(err)


def _describe(found: Found) -> str:
    value = _json_text(found.key) if found.data is None else f"{_json_text(found.key)} : {_json_text(found.data)}"
    owner = found.comment.split(" ")[1] if " " in found.comment else "?"
    return f"pycni {found.family} {TABLE} {found.set} element {value} ({owner})"


def _json_text(value: Any) -> str:
    """libnftables' JSON value (``"10.0.0.2"``, ``{"concat": [...]}``, …) as short text."""
    if isinstance(value, dict):
        if "concat" in value:
            return " . ".join(_json_text(v) for v in value["concat"])
        if "prefix" in value:
            return f"{value['prefix'].get('addr')}/{value['prefix'].get('len')}"
        if "range" in value:
            return "-".join(_json_text(v) for v in value["range"])
        for verdict in ("goto", "jump"):
            if verdict in value:
                return f"{verdict} {value[verdict].get('target')}"
        return str(value)
    if isinstance(value, list):
        return ", ".join(_json_text(v) for v in value)
    return str(value)


def remove_attachments(match: Callable[[str, dict[str, Any]], bool], what: str, *, state_dir: str) -> list[str]:
    """Remove every element and state record of the attachments whose :func:`attachments`
    group ``match(key, group)`` accepts (any owner), in the calling thread's namespace; returns
    what was removed. ``what`` names them in the error.

    The elements are found by listing pycni's tables (O(n)) and deleted in one transaction
    ("add, then delete", so an element that vanished meanwhile is no error). If that transaction
    fails (another attachment took a key over since), elements are removed one by one, leaving
    alone what is not ours.
    """
    records = _records(state_dir)
    keys = {key for key, group in _groups(_listing(), records).items() if match(key, group)}
    found = [f for f in _listing() if f.comment.split(" ")[0] in keys]
    _remove_found(found)
    left = [f for f in _listing() if f.comment.split(" ")[0] in keys] if found else []
    if left:
        raise NftError(f"could not remove {len(left)} element(s) of {what}", _describe(left[0]))
    removed = [_describe(f) for f in found]
    for name in records.names():
        if name != _EPOCH and name.split(".", 1)[0] in keys and records.remove(name):
            removed.append(f"pycni state record nft/{name}")
    return removed


# -- the skeleton: verified by a kernel-filtered dump, repaired in place ---------------------------
#
# libnftables reads every set element of the table for any "list" of rules (and for deletes and
# replaces), so the rules are read with a plain netlink dump instead (:mod:`.nfnl`): the kernel
# dumps the chains and rules of table pycni alone, which costs the same whatever the sets hold.


def _netlink_dump(family: str) -> dict[str, list[nfnl.Rule]] | None:
    """chain name -> its rules in ``table <family> pycni``; ``None`` when there is no such table.

    The answer is shared (callers must not change it): it is kept in the namespace's memo with
    the ruleset generation it was read at, and given again while the generation is unchanged —
    any committed transaction, whoever made it, changes the generation. The tables, chains and
    rules are three dumps, none of them a snapshot, so they are read again until the generation
    after them is the one before them: the answer is one state of the ruleset, filed under it.
    While other ADDs keep committing (a storm), the last read is answered unfiled after a few
    tries: the skeleton's rules are not what those transactions change.
    """
    memo = _memo()
    try:
        with nfnl.reading(family) as reader:
            generation = reader.generation()
            cached = memo.dumps.get(family)
            if cached is not None and cached[0] == generation:
                return cached[1]
            for _ in range(_READ_RETRIES):
                out: dict[str, list[nfnl.Rule]] | None = None
                if TABLE in reader.tables():
                    out = {name: [] for name in reader.chains(TABLE)}
                    for rule in reader.rules(TABLE):
                        out.setdefault(rule.chain, []).append(rule)
                before, generation = generation, reader.generation()
                if generation == before:
                    memo.dumps[family] = (generation, out)
                    return out
    except nfnl.NetlinkError as e:
        raise NftError(f"cannot read table {family} {TABLE}: {e.strerror}") from None
    return out


def _jump_target(rule: nfnl.Rule) -> str | None:
    return rule.jump


@attrs.frozen
class _Damage:
    section: Section
    problems: tuple[str, ...]
    fix: tuple[str, ...]  # empty: the section is created whole


def _diagnose(section: Section, chains: dict[str, list[Any]] | None) -> _Damage | None:
    where = f"table {section.family} {TABLE}"
    if chains is None:
        return _Damage(section, (f"{where} is missing",), ())
    if section.sentinel not in chains:
        return _Damage(section, (f"chain {section.sentinel} of {where} is missing",), ())
    problems: list[str] = []
    fix: list[str] = []
    by_chain: dict[str, list[str]] = {}
    for chain, command in section.rules():
        by_chain.setdefault(chain, []).append(command)
    for chain, commands in by_chain.items():
        have = chains.get(chain)
        jumps = [c for c in commands if _JUMP.search(c)]
        plain = [c for c in commands if c not in jumps]
        if have is None:
            problems.append(f"chain {chain} of {where} is missing")
            fix += [*plain, *jumps]  # the chain itself comes back with the section's structure
            continue
        targets = [t for t in map(_jump_target, have) if t]
        own = [r for r in have if not _jump_target(r)]
        if len(own) < len(plain):
            problems.append(f"chain {chain} of {where} has {len(own)} of its {len(plain)} rules")
            kept = [t for t in dict.fromkeys(targets) if not any(c.endswith(f" jump {t}") for c in jumps)]
            fix += [f"flush chain {section.family} {TABLE} {chain}", *plain]
            fix += [f"insert rule {section.family} {TABLE} {chain} jump {t}" for t in kept]
            targets = []
        for command in jumps:
            match = _JUMP.search(command)
            assert match is not None  # jumps are the commands _JUMP matches
            target = match.group(1)
            if target not in targets:
                problems.append(f"chain {chain} of {where} has lost its jump to {target}")
                fix.append(command)
    if not problems:
        return None
    return _Damage(section, tuple(problems), (f"add table {section.family} {TABLE}", *section.structure(), *fix))


def _damage(sections: Iterable[Section]) -> list[_Damage]:
    dumps: dict[str, dict[str, list[Any]] | None] = {}
    found = []
    for section in sections:
        if section.family not in dumps:
            dumps[section.family] = _netlink_dump(section.family)
        damage = _diagnose(section, dumps[section.family])
        if damage is not None:
            found.append(damage)
    return found


def skeleton_problems(sections: Iterable[Section]) -> list[str]:
    """What is missing of ``sections`` (tables, chains, rules, admin jumps), for CHECK."""
    return [p for d in _damage(sections) for p in d.problems]


def chains(family: str) -> list[str]:
    """The chains of ``table <family> pycni`` (none when there is no table)."""
    return sorted(_netlink_dump(family) or ())


def repair(sections: Iterable[Section], *, create: bool = True) -> list[str]:
    """Create missing sections and put back lost rules (a chain short of rules is flushed and
    refilled, keeping the admin-chain jumps it has); returns what was wrong. Idempotent, so
    concurrent repairers converge. Sections are handled in the order given. Without
    ``create``, only sections whose sentinel chain exists are repaired."""
    sections = list(sections)
    repaired: list[str] = []
    for attempt in (1, 2):
        try:
            for damage in _damage(sections):
                if damage.fix:
                    run(damage.fix)
                elif create:
                    _create(damage.section)
                else:
                    continue
                repaired += damage.problems
            return repaired
        except NftError:
            if attempt == 2:
                raise  # a concurrent change twice in a row: give up
    return repaired


# -- CHECK: precise about what is missing -----------------------------------------------------------


def _netlink_sets(family: str) -> set[str] | None:
    """The sets and maps of ``table <family> pycni`` (``None``: no such table); no element is read."""
    try:
        with nfnl.reading(family) as reader:
            return reader.sets(TABLE) if TABLE in reader.tables() else None
    except nfnl.NetlinkError as e:
        raise NftError(f"cannot read table {family} {TABLE}: {e.strerror}") from None


def check(attachment: Attachment, elements: Iterable[Element], sections: Iterable[Section] = ()) -> str | None:
    """Why the attachment's ``elements`` and the ``sections`` they need are not all in place
    (the first problem found, as text), or ``None``. O(1) in the number of containers."""
    problems = skeleton_problems(sections)
    if problems:
        return problems[0]
    prefix = attachment.key + " "
    sets: dict[str, set[str] | None] = {}
    for e in elements:
        held = holder(e)
        if held is not None and held.startswith(prefix):
            continue
        kind = "set" if e.data is None else "map"
        where = f"table {e.family} {TABLE}"
        if held is not None:
            owner = " ".join(held.split(" ")[2:]) or "no attachment"
            return f"element {e.key} of {kind} {e.set} of {where} belongs to another attachment ({owner})"
        if e.family not in sets:
            sets[e.family] = _netlink_sets(e.family)
        found = sets[e.family]
        if found is None:
            return f"{where} is missing"
        if e.set not in found:
            return f"{kind} {e.set} of {where} is missing"
        return f"element {e.key} is missing from {kind} {e.set} of {where}"
    return None


# -- GC ---------------------------------------------------------------------------------------------


def _network_of(group: dict[str, Any]) -> str | None:
    record = group.get("record")
    if isinstance(record, dict):
        return record.get("network")
    parts = group.get("comment", "").split(" ")
    return parts[2] if len(parts) > 2 else None


def _who(group: dict[str, Any]) -> str:
    record = group.get("record")
    if isinstance(record, dict):
        return f"{record.get('container_id')}/{record.get('ifname')}"
    parts = group.get("comment", "").split(" ")
    return "/".join(parts[3:5]) if len(parts) > 3 else "an unknown attachment"


def collect(
    network: str, valid: Iterable[tuple[str, str]], owners: Iterable[str], *, state_dir: str, dry_run: bool = False
) -> list[str]:
    """GC: remove the elements and state records, of ``owners``, of every attachment of
    ``network`` whose (container ID, ifname) is not in ``valid``; returns what was (or, with
    ``dry_run``, would be) removed. One listing of pycni's tables (O(n)) and one transaction."""
    keep = {Attachment(network, cid, ifname).key for cid, ifname in valid}
    wanted = set(owners)
    doomed: list[Found] = []
    store = _records(state_dir)
    records: list[str] = []
    described: list[str] = []
    listing = _listing()
    groups = _groups(listing, store)
    for key, group in groups.items():
        if key in keep or _network_of(group) != network:
            continue
        who = _who(group)
        for f in listing:
            parts = f.comment.split(" ")
            if parts[0] == key and len(parts) > 1 and parts[1] in wanted:
                doomed.append(f)
                described.append(f"{_describe(f)} of {who}")
        for owner in wanted:
            name = f"{key}.{owner}"
            if store.load(name) is not None:
                records.append(name)
                described.append(f"pycni state record nft/{name} of {who}")
    if not dry_run:
        _remove_found(doomed)
        for name in records:
            store.remove(name)
    return described


def gc(
    network: str,
    valid: Iterable[tuple[str, str]],
    owners: Sequence[str],
    sections_for: Callable[[str, list[Element]], Iterable[Section]],
    skeleton: Callable[[], Iterable[Section]] | None,
    *,
    state_dir: str,
    dry_run: bool = False,
) -> list[str]:
    """One plugin's nftables GC: :func:`collect` the elements of ``owners`` that no valid
    attachment of ``network`` holds; unless ``dry_run``, :func:`restore` the valid attachments'
    lost elements (``sections_for(owner, elements)``) and :func:`repair` the ``skeleton()``
    sections that exist. Returns what was removed, restored and repaired."""
    valid = list(valid)
    removed = collect(network, valid, owners, state_dir=state_dir, dry_run=dry_run)
    if dry_run:
        return removed
    for owner in owners:
        removed += restore(network, valid, owner, lambda e, o=owner: sections_for(o, e), state_dir=state_dir)
    if skeleton is not None:
        removed += [f"repaired: {p}" for p in repair(skeleton(), create=False)]
    return removed


def restore(
    network: str,
    valid: Iterable[tuple[str, str]],
    owner: str,
    sections_for: Any,
    *,
    state_dir: str,
) -> list[str]:
    """GC's repair: put back the recorded elements, of ``owner``, of the valid attachments of
    ``network`` that are missing from the table (someone deleted or flushed it); returns what
    was restored. ``sections_for(elements)`` names the sections they need (created if missing).
    An element whose key someone else holds now is left alone (reported as not restored)."""
    keep = {Attachment(network, cid, ifname).key for cid, ifname in valid}
    out: list[str] = []
    records = _records(state_dir)
    names = [n for n in records.names() if n.partition(".")[2] == owner and n.partition(".")[0] in keep]
    present: dict[str, int] = {}
    if names:
        for f in _listing():  # one listing tells which attachments have all their elements
            parts = f.comment.split(" ")
            if len(parts) > 1 and parts[1] == owner:
                present[parts[0]] = present.get(parts[0], 0) + 1
    for name in names:
        key = name.partition(".")[0]
        rec = records.load(name)
        if not isinstance(rec, dict) or not isinstance(rec.get("attachment"), dict):
            continue
        att = Attachment(**rec["attachment"])
        if att.network != network:
            continue
        elements = [Element.from_json(r) for r in rec.get("elements", ())]
        if present.get(key, 0) >= len(elements):
            continue
        missing_ = [e for e in elements if holder(e) is None]
        if not missing_:
            continue
        who = f"{att.container_id}/{att.ifname}"
        try:
            ensure(sections_for(missing_), force=True)
            _reclaim(records)
            run([e.add(comment(att, owner)) for e in missing_])
        except NftError as e:
            out.append(f"could not restore {len(missing_)} {owner} element(s) of {who}: {e.msg}")
            continue
        out += [f"restored {e.family} {TABLE} {e.set} element {e.key} ({owner}) of {who}" for e in missing_]
    return out

"""Who owns which element: the comment each element carries, the records under the state dir, and
the epoch that tells whether those records describe the table at hand.

Each element carries a :class:`Comment` naming its attachment and owner, and each (attachment,
owner) has a record listing its elements. DEL reads the record, so it removes exactly what ADD
added, in O(1), even when the runtime passes no port mappings, no netns or no prevResult.
Without a record (state dir lost, or a second DEL) it falls back to a search by comment, O(n)
but also finding orphans.

**The state dir claims one table instance** (the ``epoch`` token, in the dir and in ``set inet
pycni epoch``): only then does DEL trust a missing record. A state dir claims a table only when
no other did (a lost state dir must not vouch for elements it has no record of), and claims it
again when the table had to be rebuilt.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs

from pycni.sdk import Attachment

from ..state import Records
from .transport import (
    READ_RETRIES,
    TABLE,
    VERIFY_EVERY,
    NftInterrupted,
    NftNotFound,
    context,
    error,
    memo,
    run,
    settled,
)

__all__ = [
    "Comment",
    "comment",
    "Element",
    "holder",
    "holds",
    "records",
    "record_name",
    "filed",
    "load",
    "TORN",
    "save",
    "saver",
    "owned",
    "claim",
    "claim_first",
    "reclaim",
    "authoritative",
]

EPOCH = "epoch"
_COMMENT_MAX = 127
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/@+=-]")
_COMMENT = re.compile(r'comment "([^"]*)"')


@attrs.frozen
class Comment:
    """The comment on an element: ``<key> <owner> <network> <containerID> <ifname>``.

    ``key`` hashes the (network, container ID, ifname) triple and comes first, so nft's length
    limit, which cuts the text, never loses it; the rest is for a reader, in nft-safe
    characters. Fields the text does not reach are ``None``; the last one takes the rest.
    """

    key: str
    owner: str | None = None
    network: str | None = None
    container_id: str | None = None
    ifname: str | None = None

    @classmethod
    def of(cls, attachment: Attachment, owner: str) -> Comment:
        parts = (attachment.key, owner, attachment.network, attachment.container_id, attachment.ifname)
        return cls(*(_UNSAFE.sub("_", p) for p in parts))

    @classmethod
    def parse(cls, text: str) -> Comment:
        """The one reader of the format (``""``, an uncommented element, has an empty key)."""
        return cls(*text.split(" ", 4))

    def __str__(self) -> str:
        fields = (self.key, self.owner, self.network, self.container_id, self.ifname)
        return " ".join(f for f in fields if f is not None)[:_COMMENT_MAX]

    def names(self, attachment: Attachment) -> bool:
        """Whether this is the comment of one of ``attachment``'s elements (any owner)."""
        return self.owner is not None and self.key == attachment.key

    @property
    def label(self) -> str:
        """The attachment as the comment names it: network, container ID, ifname (as far as present)."""
        return " ".join(f for f in (self.network, self.container_id, self.ifname) if f is not None)


def comment(attachment: Attachment, owner: str) -> str:
    """The comment an ``owner``'s element carries (:class:`Comment`), within nft's length."""
    return str(Comment.of(attachment, owner))


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


def holder(element: Element) -> str | None:
    """The comment of the element holding ``element``'s key (``""`` if uncommented), or ``None``."""
    # libnftables 1.0.6 prints nothing for "get element" in JSON mode, so read the text form.
    # A concurrent transaction makes the kernel answer EINTR (the set changed under the
    # lookup); libnftables does not retry a get, so do it here.
    command = f"get element {element.family} {TABLE} {element.set} {{ {element.key} }}"
    for _ in range(READ_RETRIES):
        rc, out, err = context().cmd(command)
        if rc == 0 or not isinstance(error(err), NftInterrupted):
            break
    if rc != 0 or "elements = {" not in out:
        return None
    found = _COMMENT.search(out)
    return found.group(1) if found else ""


def holds(attachment: Attachment, element: Element) -> bool:
    """Whether ``element``'s key is there as ``attachment``'s (O(n) in its set: ``get element``)."""
    held = holder(element)
    return held is not None and Comment.parse(held).names(attachment)


# -- records under the state dir --------------------------------------------------------------------


def records(state_dir: str) -> Records:
    return Records("nft", state_dir)


def record_name(attachment: Attachment, owner: str) -> str:
    return f"{attachment.key}.{owner}"


def filed(store: Records) -> Iterator[tuple[str, str, str]]:
    """``(name, attachment key, owner)`` of every attachment record (the epoch is not one)."""
    for name in store.names():
        if name != EPOCH:
            key, _, owner = name.partition(".")
            yield name, key, owner


#: What :func:`load` gives for a record that is there but does not read (torn by a power cut,
#: see :mod:`..state`): which elements it listed is unknown.
TORN: tuple[list[Element], list[Element]] = ([], [])


def load(store: Records, attachment: Attachment, owner: str) -> tuple[list[Element], list[Element]] | None:
    """The attachment's confirmed and pending elements, ``None`` (no record) or :data:`TORN`.

    ADD records its new elements as pending before the commit and confirms them after.
    """
    rec = store.load(record_name(attachment, owner), torn=TORN)
    if rec is None or rec is TORN:
        return rec
    return [Element.from_json(r) for r in rec.get("elements", ())], [
        Element.from_json(r) for r in rec.get("pending", ())
    ]


def save(
    store: Records,
    attachment: Attachment,
    owner: str,
    elements: Iterable[Element],
    pending: Iterable[Element] = (),
    *,
    sections: Iterable[tuple[str, str]] = (),
    shared: Iterable[Element] = (),
) -> None:
    """Write the record: the confirmed ``elements``, the ``pending`` ones, and what a heal needs
    to put them back without the plugin's config (:func:`~.listing.restore_all`): the
    ``sections`` they need, as (family, sentinel chain), the ``shared`` elements of their ADD,
    and the cookie of the namespace whose table holds them (a state dir may serve several).
    The state dir's first record is written after :func:`claim_first`."""
    saver(store, attachment, owner, sections=sections, shared=shared)(elements, pending)


def saver(
    store: Records,
    attachment: Attachment,
    owner: str,
    *,
    sections: Iterable[tuple[str, str]] = (),
    shared: Iterable[Element] = (),
) -> Callable[[Iterable[Element], Iterable[Element]], None]:
    """:func:`save` for records written one after the other in one namespace (an ADD's pending
    and confirmed ones): the name and all but the elements are worked out once."""
    name = record_name(attachment, owner)
    head: dict[str, Any] = {"attachment": attrs.asdict(attachment), "owner": owner}
    tail: dict[str, Any] = {}
    needs = [list(s) for s in sections]
    if needs:
        tail["sections"] = needs
    extra = [e.to_json() for e in shared]
    if extra:
        tail["shared"] = extra
    cookie = memo().cookie
    if cookie is not None:
        tail["netns"] = cookie

    def write(elements: Iterable[Element], pending: Iterable[Element]) -> None:
        record = {**head, "elements": [e.to_json() for e in elements]}
        if pending:
            record["pending"] = [e.to_json() for e in pending]
        record.update(tail)
        store.store(name, record)

    return write


def owned(attachment: Attachment, loaded: tuple[list[Element], list[Element]] | None) -> list[Element]:
    """A record's confirmed elements, and its pending ones that carry the attachment's comment
    (left by an ADD killed between its commit and the confirmation: rare, so ``holder`` is fine).
    A pending element without it may be another attachment's: DEL must not take it."""
    if loaded is None:
        return []
    return [*loaded[0], *(e for e in loaded[1] if holds(attachment, e))]


# -- the epoch: whether a state dir's records describe this table instance --------------------------


def _epoch(store: Records) -> str | None:
    rec = store.load(EPOCH)
    return rec if isinstance(rec, str) else None


def _epoch_element(token: str) -> Element:
    return Element(EPOCH, f'"{token}"')


def _epoch_tokens() -> list[str] | None:
    """The tokens in ``set inet pycni epoch`` (``None``: no such set). One tiny set is listed."""
    rc, out, _ = context().json_cmd(
        {"nftables": [{"list": {"set": {"family": "inet", "table": TABLE, "name": EPOCH}}}]}
    )
    if rc != 0:
        return None
    for obj in (out or {}).get("nftables", ()):
        if "set" in obj:
            return [e if isinstance(e, str) else str(e.get("elem", {}).get("val")) for e in obj["set"].get("elem", ())]
    return []


def claim(store: Records) -> None:
    """First record in this state dir: tie the dir to this table instance (see :func:`authoritative`),
    unless another state dir already claimed the table: then its elements may be recorded
    elsewhere, and this dir never becomes authoritative (DEL without a record searches)."""
    token = secrets.token_hex(7)
    if not store.create(EPOCH, token):
        if _epoch(store) is not None:
            return  # a concurrent first writer won; its token stands
        # A power cut left it torn (records are not fsync'd): the table it named is gone, and
        # the one here is claimed below only if nobody has claimed it meanwhile.
        store.store(EPOCH, token)
    if _epoch_tokens():
        return
    run([f"add table inet {TABLE}", f"add set inet {TABLE} {EPOCH} {{ type ifname; }}", _epoch_element(token).add()])
    memo().authoritative.clear()


#: When this process last saw each state dir's epoch (by root), so that claim_first reads it at
#: most once per VERIFY_EVERY (a state dir's token is trusted for as long: see authoritative).
#: A look skipped can only delay a claim, which never made a dir authoritative by itself: a claim
#: takes a table only nobody has claimed, and a table rebuilt meanwhile is reclaimed by apply.
_epoch_seen: dict[str, float] = {}


def claim_first(store: Records) -> None:
    """Before a record is written: :func:`claim` the table unless the state dir has done so."""
    now = time.monotonic()
    if now - _epoch_seen.get(store.root, -math.inf) < VERIFY_EVERY:
        return
    if _epoch(store) is None:  # none yet, or one a power cut left torn
        claim(store)
    _epoch_seen[store.root] = now


def reclaim(store: Records) -> None:
    """After the skeleton had to be rebuilt: when the table's epoch set is gone or empty (a new
    table instance nobody claimed), every element in it was added since, with a record in this
    state dir, so the dir's token is put back and DEL may trust a missing record again."""
    token = _epoch(store)
    if token is None or holder(_epoch_element(token)) is not None or _epoch_tokens():
        return
    try:
        run([f"add set inet {TABLE} {EPOCH} {{ type ifname; }}", _epoch_element(token).add()])
    except NftNotFound:
        return  # no inet table yet (only the bridge family's was rebuilt): its creator reclaims
    memo().authoritative.clear()


def authoritative(store: Records) -> bool:
    """Whether the state dir's records describe this table: then a missing record means "no
    elements" (a repeated DEL) and the O(n) search by comment can be skipped. The first record
    written to a state dir puts a random token both in the dir and in ``set inet pycni epoch``;
    a lost state dir, or a table rebuilt behind our back, breaks the pair."""
    # Remembered per namespace while the ruleset changes only by pycni's element transactions
    # (transport.settled): every DEL asks for each owner, and the kernel's side of the answer
    # only changes when someone rebuilds the table. The state dir's side (its token: a replaced
    # dir has another, or none) is read again once VERIFY_EVERY has passed.
    shared, at = settled()
    now = time.monotonic()
    cached = shared.authoritative.get(store.root)
    if cached is not None and now - cached[0] < VERIFY_EVERY:
        return cached[2]
    token = _epoch(store)
    if token is None:
        return False
    if cached is not None and cached[1] == token:
        answer = cached[2]
    else:
        answer = holder(_epoch_element(token)) is not None
    shared.learned(at, authority=(store.root, (now, token, answer)))
    return answer

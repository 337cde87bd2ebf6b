"""An attachment's elements: added (ADD), removed (DEL), looked up (CHECK), each one transaction.

**Deleting is "add, then delete" in one transaction.** nftables 1.0.6 has no ``destroy``: a
plain delete of a missing element fails the batch. Adding the element first makes the pair a
no-op when it is already gone, and when a *different* attachment now holds the key (a map
element with other data), the add fails with EEXIST and nothing of theirs is touched. With the
*same* data, or in a plain set, the pair would delete the other holder's element, so a record
only ever lists elements this attachment created.

**An element is never taken from another attachment.** ADD creates its elements with ``create
element`` (EEXIST when the key is there at all, whoever holds it, whatever the data): an ADD
whose addresses or host ports another attachment holds, even a stale one, is refused with
nothing changed (:class:`~.transport.ElementConflict` names the holder; its DEL, or GC, removes
it). Only an element this attachment's own record lists is re-used (a repeated ADD, which finds
its own elements by their comment after the EEXIST, so only then at O(n) per set).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pycni.failpoints import failpoint
from pycni.sdk import Attachment

from ..state import Records
from .listing import remove_found, search
from .ownership import (
    TORN,
    Comment,
    Element,
    authoritative,
    claim_first,
    comment,
    holder,
    holds,
    load,
    owned,
    reclaim,
    record_name,
    records,
    save,
    saver,
)
from .skeleton import Section, ensure
from .transport import ElementConflict, NftError, run, table

__all__ = ["apply", "release", "missing"]


def _drop(elements: Iterable[Element]) -> list[str]:
    out = []
    for e in elements:
        out += [e.add(), e.delete()]
    return out


def _probe(elements: Iterable[Element]) -> list[str]:
    return [c for e in elements for c in (e.create("probe"), e.delete())]


def _commit(commands: list[str], sections: Sequence[Section], store: Records) -> None:
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
        reclaim(store)
        run(commands)


def _conflict(attachment: Attachment, elements: Iterable[Element]) -> ElementConflict | None:
    """The first of ``elements`` held by another attachment (an error naming it), else ``None``.
    O(n) per set (``get element``): only after a transaction failed with EEXIST."""
    for e in elements:
        held = holder(e)
        if held is None:
            continue
        parsed = Comment.parse(held)
        if not parsed.names(attachment):
            who = parsed.label or "an element without an owner"
            kind = "set" if e.data is None else "map"
            error = ElementConflict(
                f"element {e.key} of {kind} {e.set} of {table(e.family)} belongs to another attachment ({who})"
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
) -> list[Element] | None:
    """Make ``elements`` the attachment's elements for ``owner``, in one transaction, with the
    record under ``state_dir``; returns the ones it held before (``None``: no record), which an
    ADD undoing itself after the commit puts back.

    Elements recorded by an earlier ADD of the same attachment and not wanted now are removed
    in the same transaction. The record is written before the commit (the new elements as
    pending), so a crash in between can leak nothing a later DEL would not find. ``shared``
    elements (e.g. a bridge's isolation entries) are added in the same transaction but belong
    to no attachment: they are neither recorded nor commented, and no DEL removes them. A
    wanted element another attachment holds refuses the whole ADD (:class:`ElementConflict`),
    nothing changed; so does an ``absent`` element's key (probed in the same transaction by
    "create, delete": EEXIST when anyone holds it) held by another attachment.
    """
    store = records(state_dir)
    if sections and ensure(sections):  # one read of the generation while nobody else changed the ruleset
        reclaim(store)  # the table may have been rebuilt
    loaded = load(store, attachment, owner)
    old = owned(attachment, loaded)
    wanted = list(dict.fromkeys(elements))
    stale = [e for e in old if e not in wanted]
    needs = [(s.family, s.sentinel) for s in sections]
    kept = [*stale, *(e for e in wanted if e in old)]
    claim_first(store)  # a state dir's first record claims the table
    write = saver(store, attachment, owner, sections=needs, shared=shared)
    write(kept, [e for e in wanted if e not in old])
    failpoint(f"nft.apply.{owner}.after-record")
    text = comment(attachment, owner)
    extra = [e.add() for e in shared]
    keys = {(e.family, e.set, e.key) for e in wanted}
    probes = [e for e in absent if (e.family, e.set, e.key) not in keys]
    try:
        try:
            _commit([*_drop(stale), *(e.create(text) for e in wanted), *_probe(probes), *extra], sections, store)
        except ElementConflict:
            conflict = _conflict(attachment, [*wanted, *probes])
            if conflict is not None:
                raise conflict from None
            # Every key that is there is ours already (a repeated ADD): keep those.
            ours = {e for e in [*wanted, *probes] if holds(attachment, e)}
            again = [e.add(text) if e in ours else e.create(text) for e in wanted]
            _commit([*_drop(stale), *again, *_probe([e for e in probes if e not in ours]), *extra], sections, store)
    except BaseException:
        if loaded is not None:
            save(store, attachment, owner, *loaded)
        else:
            store.remove(record_name(attachment, owner))
        raise
    write(wanted, ())
    return None if loaded is None or loaded is TORN else old


def release(owner: str, attachment: Attachment, *, state_dir: str) -> None:
    """Remove the attachment's elements for ``owner``; a no-op when there are none."""
    store = records(state_dir)
    loaded = load(store, attachment, owner)
    if loaded is None or loaded is TORN:
        # What a torn record listed is unknown: its elements are searched for as without a state dir.
        if loaded is TORN or not authoritative(store):
            remove_found(search(attachment.key, owner))
        if loaded is TORN:
            store.remove(record_name(attachment, owner))
        return
    # Pending elements only if ours: the ADD may have been killed before its commit.
    elements = owned(attachment, loaded)
    if elements:
        try:
            run(_drop(elements))
        except NftError:
            # The table or a set is gone, or another attachment holds one of the keys now:
            # go element by element and leave alone what is not ours.
            for e in elements:
                try:
                    run(_drop([e]))
                except NftError:
                    continue
    failpoint(f"nft.release.{owner}.after-commit")
    store.remove(record_name(attachment, owner))


def missing(attachment: Attachment, elements: Iterable[Element]) -> list[Element]:
    """The ``elements`` not present as this attachment's (for CHECK; O(n) per set)."""
    return [e for e in elements if not holds(attachment, e)]

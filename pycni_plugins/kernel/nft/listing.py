"""Elements found by listing pycni's tables, and the GC built on them: O(n) in the elements, so
only for GC, forced cleanup and a DEL without a record; each operation lists the tables once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from pycni.sdk import Attachment

from ..state import Records
from .ownership import Comment, Element, comment, filed, holder, reclaim, records
from .skeleton import Section, ensure, repair
from .transport import FAMILIES, TABLE, ElementConflict, NftError, NftNotFound, context, error, memo, run, settled

__all__ = [
    "Found",
    "map_elements",
    "attachments",
    "remove",
    "remove_attachments",
    "collect",
    "gc",
    "restore",
    "restore_all",
    "search",
    "remove_found",
]


@attrs.frozen
class Found:
    """An element found in pycni's tables by listing them (JSON values as libnftables gives them)."""

    comment: str
    family: str
    set: str
    key: Any
    data: Any = None

    @property
    def parsed(self) -> Comment:
        return Comment.parse(self.comment)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "set": self.set, "key": self.key, "data": self.data}

    def _elem(self) -> dict[str, Any]:
        return {"family": self.family, "table": TABLE, "name": self.set}

    def drop(self) -> list[dict[str, Any]]:
        """Its removal as "add, then delete": a no-op when the element is gone already."""
        value = self.key if self.data is None else [self.key, self.data]
        return [
            {"add": {"element": {**self._elem(), "elem": [value]}}},
            {"delete": {"element": {**self._elem(), "elem": [self.key]}}},
        ]

    def describe(self) -> str:
        value = _json_text(self.key) if self.data is None else f"{_json_text(self.key)} : {_json_text(self.data)}"
        owner = self.parsed.owner
        return f"pycni {self.family} {TABLE} {self.set} element {value} ({'?' if owner is None else owner})"


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


def _commented(family: str, kind: str, body: dict[str, Any]) -> list[Found]:
    found = []
    for elem in body.get("elem", ()):
        key, data = (elem[0], elem[1]) if kind == "map" else (elem, None)
        if isinstance(key, dict) and "elem" in key and key["elem"].get("comment"):
            found.append(Found(key["elem"]["comment"], family, body["name"], key["elem"]["val"], data))
    return found


def _listing() -> list[Found]:
    """Every commented element of pycni's tables."""
    found: list[Found] = []
    ctx = context()
    for family in FAMILIES:
        rc, out, _ = ctx.json_cmd({"nftables": [{"list": {"table": {"family": family, "name": TABLE}}}]})
        if rc != 0:
            continue
        for obj in out.get("nftables", ()):
            for kind in ("set", "map"):
                if obj.get(kind):
                    found += _commented(family, kind, obj[kind])
    return found


def map_elements(family: str, name: str) -> list[Found]:
    """The commented elements of one map of pycni's table. O(its size): no other set is read
    (for small maps, such as the host-IP-specific host ports). A map found without any is
    not listed again while the ruleset changes only by our own transactions that leave it
    alone (:class:`~.transport.Memo`'s ``bare``)."""
    shared, at = settled()
    if (family, name) in shared.bare:
        return []
    command = {"nftables": [{"list": {"map": {"family": family, "table": TABLE, "name": name}}}]}
    rc, out, _ = context().json_cmd(command)
    found: list[Found] = []
    for obj in (out or {}).get("nftables", ()) if rc == 0 else ():
        found += _commented(family, "map", obj.get("map") or {})
    if rc == 0 and not found:
        shared.learned(at, bare=[(family, name)])
    return found


def search(key: str, owner: str | None = None) -> list[Found]:
    """The elements of the attachment with this key (of ``owner``, or any)."""
    out = []
    for f in _listing():
        parsed = f.parsed
        if parsed.key == key and (owner is None or parsed.owner == owner):
            out.append(f)
    return out


def remove_found(found: Sequence[Found]) -> list[Found]:
    """Remove ``found`` in one transaction, else one by one; returns those whose removal failed
    with anything but "another attachment holds the key now" or "its set is gone"."""
    if not found:
        return []
    ctx = context()
    rc, _, _ = ctx.json_cmd({"nftables": [c for f in found for c in f.drop()]})
    if rc == 0:
        return []
    failed = []
    for f in found:
        rc, _, err = ctx.json_cmd({"nftables": f.drop()})
        if rc != 0 and not isinstance(error(err), (ElementConflict, NftNotFound)):
            failed.append(f)
    return failed


def attachments(state_dir: str) -> dict[str, dict[str, Any]]:
    """pycni-owned elements grouped by attachment key (for GC/reconcile; O(n)).

    ``{key: {"comment": str, "record": {network, container_id, ifname} | None,
    "elements": {owner: [{"family", "set", "key", "data"}, ...]}}}``; a key with a record but
    no elements is listed too (records: those under ``state_dir``).
    """
    return _groups(_listing(), records(state_dir))


def _groups(listing: Iterable[Found], store: Records) -> dict[str, dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for f in listing:
        parsed = f.parsed
        group = groups.setdefault(parsed.key, {"comment": f.comment, "record": None, "elements": {}})
        group["elements"].setdefault(parsed.owner or "", []).append(f.to_json())
    for name, key, _ in filed(store):
        rec = store.load(name)
        if isinstance(rec, dict):
            group = groups.setdefault(key, {"comment": "", "record": None, "elements": {}})
            group["record"] = rec.get("attachment")
    return groups


def remove(key: str, *, state_dir: str) -> None:
    """Remove every element and record of the attachment with this key, whatever its owner."""
    remove_found(search(key))
    store = records(state_dir)
    for name, of, _ in filed(store):
        if of == key:
            store.remove(name)


def remove_attachments(match: Callable[[str, dict[str, Any]], bool], what: str, *, state_dir: str) -> list[str]:
    """Remove every element and state record of the attachments whose :func:`attachments`
    group ``match(key, group)`` accepts (any owner), in the calling thread's namespace; returns
    what was removed. ``what`` names them in the error.

    One listing of pycni's tables (O(n)), then one transaction ("add, then delete", so an
    element that vanished meanwhile is no error). If that fails (another attachment took a key
    over since), elements are removed one by one, leaving alone what is not ours; one that
    resists for any other reason is the error.
    """
    store = records(state_dir)
    listing = _listing()
    keys = {key for key, group in _groups(listing, store).items() if match(key, group)}
    found = [f for f in listing if f.parsed.key in keys]
    left = remove_found(found)
    if left:
        raise NftError(f"could not remove {len(left)} element(s) of {what}", left[0].describe())
    removed = [f.describe() for f in found]
    for name, key, _ in filed(store):
        if key in keys and store.remove(name):
            removed.append(f"pycni state record nft/{name}")
    return removed


def _network_of(group: dict[str, Any]) -> str | None:
    record = group.get("record")
    if isinstance(record, dict):
        return record.get("network")
    return Comment.parse(group.get("comment", "")).network


def _who(group: dict[str, Any]) -> str:
    record = group.get("record")
    if isinstance(record, dict):
        return f"{record.get('container_id')}/{record.get('ifname')}"
    parsed = Comment.parse(group.get("comment", ""))
    if parsed.container_id is None:
        return "an unknown attachment"
    return parsed.container_id if parsed.ifname is None else f"{parsed.container_id}/{parsed.ifname}"


def collect(
    network: str, valid: Iterable[tuple[str, str]], owners: Iterable[str], *, state_dir: str, dry_run: bool = False
) -> list[str]:
    """GC: remove the elements and state records, of ``owners``, of every attachment of
    ``network`` whose (container ID, ifname) is not in ``valid``; returns what was (or, with
    ``dry_run``, would be) removed. One listing of pycni's tables (O(n)) and one transaction."""
    keep = {Attachment(network, cid, ifname).key for cid, ifname in valid}
    wanted = set(owners)
    doomed: list[Found] = []
    store = records(state_dir)
    doomed_records: list[str] = []
    described: list[str] = []
    listing = _listing()
    for key, group in _groups(listing, store).items():
        if key in keep or _network_of(group) != network:
            continue
        who = _who(group)
        for f in listing:
            parsed = f.parsed
            if parsed.key == key and parsed.owner in wanted:
                doomed.append(f)
                described.append(f"{f.describe()} of {who}")
        for owner in wanted:
            name = f"{key}.{owner}"
            if store.load(name) is not None:
                doomed_records.append(name)
                described.append(f"pycni state record nft/{name} of {who}")
    if not dry_run:
        remove_found(doomed)
        for name in doomed_records:
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
    lost elements (``sections_for(owner, elements)``) and :func:`~.skeleton.repair` the
    ``skeleton()`` sections that exist. Returns what was removed, restored and repaired."""
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
    store = records(state_dir)
    chosen = []
    for name, key, of in filed(store):
        if of != owner or key not in keep:
            continue
        rec = _record(store, name)
        if rec is not None and rec[0].network == network:
            chosen.append((key, owner, *rec))
    return _put_back(store, chosen, lambda _, missing: sections_for(missing))


#: A record as :func:`_put_back` takes it: (key, owner, attachment, elements, raw record).
_Chosen = tuple[str, str, Attachment, list[Element], dict[str, Any]]


def _record(store: Records, name: str) -> tuple[Attachment, list[Element], dict[str, Any]] | None:
    rec = store.load(name)
    if not isinstance(rec, dict) or not isinstance(rec.get("attachment"), dict):
        return None
    try:
        return Attachment(**rec["attachment"]), [Element.from_json(r) for r in rec.get("elements", ())], rec
    except (TypeError, ValueError):
        return None


def _put_back(
    store: Records, chosen: Sequence[_Chosen], sections_for: Callable[[str, list[Element]], Iterable[Section]]
) -> list[str]:
    """Add back the missing recorded elements of the ``chosen`` records, each attachment's in
    one transaction (after ensuring ``sections_for(owner, missing)``); one listing of the tables
    tells which attachments are short. Returns what was (or could not be) restored."""
    out: list[str] = []
    present: dict[tuple[str, str], int] = {}
    if chosen:
        for f in _listing():  # tells which attachments have all their elements
            parsed = f.parsed
            present[(parsed.key, parsed.owner or "")] = present.get((parsed.key, parsed.owner or ""), 0) + 1
    for key, owner, att, elements, _ in chosen:
        have = present.get((key, owner), 0)
        if have >= len(elements):
            continue
        text = comment(att, owner)
        who = f"{att.container_id}/{att.ifname}"
        missing = None
        if have == 0:  # none of them there (a flushed table): no lookup, unless a key is taken
            try:
                ensure(sections_for(owner, elements), force=True)
                reclaim(store)
                run([e.create(text) for e in elements])
                missing = elements
            except ElementConflict:
                pass
            except NftError as e:
                out.append(f"could not restore {len(elements)} {owner} element(s) of {who}: {e.msg}")
                continue
        if missing is None:
            missing = [e for e in elements if holder(e) is None]
            if not missing:
                continue
            try:
                ensure(sections_for(owner, missing), force=True)
                reclaim(store)
                run([e.add(text) for e in missing])
            except NftError as e:
                out.append(f"could not restore {len(missing)} {owner} element(s) of {who}: {e.msg}")
                continue
        out += [f"restored {e.family} {TABLE} {e.set} element {e.key} ({owner}) of {who}" for e in missing]
    return out


def restore_all(
    state_dir: str, sections_for: Callable[[str, list[Element], list[tuple[str, str]]], Iterable[Section]]
) -> list[str]:
    """Heal the calling thread's namespace after someone flushed or deleted pycni's tables:
    repair the skeleton every record under ``state_dir`` needs and put back every recorded
    element that is missing, whatever the network, with no plugin config — each record names
    the sections its elements need (``sections_for(owner, elements, recorded sections)`` turns
    them into :class:`Section` s) and the shared elements its ADD added. A record of another
    namespace's table (the namespace cookie it names is not this one's) is left alone. Returns
    what was repaired and restored (nothing when nothing recorded is missing)."""
    store = records(state_dir)
    here = memo().cookie
    chosen: list[_Chosen] = []
    sections: list[Section] = []
    shared: list[Element] = []
    for name, key, owner in filed(store):
        rec = _record(store, name)
        if rec is None:
            continue
        att, elements, raw = rec
        if here is not None and raw.get("netns", here) != here:
            continue
        chosen.append((key, owner, att, elements, raw))
        named = [(str(s[0]), str(s[1])) for s in raw.get("sections", ()) if isinstance(s, list) and len(s) == 2]
        for section in sections_for(owner, elements, named):
            if section not in sections:
                sections.append(section)
        shared += [Element.from_json(r) for r in raw.get("shared", ())]
    if not chosen:
        return []
    out = [f"repaired: {p}" for p in dict.fromkeys(repair(sections))]
    if out:
        reclaim(store)
    out += _put_back(store, chosen, lambda owner, missing: ())
    if out and shared:
        try:
            run([e.add() for e in dict.fromkeys(shared)])
        except NftError as e:
            out.append(f"could not restore {len(shared)} shared element(s): {e.msg}")
    return out

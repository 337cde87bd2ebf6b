"""The fixed rules every container's elements are looked up by: created lazily, verified, repaired.

A :class:`Section` (chains, sets, maps and rules that belong together) is created by one
transaction that starts with ``create chain <sentinel>``; if a concurrent caller created it
first, the sentinel's EEXIST rolls ours back whole. Before an ADD's transaction the sections are
verified, unless the namespace's ruleset generation shows that nothing but pycni's own element
transactions happened since they last were, whichever thread verified them (see
:class:`~.transport.Memo`: one ~0.01 ms read). So a table deleted or flushed behind our back
(``nft flush ruleset``, a firewall reload) is rebuilt, and lost rules are put back, by the very
next ADD. CHECK reports such damage precisely.

libnftables reads every set element of the table for any "list" of rules (and for deletes and
replaces), so the rules are read with a plain netlink dump instead (:mod:`..nfnl`): the kernel
dumps the chains and rules of table pycni alone, which costs the same whatever the sets hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import attrs

from pycni.sdk import Attachment

from .. import nfnl
from .ownership import Comment, Element, holder
from .transport import READ_RETRIES, TABLE, ElementConflict, NftError, memo, run, settled, table

__all__ = ["Section", "ensure", "repair", "skeleton_problems", "chains", "check", "reconcile_hint", "hinted"]

_RULE = re.compile(r"(?:add|insert) rule (\S+) \S+ (\S+) ")
_JUMP = re.compile(r" jump (\S+)$")


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


def ensure(sections: Iterable[Section], *, force: bool = False) -> list[str]:
    """Make each section whole: created unless its sentinel chain exists (concurrent creators
    are fine), its lost rules put back (:func:`repair`); returns what was wrong.

    Sections verified in this namespace, by any thread, with no change to the ruleset since but
    pycni's element transactions, are skipped unless ``force`` (:func:`~.transport.settled`); a
    verification is one kernel-filtered dump of pycni's chains and rules (no set element is
    read), so it costs the same whatever the sets hold.
    """
    sections = list(sections)
    repaired: list[str] = []
    for _ in range(2):  # a second look after a repair, so that the repaired sections are known whole
        shared, at = settled()
        due = [s for s in sections if force or (s.family, s.sentinel) not in shared.ensured]
        if not due:
            break
        found = repair(due)
        if not found:
            shared.learned(at, sections=[(s.family, s.sentinel) for s in due])
            break
        repaired += found
        force = False
    return repaired


def _create(s: Section) -> None:
    spec = f" {s.spec}" if s.spec else ""
    try:
        run([f"add table {s.family} {TABLE}", f"create chain {s.family} {TABLE} {s.sentinel}{spec}", *s.body])
    except ElementConflict:
        pass  # a concurrent creator won


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
    shared = memo()
    try:
        with nfnl.reading(family) as reader:
            generation = reader.generation()
            cached = shared.dumps.get(family)
            if cached is not None and cached[0] == generation:
                return cached[1]
            for _ in range(READ_RETRIES):
                out: dict[str, list[nfnl.Rule]] | None = None
                if TABLE in reader.tables():
                    out = {name: [] for name in reader.chains(TABLE)}
                    for rule in reader.rules(TABLE):
                        out.setdefault(rule.chain, []).append(rule)
                before, generation = generation, reader.generation()
                if generation == before:
                    shared.dumps[family] = (generation, out)
                    return out
    except nfnl.NetlinkError as e:
        raise NftError(f"cannot read {table(family)}: {e.strerror}") from None
    return out


@attrs.frozen
class _Damage:
    section: Section
    problems: tuple[str, ...]
    fix: tuple[str, ...]  # empty: the section is created whole


def _diagnose(section: Section, chains: dict[str, list[Any]] | None) -> _Damage | None:
    where = table(section.family)
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
        targets = [r.jump for r in have if r.jump]
        own = [r for r in have if not r.jump]
        if len(own) < len(plain):
            problems.append(f"chain {chain} of {where} has {len(own)} of its {len(plain)} rules")
            # Refilled from scratch; the admin-chain jumps it had are put back first.
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


def _netlink_sets(family: str) -> set[str] | None:
    """The sets and maps of ``table <family> pycni`` (``None``: no such table); no element is read."""
    try:
        with nfnl.reading(family) as reader:
            return reader.sets(TABLE) if TABLE in reader.tables() else None
    except nfnl.NetlinkError as e:
        raise NftError(f"cannot read {table(family)}: {e.strerror}") from None


def check(attachment: Attachment, elements: Iterable[Element], sections: Iterable[Section] = ()) -> str | None:
    """Why the attachment's ``elements`` and the ``sections`` they need are not all in place
    (the first problem found, as text), or ``None``. O(1) in the number of containers."""
    problems = skeleton_problems(sections)
    if problems:
        return problems[0]
    sets: dict[str, set[str] | None] = {}
    for e in elements:
        held = holder(e)
        kind = "set" if e.data is None else "map"
        where = table(e.family)
        if held is not None:
            parsed = Comment.parse(held)
            if parsed.names(attachment):
                continue
            who = parsed.label or "no attachment"
            return f"element {e.key} of {kind} {e.set} of {where} belongs to another attachment ({who})"
        if e.family not in sets:
            sets[e.family] = _netlink_sets(e.family)
        found = sets[e.family]
        if found is None:
            return f"{where} is missing"
        if e.set not in found:
            return f"{kind} {e.set} of {where} is missing"
        return f"element {e.key} is missing from {kind} {e.set} of {where}"
    return None


def reconcile_hint(network: str) -> str:
    """How a CHECK that finds pycni's own state missing ends (``pycni serve`` heals it by itself)."""
    return f"run `pycni gc {network} --reconcile` to restore"


def hinted(network: str, *parts: str, about: str = "") -> str:
    """CHECK's details: ``parts`` (more of what is missing), joined, ending with
    :func:`reconcile_hint` for ``network`` — unless they or ``about`` (the message they detail)
    say another attachment holds a key, which reconciling leaves alone."""
    text = "; ".join(p for p in parts if p)
    if "belongs to another attachment" in f"{about} {text}":
        return text
    return f"{text}; {reconcile_hint(network)}" if text else reconcile_hint(network)

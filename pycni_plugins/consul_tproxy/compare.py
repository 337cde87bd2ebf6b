"""CHECK: the table listed in the container's namespace compared with the rule set of the config,
the first difference named."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .rules import _T, BASE_CHAINS, CHAINS, Interval, Ruleset, _merge, _Set


def _value(item: Any, render: str) -> int:
    if isinstance(item, dict) and "elem" in item:
        item = item["elem"]["val"]
    if render == "ipv4":
        return int(ipaddress.IPv4Address(item))
    return int(item)


def _listed_intervals(elems: Sequence[Any] | None, render: str) -> tuple[Interval, ...]:
    out: list[Interval] = []
    for item in elems or ():
        if isinstance(item, dict) and "elem" in item:
            item = item["elem"]["val"]
        if isinstance(item, dict) and "range" in item:
            out.append((_value(item["range"][0], render), _value(item["range"][1], render)))
        elif isinstance(item, dict) and "prefix" in item:
            net = ipaddress.IPv4Network(f"{item['prefix']['addr']}/{item['prefix']['len']}")
            out.append((int(net.network_address), int(net.broadcast_address)))
        else:
            v = _value(item, render)
            out.append((v, v))
    return _merge(out)


def _show(s: _Set, intervals: Iterable[Interval]) -> str:
    return "{" + ", ".join(map(s.element, intervals)) + "}"


def verify(objects: Sequence[Mapping[str, Any]] | None, expected: Ruleset | None) -> str | None:
    """The first difference between a listing of the table and ``expected`` (None: same).

    Without ``expected`` (no config to compare with) only the table's skeleton is checked.
    """
    where = f"table {_T}"
    if objects is None:
        return f"{where} not found"
    chains = {o["chain"]["name"]: o["chain"] for o in objects if "chain" in o}
    rules: dict[str, list[str]] = {}
    for o in objects:
        if "rule" in o:
            rules.setdefault(o["rule"]["chain"], []).append(o["rule"].get("comment") or "<a rule without comment>")
    sets = {o["set"]["name"]: o["set"] for o in objects if "set" in o}
    for name in CHAINS:
        chain = chains.get(name)
        if chain is None:
            return f"{where}: chain {name} is missing"
        want = BASE_CHAINS.get(name)
        have = (chain.get("type"), chain.get("hook"), chain.get("prio")) if "hook" in chain else None
        if have != want:
            return f"{where}: chain {name} is hooked as {have}, expected {want}"
    extra = sorted(set(chains) - set(CHAINS))
    if extra:
        return f"{where}: unexpected chain {extra[0]}"
    if expected is None:
        return None
    for name in CHAINS:
        have_rules, want_rules = rules.get(name, []), expected.chain_rules(name)
        for i, (have_rule, want_rule) in enumerate(zip(have_rules, want_rules), start=1):
            if have_rule != want_rule:
                return f'{where}: rule {i} of chain {name} is "{have_rule}", expected "{want_rule}"'
        if len(have_rules) < len(want_rules):
            return f'{where}: chain {name} lacks rule {len(have_rules) + 1} "{want_rules[len(have_rules)]}"'
        if len(have_rules) > len(want_rules):
            return f'{where}: chain {name} has an unexpected rule {len(want_rules) + 1} "{have_rules[len(want_rules)]}"'
    for s in expected.sets:
        listed = sets.get(s.name)
        if listed is None:
            return f"{where}: set {s.name} is missing"
        have_iv = _listed_intervals(listed.get("elem"), s.render)
        if have_iv != s.intervals:
            return f"{where}: set {s.name} holds {_show(s, have_iv)}, expected {_show(s, s.intervals)}"
    return None

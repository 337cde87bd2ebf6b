"""The nftables part of the host's filtering, read through libnftables' JSON: every table with a
base chain on the forward hook (ip, ip6, inet), pycni's excepted; iptables-nft's xtables matches
(``-m conntrack``/``-m state``) read from the text listing by handle."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..nft.transport import TABLE, context, error
from .model import _XT_NEUTRAL_TARGETS, Chain, Cond, Filter, IPNetwork, Rule, _net


def _range_nets(low: Any, high: Any) -> list[IPNetwork]:
    try:
        a, b = ipaddress.ip_address(str(low)), ipaddress.ip_address(str(high))
        return list(ipaddress.summarize_address_range(a, b))
    except (ValueError, TypeError):
        return []


def _values(right: Any, sets: Mapping[str, list[Any]]) -> list[Any] | None:
    """The right side of a match as a flat list of strings and networks (``None``: unreadable)."""
    if isinstance(right, str) and right.startswith("@"):
        found = sets.get(right[1:])
        return None if found is None else _values({"set": found}, sets)
    if isinstance(right, str | int):
        return [right]
    if isinstance(right, list):  # flags: ["established", "related"]
        out: list[Any] = []
        for item in right:
            got = _values(item, sets)
            if got is None:
                return None
            out += got
        return out
    if isinstance(right, dict):
        if "set" in right:
            items = right["set"]
            return _values(items if isinstance(items, list) else [items], sets)
        if "prefix" in right:
            net = _net(right["prefix"].get("addr"), right["prefix"].get("len"))
            return None if net is None else [net]
        if "range" in right and isinstance(right["range"], list) and len(right["range"]) == 2:
            nets = _range_nets(*right["range"])
            return nets or None
        if "elem" in right:
            return _values(right["elem"].get("val"), sets)
    return None


def _addr_values(values: list[Any]) -> tuple[Any, ...] | None:
    out: list[Any] = []
    for v in values:
        net = v if isinstance(v, ipaddress.IPv4Network | ipaddress.IPv6Network) else _net(v)
        if net is None:
            return None
        out.append(net)
    return tuple(out)


_PART_PROTOCOLS = {"tcp", "udp", "udplite", "sctp", "dccp", "th", "icmp", "icmpv6", "esp", "ah", "comp"}
_NEUTRAL = {"counter", "log", "comment", "mangle", "notrack", "quota", "synproxy", "flow", "set", "ct count"}


def _nft_match(m: Mapping[str, Any], sets: Mapping[str, list[Any]]) -> list[Cond]:
    text = str(m)
    op, left, right = m.get("op", "=="), m.get("left"), m.get("right")
    negate = op == "!="
    if op not in ("==", "!=", "in"):
        return [Cond("unknown", text=text)]
    if not isinstance(left, dict):
        return [Cond("unknown", text=text)]
    values = _values(right, sets)
    if "meta" in left:
        key = left["meta"].get("key")
        if key in ("l4proto", "protocol", "pkttype", "length", "mark", "skuid", "skgid", "cpu", "cgroup"):
            return [Cond("part")]
        if values is None:
            return [Cond("unknown", text=text)]
        if key in ("iifname", "iif"):
            return [Cond("iif", tuple(str(v) for v in values), negate)]
        if key in ("oifname", "oif"):
            return [Cond("oif", tuple(str(v) for v in values), negate)]
        if key == "nfproto":
            return [Cond("nfproto", tuple(str(v) for v in values), negate)]
        return [Cond("unknown", text=text)]
    if "payload" in left:
        proto, field = left["payload"].get("protocol"), left["payload"].get("field")
        if proto in ("ip", "ip6"):
            version = Cond("version", (4 if proto == "ip" else 6,))
            if field in ("saddr", "daddr") and values is not None:
                nets = _addr_values(values)
                if nets is not None:
                    return [version, Cond(field, nets, negate)]
            if field in ("protocol", "nexthdr", "dscp", "length", "ttl", "hoplimit"):
                return [version, Cond("part")]
            return [version, Cond("unknown", text=text)]
        if proto in _PART_PROTOCOLS:
            return [Cond("part")]
        return [Cond("unknown", text=text)]
    if "ct" in left:
        key = left["ct"].get("key")
        if values is None:
            return [Cond("unknown", text=text)]
        if key == "state":
            return [Cond("ctstate", tuple(str(v) for v in values), negate)]
        if key == "status":
            return [Cond("ctstatus", tuple(str(v) for v in values), negate)]
    return [Cond("unknown", text=text)]


_CT_TEXT = re.compile(r"\bct (state|status) (!= |! )?([a-z_,]+)")


def _nft_rule(obj: Mapping[str, Any], sets: Mapping[str, list[Any]], text: str | None) -> Rule:
    conds: list[Cond] = []
    verdict, target = "next", ""
    xt_ct = False
    for expr in obj.get("expr", ()):
        if not isinstance(expr, dict) or not expr:
            continue
        kind = next(iter(expr))
        body = expr[kind]
        if kind == "match":
            conds += _nft_match(body, sets)
        elif kind in ("accept", "drop", "reject", "return", "continue"):
            verdict = "next" if kind == "continue" else kind
        elif kind in ("jump", "goto"):
            verdict, target = kind, str(body.get("target", ""))
        elif kind in ("vmap", "queue"):
            verdict = "unknown"
        elif kind == "limit":
            conds.append(Cond("part"))
        elif kind == "xt":
            name = body.get("name", "")
            if body.get("type") == "target":
                if name == "REJECT":
                    verdict = "reject"
                elif name not in _XT_NEUTRAL_TARGETS:
                    verdict = "unknown"
            elif name in ("conntrack", "state"):
                xt_ct = True
            elif name in ("multiport", "tcp", "udp", "icmp", "icmp6", "length", "limit", "hashlimit", "mark"):
                conds.append(Cond("part"))
            elif name != "comment":
                conds.append(Cond("unknown", text=f"xt match {name}"))
        elif kind not in _NEUTRAL:
            conds.append(Cond("unknown", text=kind))
    if xt_ct:
        found = _CT_TEXT.findall(text or "")
        if not found:
            conds.append(Cond("unknown", text="xt match conntrack"))
        for key, neg, vals in found:
            conds.append(Cond("ctstate" if key == "state" else "ctstatus", tuple(vals.split(",")), bool(neg)))
    return Rule(tuple(conds), verdict, target, f"rule handle {obj.get('handle')}")


def _listed(family: str, name: str) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """``list table`` as JSON objects, and (only when a rule has an xtables match libnftables'
    JSON leaves closed) each rule's text line by handle."""
    ctx = context()
    rc, out, err = ctx.json_cmd({"nftables": [{"list": {"table": {"family": family, "name": name}}}]})
    if rc != 0:
        raise error(err)
    objs = [o for o in (out or {}).get("nftables", ()) if "metainfo" not in o]
    lines: dict[int, str] = {}
    if any(
        isinstance(e, dict) and e.get("xt", {}).get("name") in ("conntrack", "state")
        for o in objs
        for e in o.get("rule", {}).get("expr", ())
    ):
        old = ctx.set_handle_output(True)
        try:
            rc, text, err = ctx.cmd(f"list table {family} {name}")
        finally:
            ctx.set_handle_output(old)
        if rc == 0:
            for line in text.splitlines():
                m = re.search(r"# handle (\d+)\s*$", line)
                if m:
                    lines[int(m.group(1))] = line
    return objs, lines


def filter_from_json(family: str, name: str, objs: Sequence[Mapping[str, Any]], lines: Mapping[int, str]) -> Filter:
    """One table's chains from its ``list table`` JSON objects (and its xtables rule lines)."""
    sets: dict[str, list[Any]] = {}
    for o in objs:
        s = o.get("set") or o.get("map")
        if s and "elem" in s:
            sets[s["name"]] = list(s["elem"])
    chains: dict[str, Chain] = {}
    rules: dict[str, list[Rule]] = {}
    for o in objs:
        if "chain" in o:
            c = o["chain"]
            prio = c.get("prio", 0)
            chains[c["name"]] = Chain(
                c["name"],
                hook=c.get("hook", ""),
                priority=prio if isinstance(prio, int) else 0,
                policy=c.get("policy", "") if c.get("hook") else "",
            )
        elif "rule" in o:
            r = o["rule"]
            rules.setdefault(r["chain"], []).append(_nft_rule(r, sets, lines.get(r.get("handle", -1))))
    done = {n: attrs.evolve(c, rules=tuple(rules.get(n, ()))) for n, c in chains.items()}
    version = {"ip": 4, "ip6": 6}.get(family, 0)
    iptables = bool(version) and "FORWARD" in done
    return Filter(f"table {family} {name}", version, done, iptables)


def read_nftables() -> list[Filter]:
    """Every table with a base chain on the forward hook (ip, ip6, inet), pycni's excepted, in the
    calling thread's namespace (not memoised)."""
    rc, out, err = context().json_cmd({"nftables": [{"list": {"chains": None}}]})
    if rc != 0:
        raise error(err)
    tables = sorted(
        {
            (c["family"], c["table"])
            for o in (out or {}).get("nftables", ())
            if (c := o.get("chain")) and c.get("hook") == "forward" and c.get("family") in ("ip", "ip6", "inet")
        }
    )
    found = []
    for family, name in tables:
        if family == "inet" and name == TABLE:
            continue
        objs, lines = _listed(family, name)
        found.append(filter_from_json(family, name, objs, lines))
    return found

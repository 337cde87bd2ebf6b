"""The host's own forward-path filtering: would it drop a bridge attachment's traffic?

pycni's accepts live in ``table inet pycni``, and in nftables an ``accept`` ends only its own base
chain: every other base chain on the forward hook — iptables-nft's ``ip filter FORWARD`` (Docker's
policy drop), an admin's ``inet filter`` with policy drop, firewalld's tables — and legacy
iptables' ``filter FORWARD`` still see the packet, and a drop there wins. This module reads those
chains (never pycni's own tables) and judges four flows of an attachment (an interface on the
host, usually a bridge, and the container subnets behind it):

* ``egress``: the first packet of a connection from a container to the outside
  (``iifname <bridge>``, ``ip saddr`` in the subnet, ``ct state new``);
* ``replies``: packets of those connections coming back (``oifname <bridge>``, ``ct state
  established``);
* ``inbound``: the first packet of a connection DNAT'd to a container (a host port: ``oifname
  <bridge>``, ``ct state new``, ``ct status dnat``); judged only when asked for;
* ``bridged``: container to container on the same bridge, which the IP forward hook sees only
  when br_netfilter's ``bridge-nf-call-iptables`` (``ip6tables`` for IPv6) is on in the namespace.

A flow is dropped by a base chain when a ``drop``/``reject`` rule or the ``drop`` policy is reached
and no earlier ``accept`` in that chain (or a chain it jumps to) covers it. The judge is honest
and conservative: it evaluates the common matches exactly — ``iifname``/``oifname`` (and ``*``/
``+`` wildcards), ``ip``/``ip6 saddr``/``daddr`` against prefixes, ranges and anonymous or named
sets, ``ct state``, ``ct status dnat``, ``meta nfproto``, ``jump``/``goto``/``return``, iptables'
``-i -o -s -d -m conntrack --ctstate/--ctstatus -m state --state`` and ``-j``/``-g`` to user
chains (Docker's ``DOCKER-USER`` and ``DOCKER-ISOLATION-STAGE-*``) — and a match it cannot
evaluate makes the answer "may drop", naming the rule. A rule matching only part of a flow (a
protocol, a port, a rate limit) neither clears nor condemns it: the rest of the flow goes on.
iptables-nft's ``-m conntrack``/``-m state`` are xtables matches libnftables' JSON does not
open; their text listing does, so those rules are read from it by handle.

The nftables part is read through libnftables (``list chains``, then ``list table`` of each table
with a forward base chain, pycni's excepted) and kept in the namespace's memo under the ruleset
generation it was read at, so repeated CHECKs re-read nothing while no transaction commits.
Legacy iptables is read only where its ``filter`` table is loaded in the namespace
(``/proc/net/ip_tables_names``; ``ip6_tables_names``), with the host's ``iptables-legacy-save``
(``ip6tables-legacy-save``) if installed — listing with ``iptables-legacy`` would load the table
— and kept for :data:`~.nft.transport.VERIFY_EVERY` seconds (its changes bump no generation).
Not judged: bridge-family chains, and the input and output hooks (DNAT'd host-port traffic is
forwarded; only host-local clients of a host port cross output).
"""

from __future__ import annotations

import enum
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from pycni.errors import CNIError, ErrorCode

from . import nfnl, sysctl
from .nft.transport import READ_RETRIES, TABLE, VERIFY_EVERY, NftError, context, error, memo

__all__ = [
    "Finding",
    "Target",
    "Filter",
    "judge",
    "inspect",
    "check",
    "filters",
    "read_nftables",
    "read_legacy",
    "filter_from_json",
    "parse_legacy",
    "admin_rule",
    "iptables_rule",
    "uplinks",
]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Where the host's iptables tools live when ``PATH`` (an exec'd plugin's) lacks the sbin dirs.
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"
_MAX_DEPTH = 16


class Tri(enum.Enum):
    """How much of a flow a match covers."""

    NO = 0
    PART = 1  # a known part (a protocol, a port, a rate limit)
    MAYBE = 2  # cannot tell
    YES = 3


def _and(values: Iterable[Tri]) -> Tri:
    out = Tri.YES
    for v in values:
        if v is Tri.NO:
            return Tri.NO
        if v is Tri.MAYBE or (v is Tri.PART and out is Tri.YES):
            out = v
    return out


# --- the model ------------------------------------------------------------------------------------


@attrs.frozen
class Cond:
    """One match of a rule. ``kind``: ``iif``/``oif`` (``values`` are name patterns), ``saddr``/
    ``daddr`` (networks), ``ctstate`` (states, and the virtual ``dnat``/``snat``), ``ctstatus``,
    ``nfproto`` (``ipv4``/``ipv6``), ``part`` (a known partial match) or ``unknown`` (``text``)."""

    kind: str
    values: tuple[Any, ...] = ()
    negate: bool = False
    text: str = ""


@attrs.frozen
class Rule:
    conds: tuple[Cond, ...]
    #: ``accept``, ``drop``, ``reject``, ``jump``, ``goto``, ``return``, ``next`` (no verdict) or
    #: ``unknown`` (a verdict map, a queue, an unknown target: may drop)
    verdict: str
    target: str = ""
    #: How messages name it: ``rule handle 7`` or ``rule 3 (-A FORWARD -j DROP)``.
    label: str = ""


@attrs.frozen
class Chain:
    name: str
    rules: tuple[Rule, ...] = ()
    hook: str = ""
    priority: int = 0
    policy: str = ""  # base chains: accept or drop


@attrs.frozen
class Filter:
    """One table's chains as the judge walks them: ``where`` names it (``table inet filter``,
    ``iptables-legacy table filter``); ``version`` is 4, 6 or 0 (both, an ``inet`` table)."""

    where: str
    version: int
    chains: Mapping[str, Chain]
    #: Written by iptables (legacy, or iptables-nft's ``ip``/``ip6 filter``): fixes are iptables rules.
    iptables: bool = False

    def base_chains(self) -> list[Chain]:
        return [c for c in self.chains.values() if c.hook == "forward"]


@attrs.frozen
class Target:
    """What is judged: the host-side interface (a bridge, or a ptp host veth), the container
    subnets behind it, and the host ports DNAT'd to them (``"8080/tcp"``; none: inbound is not
    judged)."""

    interface: str
    subnets: tuple[IPNetwork, ...]
    host_ports: tuple[str, ...] = ()
    is_bridge: bool = True


@attrs.frozen
class Flow:
    name: str
    version: int
    iif: str | None  # None: the outside (``outside``, else some interface other than the target's)
    oif: str | None
    saddr: tuple[IPNetwork, ...] | None  # None: outside (not a container subnet)
    daddr: tuple[IPNetwork, ...] | None
    state: str
    dnat: bool
    traffic: str
    #: The interfaces the host's default routes leave through (empty: unknown).
    outside: tuple[str, ...] = ()


@attrs.frozen
class Finding:
    """A base chain that drops (``certain``) or may drop a flow of the attachment."""

    flow: str
    where: str
    certain: bool
    traffic: str
    #: The rule that might have accepted the flow first, when that is what makes it uncertain.
    unsure: str = ""
    #: What the admin adds to that filter (:func:`admin_rule` or its iptables form).
    remedy: str = ""

    @property
    def message(self) -> str:
        verb = "drops" if self.certain else "may drop"
        tail = f" ({self.unsure} may accept it first)" if self.unsure else ""
        return f"{self.where} {verb} {self.traffic}{tail}"


def _subnets_text(nets: Sequence[IPNetwork]) -> str:
    return ", ".join(str(n) for n in nets)


def flows(target: Target, bridged: Mapping[int, bool], uplinks: Mapping[int, Sequence[str]]) -> list[Flow]:
    """The flows of ``target`` per IP version; ``bridged[version]``: the forward hook sees
    bridged traffic (br_netfilter); ``uplinks[version]``: the interfaces the default routes
    leave through, where the outside is."""
    out: list[Flow] = []
    on = f"on {'bridge' if target.is_bridge else 'interface'} {target.interface}"
    for version in (4, 6):
        nets = tuple(n for n in target.subnets if n.version == version)
        if not nets:
            continue
        text = _subnets_text(nets)
        b = target.interface
        up = tuple(u for u in uplinks.get(version, ()) if u != b)
        egress = f"forwarded traffic from {text} {on}"
        out.append(Flow("egress", version, b, None, nets, None, "new", False, egress, up))
        out.append(Flow("replies", version, None, b, None, nets, "established", False, f"replies to {text} {on}", up))
        if target.is_bridge and bridged.get(version):
            between = f"traffic between containers {on} (br_netfilter)"
            out.append(Flow("bridged", version, b, b, nets, nets, "new", False, between))
        if target.host_ports:
            ports = ", ".join(target.host_ports)
            inbound = f"connections DNAT'd to {text} {on} (host ports {ports})"
            out.append(Flow("inbound", version, None, b, None, nets, "new", True, inbound, up))
    return out


# --- evaluating a match against a flow ------------------------------------------------------------


def _name_hit(pattern: str, name: str) -> bool:
    if pattern.endswith(("*", "+")) and not pattern.endswith("\\*"):
        return name.startswith(pattern[:-1])
    return pattern.replace("\\", "") == name


def _iface(cond: Cond, value: str | None, known: str, outside: Sequence[str]) -> Tri:
    patterns = [str(v) for v in cond.values]
    if value is not None:
        hit = any(_name_hit(p, value) for p in patterns)
    elif outside:
        hits = {any(_name_hit(p, u) for p in patterns) for u in outside}
        if len(hits) > 1:
            return Tri.MAYBE
        hit = hits.pop()
    elif all(p == known for p in patterns):
        hit = False  # the other side of the flow is not the target's interface
    elif any(p in ("*", "+") for p in patterns):
        hit = True
    else:
        return Tri.MAYBE
    return Tri.YES if hit != cond.negate else Tri.NO


def _addr(cond: Cond, value: tuple[IPNetwork, ...] | None, containers: tuple[IPNetwork, ...]) -> Tri:
    nets = [n for n in cond.values if isinstance(n, ipaddress.IPv4Network | ipaddress.IPv6Network)]
    if len(nets) != len(cond.values):
        return Tri.MAYBE
    if value is None:  # outside: anywhere but the container subnets
        if any(n.prefixlen == 0 for n in nets):
            hit = True
        elif all(any(n.version == c.version and n.subnet_of(c) for c in containers) for n in nets):  # type: ignore[arg-type]
            hit = False
        else:
            return Tri.MAYBE
    else:
        same = [n for n in nets if n.version == value[0].version]
        if all(any(v.subnet_of(n) for n in same) for v in value):  # type: ignore[arg-type]
            hit = True
        elif all(not v.overlaps(n) for v in value for n in same):
            hit = False
        else:
            return Tri.MAYBE
    return Tri.YES if hit != cond.negate else Tri.NO


def _ctstate(cond: Cond, flow: Flow) -> Tri:
    values = {str(v).lower() for v in cond.values}
    hit = flow.state in values or (flow.dnat and "dnat" in values)
    if not hit and "snat" in values:
        return Tri.MAYBE  # masqueraded replies carry snat: not modelled
    return Tri.YES if hit != cond.negate else Tri.NO


def _ctstatus(cond: Cond, flow: Flow) -> Tri:
    values = {str(v).lower() for v in cond.values}
    if values != {"dnat"}:
        return Tri.MAYBE
    return Tri.YES if flow.dnat != cond.negate else Tri.NO


def _cond(cond: Cond, flow: Flow, containers: tuple[IPNetwork, ...]) -> Tri:
    k = cond.kind
    if k == "iif":
        return _iface(cond, flow.iif, flow.oif or flow.iif or "", flow.outside)
    if k == "oif":
        return _iface(cond, flow.oif, flow.iif or flow.oif or "", flow.outside)
    if k in ("saddr", "daddr"):
        ver = {v.version for v in cond.values if hasattr(v, "version")}
        if ver and flow.version not in ver:
            return Tri.YES if cond.negate else Tri.NO  # ``ip saddr`` never matches an IPv6 packet
        return _addr(cond, flow.saddr if k == "saddr" else flow.daddr, containers)
    if k == "ctstate":
        return _ctstate(cond, flow)
    if k == "ctstatus":
        return _ctstatus(cond, flow)
    if k == "nfproto":
        hit = f"ipv{flow.version}" in {str(v) for v in cond.values}
        return Tri.YES if hit != cond.negate else Tri.NO
    if k == "version":  # implied by an ``ip``/``ip6`` payload match
        return Tri.YES if flow.version in cond.values else Tri.NO
    if k == "part":
        return Tri.PART
    return Tri.MAYBE


# --- walking the chains ---------------------------------------------------------------------------


@attrs.frozen
class _Outcome:
    kind: str  # accept, drop, return
    certain: bool
    where: str = ""
    unsure: str = ""


def _walk(f: Filter, chain: Chain, flow: Flow, containers: tuple[IPNetwork, ...], depth: int) -> _Outcome:
    unsure = ""
    here = f"{f.where} chain {chain.name}"
    for rule in chain.rules:
        m = _and(_cond(c, flow, containers) for c in rule.conds)
        if m is Tri.NO:
            continue
        at = f"{here} {rule.label}".rstrip()
        v = rule.verdict
        if v == "accept":
            if m is Tri.YES:
                return _Outcome("accept", not unsure, unsure=unsure)
            if m is Tri.MAYBE:
                unsure = unsure or at
        elif v in ("drop", "reject"):
            if m is Tri.YES:
                return _Outcome("drop", not unsure, f"{at} ({v})", unsure)
            if m is Tri.MAYBE:
                return _Outcome("drop", False, f"{at} ({v})", unsure)
        elif v == "unknown":
            if m is not Tri.PART:
                return _Outcome("drop", False, f"{at} (verdict not evaluated)", unsure)
        elif v in ("jump", "goto"):
            if m is Tri.PART:
                continue  # a part of the flow: what the chain does to it neither clears nor condemns the rest
            sub = f.chains.get(rule.target)
            if sub is None or depth >= _MAX_DEPTH:
                return _Outcome("drop", False, f"{at} ({v} {rule.target}: not evaluated)", unsure)
            got = _walk(f, sub, flow, containers, depth + 1)
            if m is Tri.YES:
                if got.kind != "return":
                    return _Outcome(got.kind, got.certain and not unsure, got.where, unsure or got.unsure)
                unsure = unsure or got.unsure
                if v == "goto":
                    return _Outcome("return", not unsure, unsure=unsure)
            elif got.kind == "drop":
                return _Outcome("drop", False, got.where, unsure or got.unsure)
            elif got.kind == "accept" or got.unsure:
                unsure = unsure or got.unsure or at
        elif v == "return":
            if m is Tri.YES:
                return _Outcome("return", not unsure, unsure=unsure)
            unsure = unsure or at
    return _Outcome("return", not unsure, unsure=unsure)


def judge_chain(
    f: Filter, chain: Chain, flow: Flow, containers: tuple[IPNetwork, ...], interface: str = ""
) -> Finding | None:
    """Whether base chain ``chain`` of ``f`` drops ``flow`` (of ``interface``)."""
    got = _walk(f, chain, flow, containers, 0)
    if got.kind == "accept":
        return None
    remedy = iptables_rule(f, interface or flow.iif or flow.oif or "") if f.iptables else admin_rule(interface)
    if got.kind == "return":
        if chain.policy != "drop":
            return None
        policy = "DROP" if f.where.startswith(("iptables", "ip6tables")) else "drop"
        where = f"{f.where} chain {chain.name} (policy {policy})"
        return Finding(flow.name, where, got.certain, flow.traffic, got.unsure, remedy)
    return Finding(flow.name, got.where, got.certain, flow.traffic, got.unsure, remedy)


def judge(
    filters: Sequence[Filter],
    target: Target,
    bridged: Mapping[int, bool],
    uplinks: Mapping[int, Sequence[str]] | None = None,
    only: Collection[str] | None = None,
) -> list[Finding]:
    """For each flow of ``target`` (those named in ``only``), the first base chain (in hook
    priority order) that drops or may drop it. The outside is where ``uplinks`` (by IP version)
    lead; without them, an interface match naming anything but the target's interface cannot be
    judged for it."""
    chains = sorted(
        ((c.priority, i, f, c) for i, f in enumerate(filters) for c in f.base_chains()),
        key=lambda t: (t[0], t[1]),
    )
    out = []
    for flow in flows(target, bridged, uplinks or {}):
        if only is not None and flow.name not in only:
            continue
        for _, _, f, chain in chains:
            if f.version and f.version != flow.version:
                continue
            found = judge_chain(f, chain, flow, target.subnets, target.interface)
            if found is not None:
                out.append(found)
                break
    return out


def admin_rule(interface: str) -> str:
    """The rules an admin adds to their forward chain so the host's filter lets the attachment's
    traffic through (nft syntax)."""
    q = '"' + interface.replace('"', '\\"') + '"'
    return f"iifname {q} accept; oifname {q} ct state established,related accept; oifname {q} ct status dnat accept"


def iptables_rule(f: Filter, interface: str) -> str:
    """:func:`admin_rule` as the iptables commands of ``f``'s flavour, into Docker's
    ``DOCKER-USER`` where the filter has it, else at the top of ``FORWARD``."""
    tool = ("iptables" if f.version == 4 else "ip6tables") + ("-legacy" if f.where.startswith("ip") else "")
    chain = "DOCKER-USER" if "DOCKER-USER" in f.chains else "FORWARD"
    q = shlex.quote(interface)
    return (
        f"{tool} -I {chain} 1 -i {q} -j ACCEPT; "
        f"{tool} -I {chain} 2 -o {q} -m conntrack --ctstate ESTABLISHED,RELATED,DNAT -j ACCEPT"
    )


# --- nftables: libnftables JSON -------------------------------------------------------------------


def _net(text: Any, length: Any = None) -> IPNetwork | None:
    try:
        if length is not None:
            return ipaddress.ip_network(f"{text}/{length}", strict=False)
        return ipaddress.ip_network(str(text), strict=False)
    except ValueError:
        return None


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


_XT_NEUTRAL_TARGETS = {"LOG", "NFLOG", "MARK", "CONNMARK", "TCPMSS", "CT", "TRACE", "DSCP", "TOS", "CLASSIFY"}
_XT_NEUTRAL_TARGETS |= {"CHECKSUM", "AUDIT", "TEE", "SECMARK", "CONNSECMARK", "IDLETIMER", "LED", "ULOG"}
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


# --- legacy iptables ------------------------------------------------------------------------------

_PART_OPTIONS = {
    "--dport",
    "--sport",
    "--dports",
    "--sports",
    "--destination-port",
    "--source-port",
    "--destination-ports",
    "--source-ports",
    "--icmp-type",
    "--icmpv6-type",
    "--tcp-flags",
    "--syn",
    "--limit",
    "--limit-burst",
    "--ports",
    "--tcp-option",
    "--length",
    "-f",
    "--fragment",
}


def _legacy_rule(line: str, number: int, version: int, chains: Iterable[str]) -> tuple[str, Rule] | None:
    try:
        tokens = shlex.split(line)
    except ValueError:
        return None
    if len(tokens) < 2 or tokens[0] != "-A":
        return None
    chain = tokens[1]
    conds: list[Cond] = []
    verdict, target = "next", ""
    negate = False
    i = 2

    def arg() -> str:
        nonlocal i
        i += 1
        return tokens[i] if i < len(tokens) else ""

    while i < len(tokens):
        t = tokens[i]
        if t == "!":
            negate = True
            i += 1
            continue
        if t in ("-i", "--in-interface"):
            conds.append(Cond("iif", (arg(),), negate))
        elif t in ("-o", "--out-interface"):
            conds.append(Cond("oif", (arg(),), negate))
        elif t in ("-s", "--source", "-d", "--destination"):
            nets = tuple(_net(a) for a in arg().split(","))
            kind = "saddr" if t in ("-s", "--source") else "daddr"
            if any(n is None for n in nets):
                conds.append(Cond("unknown", text=f"{t} {tokens[i]}"))
            else:
                conds.append(Cond(kind, nets, negate))
        elif t in ("-p", "--protocol"):
            if arg().lower() not in ("all", "0"):
                conds.append(Cond("part"))
        elif t in ("-m", "--match"):
            module = arg()
            if module not in ("conntrack", "state", "comment", "tcp", "udp", "icmp", "icmp6", "multiport", "limit"):
                conds.append(Cond("unknown", text=f"-m {module}"))
        elif t in ("--ctstate", "--state"):
            conds.append(Cond("ctstate", tuple(arg().lower().split(",")), negate))
        elif t == "--ctstatus":
            conds.append(Cond("ctstatus", tuple(arg().lower().split(",")), negate))
        elif t == "--comment":
            arg()
        elif t in ("-j", "--jump", "-g", "--goto"):
            name = arg()
            if name in ("ACCEPT", "DROP", "RETURN"):
                verdict = name.lower()
            elif name == "REJECT":
                verdict = "reject"
            elif name in chains:
                verdict, target = ("goto" if t in ("-g", "--goto") else "jump"), name
            elif name in _XT_NEUTRAL_TARGETS:
                verdict = "next"
            else:
                verdict = "unknown"  # an extension target (QUEUE, NFQUEUE, ...)
            # Extension targets' own options (--reject-with, --log-prefix) follow: skip them.
            while i + 1 < len(tokens):
                i += 1
                if tokens[i] in ("-m", "--match"):
                    i -= 1
                    break
            # (a rule's target comes last in iptables-save output)
        elif t.startswith("-"):
            kind = "part" if t in _PART_OPTIONS else "unknown"
            conds.append(Cond(kind, text=t))
            while i + 1 < len(tokens) and not tokens[i + 1].startswith("-") and tokens[i + 1] != "!":
                i += 1
        negate = False
        i += 1
    tool = "iptables" if version == 4 else "ip6tables"
    return chain, Rule(tuple(conds), verdict, target, f"rule {number} ({tool} {line.strip()})")


def parse_legacy(save: str, version: int) -> Filter | None:
    """The ``filter`` table of ``iptables-legacy-save`` (``ip6tables-legacy-save``) output."""
    chains: dict[str, Chain] = {}
    rules: dict[str, list[Rule]] = {}
    table = ""
    for raw in save.splitlines():
        line = raw.strip()
        if line.startswith("*"):
            table = line[1:]
            continue
        if table != "filter":
            continue
        if line.startswith(":"):
            parts = line[1:].split()
            if parts:
                base = parts[0] in ("INPUT", "FORWARD", "OUTPUT")
                hook = parts[0].lower() if base else ""
                policy = parts[1].lower() if base and len(parts) > 1 else ""
                chains[parts[0]] = Chain(parts[0], hook=hook, policy=policy)
        elif line.startswith("-A "):
            chain_name = line.split()[1]
            parsed = _legacy_rule(line, len(rules.get(chain_name, ())) + 1, version, chains)
            if parsed is not None:
                rules.setdefault(parsed[0], []).append(parsed[1])
    if not chains:
        return None
    tool = "iptables-legacy" if version == 4 else "ip6tables-legacy"
    done = {n: attrs.evolve(c, rules=tuple(rules.get(n, ()))) for n, c in chains.items()}
    return Filter(f"{tool} table filter", version, done, iptables=True)


def _legacy_loaded(version: int) -> bool:
    name = "ip_tables_names" if version == 4 else "ip6_tables_names"
    try:
        with open(f"/proc/thread-self/net/{name}") as f:
            return "filter" in f.read().split()
    except OSError:
        return False


def read_legacy() -> list[Filter]:
    """Legacy iptables' ``filter`` tables of the calling thread's namespace, where they are loaded
    and the host has the legacy save tools (a child forked by this thread shares its namespace)."""
    out = []
    for version, tool in ((4, "iptables-legacy-save"), (6, "ip6tables-legacy-save")):
        if not _legacy_loaded(version):
            continue
        path = shutil.which(tool, path=f"{os.environ.get('PATH', '')}:{_SBIN}")
        if path is None:
            continue
        try:
            done = subprocess.run(
                [path, "-t", "filter"], capture_output=True, text=True, timeout=10, check=False, env={"PATH": _SBIN}
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            parsed = parse_legacy(done.stdout, version)
            if parsed is not None:
                out.append(parsed)
    return out


# --- the memoised inspection ----------------------------------------------------------------------


def _read(reader: Any, shared: Any) -> list[Filter]:
    generation = reader.generation()
    cached = shared.host_filters
    if cached is not None and cached[0] == generation:
        found: list[Filter] = cached[1]
        return found
    for _ in range(READ_RETRIES):
        found = read_nftables()
        before, generation = generation, reader.generation()
        if generation == before:
            break
    shared.host_filters = (generation, found)
    return found


@attrs.frozen
class _Surroundings:
    """What no nftables generation tracks, read again after :data:`VERIFY_EVERY` seconds."""

    legacy: list[Filter]
    bridged: dict[int, bool]
    uplinks: dict[int, tuple[str, ...]]


def _surroundings(shared: Any) -> _Surroundings:
    now = time.monotonic()
    kept = shared.host_legacy
    if kept is not None and now - kept[0] < VERIFY_EVERY:
        found: _Surroundings = kept[1]
        return found
    found = _Surroundings(read_legacy(), bridged_hooks(), uplinks())
    shared.host_legacy = (now, found)
    return found


def filters() -> list[Filter]:
    """The host filters of the calling thread's namespace: nftables (memoised by the ruleset
    generation) and legacy iptables (memoised for :data:`VERIFY_EVERY` seconds)."""
    shared = memo()
    try:
        with nfnl.reading("inet") as reader:
            nft_part = _read(reader, shared)
    except nfnl.NetlinkError as e:
        raise NftError(f"cannot read the host's nftables ruleset: {e.strerror}") from None
    return [*nft_part, *_surroundings(shared).legacy]


def bridged_hooks() -> dict[int, bool]:
    """Whether the IP forward hook sees bridged IPv4 / IPv6 (br_netfilter's sysctls in the
    calling thread's namespace; no module, no hook)."""
    out = {}
    for version, name in ((4, "bridge-nf-call-iptables"), (6, "bridge-nf-call-ip6tables")):
        try:
            out[version] = sysctl.read(f"net/bridge/{name}") == "1"
        except OSError:
            out[version] = False
    return out


def uplinks() -> dict[int, tuple[str, ...]]:
    """The interfaces the calling thread's namespace's default routes leave through (main
    table), by IP version."""
    from .links import iproute

    out: dict[int, tuple[str, ...]] = {}
    with iproute() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        for version, family in ((4, 2), (6, 10)):
            found: list[str] = []
            for route in ipr.get_routes(family=family, table=254):
                if route["dst_len"] != 0 or route.get_attr("RTA_DST") is not None:
                    continue
                hops = [route.get_attr("RTA_OIF")]
                multipath = route.get_attr("RTA_MULTIPATH")
                if multipath:
                    hops = [hop["oif"] for hop in multipath]
                found += [names[h] for h in hops if h in names and names[h] not in found]
            out[version] = tuple(found)
    return out


def inspect(target: Target, only: Collection[str] | None = None) -> list[Finding]:
    """What of the calling thread's namespace's filtering drops ``target``'s traffic (the flows
    named in ``only``: ``egress``, ``replies``, ``bridged``, ``inbound``). The nftables part is
    memoised by generation; legacy iptables, br_netfilter's sysctls and the default routes'
    interfaces for :data:`VERIFY_EVERY` seconds."""
    found = filters()
    around = _surroundings(memo())
    return judge(found, target, around.bridged, around.uplinks, only)


def check(target: Target, only: Collection[str] | None = None, code: int = ErrorCode.INTERNAL) -> None:
    """Raise ``code`` naming the first base chain that certainly drops ``target``'s traffic, the
    others in the details with the rule that lets it through. A "may drop" finding fails
    nothing: a judge unsure of a foreign rule must not fail a CHECK or a STATUS (which makes
    orchestrators call the network not ready) on a host where the traffic may well pass."""
    try:
        found = [f for f in inspect(target, only) if f.certain]
    except (NftError, OSError) as e:
        raise CNIError(f"cannot read the host's firewall: {e}", code=ErrorCode.INTERNAL) from e
    if found:
        fix = f"let it through: {found[0].remedy}" if found[0].remedy else ""
        raise CNIError(found[0].message, "; ".join([*(f.message for f in found[1:]), fix]).strip("; "), code=code)

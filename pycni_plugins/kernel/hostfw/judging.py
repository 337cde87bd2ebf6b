"""Judging a flow against the host filters: each match evaluated (yes, no, a part of the flow,
cannot tell), the chains walked (jumps, gotos, returns), the first base chain that drops or may
drop; and the rules an admin adds to let the traffic through."""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from .model import FIREWALLD_TABLE, Chain, Cond, Filter, Finding, Flow, IPNetwork, Target, Tri, flows

_MAX_DEPTH = 16


def _and(values: Iterable[Tri]) -> Tri:
    out = Tri.YES
    for v in values:
        if v is Tri.NO:
            return Tri.NO
        if v is Tri.MAYBE or (v is Tri.PART and out is Tri.YES):
            out = v
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
    if f.where == FIREWALLD_TABLE:
        remedy = firewalld_remedy(interface)
    if got.kind == "return":
        if chain.policy != "drop":
            return None
        policy = "DROP" if f.where.startswith(("iptables", "ip6tables")) else "drop"
        where = f"{f.where} chain {chain.name} (policy {policy})"
        return Finding(flow.name, where, got.certain, flow.traffic, got.unsure, remedy, f.iptables)
    return Finding(flow.name, got.where, got.certain, flow.traffic, got.unsure, remedy, f.iptables)


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


def firewalld_remedy(interface: str) -> str:
    """What lets the attachment's traffic through firewalld: never a rule in firewalld's own
    table (a reload rewrites it), but zone sources or the interface in a zone."""
    q = shlex.quote(interface)
    return (
        "the firewall plugin makes each container's addresses sources of a firewalld zone (trusted) "
        "where firewalld rejects their egress; after a firewalld reload `pycni gc NETWORK --reconcile` re-adds "
        f"them; or the whole bridge: firewall-cmd --permanent --zone=trusted --add-interface={q}; firewall-cmd --reload"
    )


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

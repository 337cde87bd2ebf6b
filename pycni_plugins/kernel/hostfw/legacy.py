"""Legacy iptables' ``filter`` tables: ``iptables-legacy-save`` (``ip6tables-legacy-save``) output
parsed, where the table is loaded in the namespace and the host has the tools."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

import attrs

from .model import _XT_NEUTRAL_TARGETS, Chain, Cond, Filter, Rule, _net

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
    from ..iptables import IptablesError, run_tool

    out = []
    for version, tool in ((4, "iptables-legacy-save"), (6, "ip6tables-legacy-save")):
        if not _legacy_loaded(version):
            continue
        try:
            text = run_tool([tool, "-t", "filter"])
        except IptablesError:
            continue
        parsed = parse_legacy(text, version)
        if parsed is not None:
            out.append(parsed)
    return out

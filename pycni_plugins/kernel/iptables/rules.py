"""The iptables compatibility step's rules as text: ``<tool>-save`` parsed, pycni's rules
written as ``<tool>-restore`` reads them, and the signature that tells pycni's rules apart
whether listed by ``-save`` or by libnftables (iptables-nft's tables)."""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from pycni.errors import CNIError, ErrorCode

CHAIN = "PYCNI-FORWARD"
ADMIN_COMMENT = "pycni admin"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class IptablesError(CNIError):
    """An iptables tool failed (code 999), its stderr in the details."""

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(msg, details, code=ErrorCode.INTERNAL)


def admin_rules(objs: Sequence[dict[str, object]], interface: str) -> list[tuple[str, IPNetwork]]:
    """The ``oifname <interface> ip[6] daddr <net> accept`` rules of an nftables chain's listing
    (libnftables JSON objects of ``list chain``) as ``(interface, net)``: what Nomad's admin rule
    is in pycni's table."""
    out: list[tuple[str, IPNetwork]] = []
    for o in objs:
        rule = o.get("rule")
        if not isinstance(rule, dict):
            continue
        oif: str | None = None
        net: IPNetwork | None = None
        verdict = ""
        other = False
        for e in rule.get("expr", ()):
            if not isinstance(e, dict) or not e:
                continue
            kind, body = next(iter(e.items()))
            if kind == "match" and isinstance(body, dict) and body.get("op") == "==":
                left, right = body.get("left"), body.get("right")
                if isinstance(left, dict) and left.get("meta", {}).get("key") == "oifname" and isinstance(right, str):
                    oif = right
                elif isinstance(left, dict) and left.get("payload", {}).get("field") == "daddr":
                    net = _prefix(right)
                    other = other or net is None
                else:
                    other = True
            elif kind == "accept":
                verdict = "accept"
            elif kind != "counter":
                other = True
        if not other and verdict == "accept" and oif == interface and net is not None:
            out.append((oif, net))
    return out


def _prefix(right: object) -> IPNetwork | None:
    try:
        if isinstance(right, dict) and isinstance(right.get("prefix"), dict):
            p = right["prefix"]
            return ipaddress.ip_network(f"{p.get('addr')}/{p.get('len')}", strict=False)
        if isinstance(right, str):
            return ipaddress.ip_network(right, strict=False)
    except ValueError:
        return None
    return None


@attrs.frozen
class Rules:
    """The ``filter`` table as ``<tool>-save`` lists it: chains, and each rule as its tokens
    (``-A`` and the chain name left out) by chain."""

    chains: frozenset[str]
    rules: dict[str, list[tuple[str, ...]]]

    @property
    def jumps(self) -> list[tuple[str, ...]]:
        return [r for r in self.rules.get("FORWARD", ()) if _target(r) == CHAIN]

    def ours(self) -> list[tuple[str, ...]]:
        return list(self.rules.get(CHAIN, ()))


def _target(tokens: Sequence[str]) -> str:
    for i, t in enumerate(tokens[:-1]):
        if t in ("-j", "--jump", "-g", "--goto"):
            return tokens[i + 1]
    return ""


def comment_of(tokens: Sequence[str]) -> str:
    for i, t in enumerate(tokens[:-1]):
        if t == "--comment":
            return tokens[i + 1]
    return ""


def parse_save(text: str) -> Rules:
    chains: set[str] = set()
    rules: dict[str, list[tuple[str, ...]]] = {}
    table = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("*"):
            table = line[1:]
        elif table != "filter":
            continue
        elif line.startswith(":"):
            chains.add(line[1:].split()[0])
        elif line.startswith("-A "):
            try:
                tokens = shlex.split(line)
            except ValueError:
                continue
            if len(tokens) >= 2:
                rules.setdefault(tokens[1], []).append(tuple(tokens[2:]))
    return Rules(frozenset(chains), rules)


def quote(token: str) -> str:
    """A token as iptables-restore reads it: double quotes around one with spaces (pycni's
    comments and interface names hold no quote or backslash)."""
    if '"' in token or "\\" in token:
        raise IptablesError(f"refusing to write {token!r} to iptables-restore")
    return f'"{token}"' if not token or any(c.isspace() for c in token) else token


def line(tokens: Sequence[str]) -> str:
    return " ".join(quote(t) for t in tokens)


def attachment_rules(addresses: Iterable[IPNetwork], comment: str) -> list[tuple[str, ...]]:
    """The two rules per address (``/32``, ``/128``): replies to it, anything from it (Go's order)."""
    out: list[tuple[str, ...]] = []
    for net in addresses:
        host = f"{net.network_address}/{net.max_prefixlen}"
        c = ("-m", "comment", "--comment", comment)
        out.append(("-d", host, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", *c, "-j", "ACCEPT"))
        out.append(("-s", host, *c, "-j", "ACCEPT"))
    return out


def admin_tokens(interface: str, net: IPNetwork, chain: str) -> tuple[str, ...]:
    # In iptables-save's order (-s, -d, -i, -o, matches, target): rules are compared as listed.
    return ("-d", str(net), "-o", interface, "-m", "comment", "--comment", f"{ADMIN_COMMENT} {chain}", "-j", "ACCEPT")


#: What pycni's rules are told apart by (comments aside): source or destination (``s``/``d``),
#: the network, whether a conntrack match is there, the output interface.
Sig = tuple[str, str, bool, str]


def sig_of_tokens(tokens: Sequence[str]) -> Sig:
    field, net, ct, oif = "", "", False, ""
    for i, t in enumerate(tokens[:-1]):
        if t in ("-s", "-d"):
            field, net = t[1], _norm(tokens[i + 1])
        elif t == "-o":
            oif = tokens[i + 1]
        elif t in ("--ctstate", "--state"):
            ct = True
    return field, net, ct, oif


def _norm(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        return text


def sig_of_nft(rule: dict[str, Any]) -> Sig:
    field, net, ct, oif = "", "", False, ""
    for e in rule.get("expr", ()):
        if not isinstance(e, dict):
            continue
        m = e.get("match")
        if isinstance(m, dict) and isinstance(m.get("left"), dict):
            left, right = m["left"], m.get("right")
            if left.get("payload", {}).get("field") in ("saddr", "daddr"):
                got = _prefix(right)
                field, net = left["payload"]["field"][0], str(got) if got is not None else str(right)
            elif left.get("meta", {}).get("key") == "oifname":
                oif = str(right)
        elif isinstance(e.get("xt"), dict) and e["xt"].get("name") in ("conntrack", "state"):
            ct = True
    return field, net, ct, oif

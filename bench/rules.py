"""What a backend left in the host namespace's firewall, and what the first packet pays for it.

:func:`snapshot` reads the host namespace's ruleset twice: ``list ruleset`` through libnftables
(JSON), which sees every table including iptables-nft's, and ``iptables-save``/``ip6tables-save``,
which decode the xtables matches (``multiport``, ``addrtype``, …) that libnftables can only show
as opaque ``xt`` expressions.

:func:`first_packet` is the first-packet cost proxy: a static walk of the NAT prerouting path
for the first packet of a new TCP connection from outside (203.0.113.7:40000) to a published
host port on a host-local address (the bridge gateway), counting every rule the kernel
evaluates until the DNAT. Linear rule lists cost one evaluation per rule passed; a set or map
lookup costs one evaluation of the rule that does it (counted in ``lookups`` too). iptables
tables (iptables-nft) are walked from ``iptables-save``, native nftables tables from the JSON;
xtables chains come first (both hook at priority -100, and only one kind holds port forwards
in any one backend). The walk reports the DNAT target it reached, so a wrong walk shows.
Anything the walker does not model raises :class:`Unsupported` rather than guessing.
"""

from __future__ import annotations

import ipaddress
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pycni import netns

# The probe packet.
SOURCE = "203.0.113.7"
SOURCE_PORT = 40000
INPUT_IF = "ext0"
XTABLES = {("ip", n) for n in ("filter", "nat", "mangle", "raw", "security")} | {
    ("ip6", n) for n in ("filter", "nat", "mangle", "raw", "security")
}


class Unsupported(Exception):
    """The ruleset uses something the walker does not model."""


def snapshot(host: str) -> dict[str, Any]:
    """The host namespace's nftables JSON and iptables-save text (run inside it)."""
    return netns.run_in(host, _snapshot)


def _snapshot() -> dict[str, Any]:
    from pycni._libnftables import Nftables

    nft = Nftables()
    nft.set_json_output(True)
    rc, out, err = nft.cmd("list ruleset")
    if rc != 0:
        raise RuntimeError(f"nft list ruleset failed: {err.strip()}")
    saved = {}
    for tool in ("iptables-save", "ip6tables-save"):
        saved[tool] = subprocess.run([tool], capture_output=True, text=True, check=True, timeout=60).stdout
    return {"nft": nftables_objects(out), **saved}


def nftables_objects(text: str) -> list[dict[str, Any]]:
    import json

    return json.loads(text)["nftables"] if text.strip() else []


def count(snap: Mapping[str, Any]) -> dict[str, Any]:
    """Rules, chains and set/map elements per table, plus iptables/ip6tables rule counts."""
    tables: dict[str, dict[str, Any]] = {}
    for obj in snap["nft"]:
        kind, body = next(iter(obj.items()))
        if kind == "metainfo":
            continue
        key = f"{body['family']} {body['name'] if kind == 'table' else body['table']}"
        entry = tables.setdefault(key, {"chains": 0, "rules": 0, "sets": 0, "elements": 0})
        if kind == "chain":
            entry["chains"] += 1
        elif kind == "rule":
            entry["rules"] += 1
        elif kind in ("set", "map"):
            entry["sets"] += 1
            entry["elements"] += len(body.get("elem", ()))
            if body.get("elem"):
                entry.setdefault("elements_by_set", {})[body["name"]] = len(body["elem"])
    return {
        "nft_rules": sum(t["rules"] for t in tables.values()),
        "nft_chains": sum(t["chains"] for t in tables.values()),
        "nft_elements": sum(t["elements"] for t in tables.values()),
        "iptables_rules": _appended(snap["iptables-save"]),
        "ip6tables_rules": _appended(snap["ip6tables-save"]),
        "tables": tables,
    }


def _appended(saved: str) -> int:
    return sum(1 for line in saved.splitlines() if line.startswith("-A "))


def first_packet(snap: Mapping[str, Any], port: int, daddr: str, expected: str) -> dict[str, Any]:
    """Walk the NAT prerouting path for TCP to ``daddr:port``; ``expected`` = ``addr:port``."""
    walk = _Walk(port, daddr)
    try:
        verdict = _IptablesNat(snap["iptables-save"], walk).run()
        if verdict is None:
            verdict = _NftNat(snap["nft"], walk).run()
    except Unsupported as e:
        return {"port": port, "error": f"unsupported by the walker: {e}"}
    return {
        "port": port,
        "rules_evaluated": walk.evaluated,
        "lookups": walk.lookups,
        "chains": walk.chains,
        "verdict": verdict,
        "expected": f"dnat to {expected}",
        "ok": verdict == f"dnat to {expected}",
    }


class _Walk:
    def __init__(self, port: int, daddr: str) -> None:
        self.port = port
        self.daddr = ipaddress.ip_address(daddr)
        self.saddr = ipaddress.ip_address(SOURCE)
        self.evaluated = 0
        self.lookups = 0
        self.chains: list[str] = []


# -- iptables (from iptables-save) -------------------------------------------------------------

_TERMINAL = {"ACCEPT", "DROP", "REJECT", "MASQUERADE", "SNAT", "REDIRECT"}
_NON_TERMINAL = {"MARK", "CONNMARK", "LOG", "NOTRACK"}


class _IptablesNat:
    """iptables semantics over the ``*nat`` section of iptables-save output."""

    def __init__(self, saved: str, walk: _Walk) -> None:
        self.walk = walk
        self.chains: dict[str, list[list[str]]] = {}
        section = None
        for line in saved.splitlines():
            if line.startswith("*"):
                section = line[1:]
            elif section == "nat" and line.startswith(":"):
                self.chains.setdefault(line[1:].split()[0], [])
            elif section == "nat" and line.startswith("-A "):
                tokens = shlex.split(line)
                self.chains.setdefault(tokens[1], []).append(tokens[2:])
        self.mark = 0

    def run(self) -> str | None:
        if not self.chains.get("PREROUTING"):
            return None
        verdict = self.chain("PREROUTING")
        return verdict if verdict and verdict.startswith("dnat") else None

    def chain(self, name: str) -> str | None:
        """The chain's final verdict, or ``None`` when it returns / falls through."""
        self.walk.chains.append(name)
        for rule in self.chains[name]:
            self.walk.evaluated += 1
            target, args = self.match(rule)
            if target is None:
                continue
            if target in self.chains:
                verdict = self.chain(target)
                if verdict is not None:
                    return verdict
            elif target == "RETURN":
                return None
            elif target == "DNAT":
                return f"dnat to {_option(args, '--to-destination')}"
            elif target == "MARK":
                value, _, mask = _option(args, "--set-xmark").partition("/")
                self.mark = (self.mark & ~int(mask or "0xffffffff", 0)) ^ int(value, 0)
            elif target in _TERMINAL:
                return target.lower()
            elif target not in _NON_TERMINAL:
                raise Unsupported(f"iptables target {target}")
        return None

    def match(self, rule: Sequence[str]) -> tuple[str | None, list[str]]:
        """``(target, target args)`` when every match holds, else ``(None, [])``."""
        w = self.walk
        i, negate = 0, False
        while i < len(rule):
            token = rule[i]
            if token == "!":
                negate, i = True, i + 1
                continue
            if token in ("-j", "-g"):
                if token == "-g":
                    raise Unsupported("iptables goto")
                return rule[i + 1], list(rule[i + 2 :])
            value = rule[i + 1]
            i += 2
            if token == "-m":
                continue
            if token == "-p":
                ok = value in ("tcp", "6", "all")
            elif token in ("-s", "-d"):
                ok = (w.saddr if token == "-s" else w.daddr) in ipaddress.ip_network(value, strict=False)
            elif token == "-i":
                ok = INPUT_IF == value or (value.endswith("+") and INPUT_IF.startswith(value[:-1]))
            elif token in ("--dport", "--destination-port"):
                ok = _in_ports(w.port, value)
            elif token in ("--dports", "--destination-ports"):
                ok = any(_in_ports(w.port, part) for part in value.split(","))
            elif token == "--dst-type":
                ok = value == "LOCAL"  # the probe goes to a host-local address
            elif token == "--src-type":
                ok = False  # … from outside
            elif token == "--mark":
                want, _, mask = value.partition("/")
                ok = self.mark & int(mask or "0xffffffff", 0) == int(want, 0)
            elif token == "--ctstate":
                ok = "NEW" in value.split(",")
            elif token == "--comment":
                ok = True
            else:
                raise Unsupported(f"iptables option {token}")
            if ok == negate:
                return None, []
            negate = False
        return None, []  # no target: a counting rule


def _option(args: Sequence[str], name: str) -> str:
    return args[args.index(name) + 1]


def _in_ports(port: int, spec: str) -> bool:
    low, _, high = spec.partition(":")
    return int(low) <= port <= int(high or low)


# -- nftables (from the JSON of native tables) -------------------------------------------------


class _NftNat:
    """nftables semantics over the JSON ruleset, native (non-xtables) tables only."""

    def __init__(self, objects: Iterable[Mapping[str, Any]], walk: _Walk) -> None:
        self.walk = walk
        self.bases: list[tuple[int, tuple[str, str, str]]] = []
        self.rules: dict[tuple[str, str, str], list[list[dict[str, Any]]]] = {}
        self.sets: dict[tuple[str, str, str], list[Any]] = {}
        for obj in objects:
            kind, body = next(iter(obj.items()))
            if kind not in ("chain", "rule", "set", "map"):
                continue
            table = (body["family"], body["table"])
            if table in XTABLES or body["family"] not in ("ip", "inet"):
                continue
            if kind == "chain":
                key = (*table, body["name"])
                self.rules.setdefault(key, [])
                if body.get("type") == "nat" and body.get("hook") == "prerouting":
                    self.bases.append((int(body.get("prio", 0)), key))
            elif kind == "rule":
                self.rules.setdefault((*table, body["chain"]), []).append(body["expr"])
            else:
                self.sets[(*table, body["name"])] = body.get("elem", [])

    def run(self) -> str | None:
        for _, key in sorted(self.bases):
            verdict = self.chain(key)
            if verdict is not None and verdict != "accept":
                return verdict
        return None

    def chain(self, key: tuple[str, str, str]) -> str | None:
        self.walk.chains.append(key[2])
        for exprs in self.rules[key]:
            self.walk.evaluated += 1
            outcome = self.rule(key, exprs)
            if outcome is None:
                continue
            verb, arg = outcome
            if verb == "jump":
                verdict = self.chain((key[0], key[1], arg))
                if verdict is not None:
                    return verdict
            elif verb == "goto":
                return self.chain((key[0], key[1], arg))
            elif verb == "return":
                return None
            else:
                return arg
        return None

    def rule(self, key: tuple[str, str, str], exprs: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
        """``None`` when the rule does not match or issues no verdict; else ``(verb, arg)``:
        ``jump``/``goto`` + chain, ``return``, or ``final`` + verdict text."""
        for expr in exprs:
            kind, body = next(iter(expr.items()))
            if kind == "match":
                if not self.holds(key, body):
                    return None
            elif kind in ("counter", "mangle", "log", "notrack"):
                continue
            elif kind in ("jump", "goto"):
                return kind, body["target"]
            elif kind == "return":
                return "return", ""
            elif kind in ("accept", "drop", "reject", "masquerade", "snat", "redirect"):
                return "final", kind
            elif kind == "vmap":
                found = self.lookup(key, body["data"], self.value(body["key"]))
                if found is None:
                    return None
                return self.rule(key, [found])
            elif kind == "dnat":
                return self.dnat(key, body)
            else:
                raise Unsupported(f"nft statement {kind}")
        return None

    def dnat(self, key: tuple[str, str, str], body: Mapping[str, Any]) -> tuple[str, str] | None:
        addr = body.get("addr")
        if isinstance(addr, Mapping) and "map" in addr:
            found = self.lookup(key, addr["map"]["data"], self.value(addr["map"]["key"]))
            if found is None:
                return None  # a map miss ends the rule, as no match
            target, port = found["concat"] if isinstance(found, Mapping) else (found, body.get("port"))
        else:
            target, port = addr, body.get("port")
        return "final", f"dnat to {target}:{port}" if port is not None else f"dnat to {target}"

    def holds(self, key: tuple[str, str, str], match: Mapping[str, Any]) -> bool:
        left = self.value(match["left"])
        right, op = match["right"], match["op"]
        if isinstance(left, frozenset):  # flags: ct state / ct status
            flags = frozenset(right if isinstance(right, list) else [right])
            result = bool(left & flags) if op == "in" else left == flags
            return not result if op == "!=" else result
        if left is None:
            return False  # a field of another family: the implicit protocol dependency fails
        if isinstance(right, str) and right.startswith("@"):
            self.walk.lookups += 1
            found = any(_member(left, _elem(e)) for e in self._set(key, right))
        else:
            found = _member(left, right)
        if op in ("==", "in"):
            return found
        if op == "!=":
            return not found
        raise Unsupported(f"nft match operator {op}")

    def _set(self, key: tuple[str, str, str], ref: str) -> list[Any]:
        try:
            return self.sets[(key[0], key[1], ref[1:])]
        except KeyError:
            raise Unsupported(f"set {ref} not in table {key[0]} {key[1]}") from None

    def lookup(self, key: tuple[str, str, str], ref: Any, value: Any) -> Any:
        """The data of the map element matching ``value``, or ``None``."""
        self.walk.lookups += 1
        if value is None:
            return None
        elements = self._set(key, ref) if isinstance(ref, str) else ref["set"]
        for element in elements:
            if _member(value, _elem(element[0])):
                return element[1]
        return None

    def value(self, expr: Any) -> Any:
        """The probe packet's value for a left-hand expression (``None``: not this family)."""
        w = self.walk
        if not isinstance(expr, Mapping):
            raise Unsupported(f"nft expression {expr!r}")
        kind, body = next(iter(expr.items()))
        if kind == "concat":
            parts = tuple(self.value(e) for e in body)
            return None if None in parts else parts
        if kind == "payload":
            proto, field = body.get("protocol"), body.get("field")
            fields = {
                ("ip", "saddr"): w.saddr,
                ("ip", "daddr"): w.daddr,
                ("tcp", "dport"): w.port,
                ("th", "dport"): w.port,
                ("tcp", "sport"): SOURCE_PORT,
                ("th", "sport"): SOURCE_PORT,
            }
            if (proto, field) in fields:
                return fields[(proto, field)]
            if proto in ("ip6", "udp", "sctp", "icmp", "icmpv6"):
                return None
        elif kind == "meta":
            metas = {"l4proto": "tcp", "nfproto": "ipv4", "protocol": "ip", "iifname": INPUT_IF, "mark": 0}
            if body["key"] in metas:
                return metas[body["key"]]
        elif kind == "fib" and body.get("result") == "type" and "daddr" in body.get("flags", []):
            return "local"  # the probe goes to a host-local address
        elif kind == "ct" and body.get("key") in ("state", "status"):
            return frozenset({"new"} if body["key"] == "state" else ())
        raise Unsupported(f"nft expression {kind} {body}")


def _elem(element: Any) -> Any:
    """A set element without its ``{"elem": {"val": …, "comment": …}}`` wrapper."""
    if isinstance(element, Mapping) and "elem" in element:
        return element["elem"]["val"]
    return element


def _member(value: Any, right: Any) -> bool:
    """Whether the packet's ``value`` is matched by the literal, prefix, range, set or concat."""
    if isinstance(right, Mapping):
        kind, body = next(iter(right.items()))
        if kind == "prefix":
            return ipaddress.ip_address(value) in ipaddress.ip_network(f"{body['addr']}/{body['len']}")
        if kind == "range":
            return bool(_scalar(body[0]) <= _scalar(value) <= _scalar(body[1]))
        if kind == "set":
            return any(_member(value, _elem(e)) for e in body)
        if kind == "concat":
            return isinstance(value, tuple) and len(value) == len(body) and all(map(_member, value, body))
        raise Unsupported(f"nft value {kind}")
    if isinstance(right, list):
        return any(_member(value, r) for r in right)
    return bool(_scalar(value) == _scalar(right))


def _scalar(value: Any) -> Any:
    if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(ipaddress.ip_address(value))
        except ValueError:
            return value
    return value

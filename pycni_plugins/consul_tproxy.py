"""consul-cni in process: Consul's transparent-proxy redirection, as nftables, in the container.

What it replaces
----------------
Nomad appends ``{"type": "consul-cni"}`` to the bridge conflist of a group whose sidecar has
``transparent_proxy`` and passes the proxy settings as JSON in ``CNI_ARGS``
(``CONSUL_IPTABLES_CONFIG``, Consul's ``iptables.Config``). consul-cni (consul-k8s
``control-plane/cni``) decodes it and runs consul/sdk ``iptables.Setup(cfg, dualStack=false)``:
about 20 ``iptables -t nat`` commands, one process each, through ``nsenter --net=<CNI_NETNS>``,
not atomic. This plugin reads the same arguments, fails with the same messages, passes the
prevResult through the same way, and installs rules with the same effect and evaluation order
as **one nftables transaction in the container's namespace**, in its own table
``table ip pycni_tproxy`` (IPv4 only, like Consul's IPv4 pass; Nomad never asks for dual stack).

The mapping, rule by rule
-------------------------
Consul's rules in the order ``SetupWithAdditionalRules`` emits them (hashicorp/consul
``sdk/iptables/iptables.go``; numbered here) and what they
become. Every nftables rule carries the iptables rule it implements as its ``comment``, so
``nft list table ip pycni_tproxy`` reads like ``iptables -t nat -S``::

    iptables -t nat …                                       nftables, table ip pycni_tproxy
    ---------------------------------------------------------------------------------------------
    (built-in nat PREROUTING, priority -100)                chain PREROUTING { type nat hook
                                                              prerouting priority dstnat; }
    (built-in nat OUTPUT, priority -100)                    chain OUTPUT { type nat hook output
                                                              priority -100; }
    1-5  -N CONSUL_PROXY_INBOUND, CONSUL_PROXY_IN_REDIRECT,  the same five regular chains (the DNS
         CONSUL_PROXY_OUTPUT, CONSUL_PROXY_REDIRECT,         chain always exists, empty when unused)
         CONSUL_DNS_REDIRECT
    6    -A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT        CONSUL_PROXY_REDIRECT:
           --to-port <out>                                    meta l4proto tcp redirect to :<out>
    7    DNS, only if ConsulDNSIP set and ConsulDNSPort 0:
         -A CONSUL_DNS_REDIRECT -p udp --dport 53           CONSUL_DNS_REDIRECT:
           -j DNAT --to-destination <ip>                      udp dport 53 dnat to <ip>
         (same with -p tcp)                                   tcp dport 53 dnat to <ip>
         -A OUTPUT -p udp --dport 53 -j CONSUL_DNS_REDIRECT OUTPUT: udp dport 53 jump CONSUL_DNS_REDIRECT
         (same with -p tcp)                                 OUTPUT: tcp dport 53 jump CONSUL_DNS_REDIRECT
         DNS, else if ConsulDNSPort set (ip defaults to 127.0.0.1):
         -A CONSUL_DNS_REDIRECT -p udp -d <ip> --dport 53   CONSUL_DNS_REDIRECT: ip daddr <ip>
           -j DNAT --to-destination <ip>:<port>               udp dport 53 dnat to <ip>:<port>
         (same with -p tcp)                                   (same with tcp)
         -A OUTPUT -p udp -d <ip> --dport 53                OUTPUT: ip daddr <ip> udp dport 53
           -j CONSUL_DNS_REDIRECT                             jump CONSUL_DNS_REDIRECT
         (same with -p tcp)                                   (same with tcp)
    8    -A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT            OUTPUT: meta l4proto tcp
                                                              jump CONSUL_PROXY_OUTPUT
    14   -I CONSUL_PROXY_OUTPUT -m owner --uid-owner <u>    CONSUL_PROXY_OUTPUT:
           -j RETURN, for each ExcludeUIDs u                  meta skuid @exclude_uids return
    13   -I CONSUL_PROXY_OUTPUT -d <c> -j RETURN,            ip daddr @exclude_outbound_cidrs
           for each ExcludeOutboundCIDRs c                     return
    12   -I CONSUL_PROXY_OUTPUT -p tcp --dport <p>           tcp dport @exclude_outbound_ports
           -j RETURN, for each ExcludeOutboundPorts p          return
    9    -A CONSUL_PROXY_OUTPUT -m owner --uid-owner        meta skuid <ProxyUserID> return
           <ProxyUserID> -j RETURN
    10   -A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN   ip daddr 127.0.0.1 return
    11   -A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT    jump CONSUL_PROXY_REDIRECT
    15   -A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT     CONSUL_PROXY_IN_REDIRECT:
           --to-port <in>                                     meta l4proto tcp redirect to :<in>
    16   -A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND       PREROUTING: meta l4proto tcp
                                                              jump CONSUL_PROXY_INBOUND
    18   -I CONSUL_PROXY_INBOUND -p tcp --dport <p>          CONSUL_PROXY_INBOUND:
           -j RETURN, for each ExcludeInboundPorts p          tcp dport @exclude_inbound_ports return
    17   -A CONSUL_PROXY_INBOUND -p tcp                      meta l4proto tcp
           -j CONSUL_PROXY_IN_REDIRECT                         jump CONSUL_PROXY_IN_REDIRECT

The right-hand column lists each chain's rules in **evaluation order**, which is Consul's
*effective* order: ``-I`` inserts at the top, so the exclusions added last are evaluated first
(UIDs, then CIDRs, then ports, each list last-to-first), all before the proxy-UID and
``127.0.0.1/32`` RETURNs and the redirect. Each list becomes one rule looking up a set
(``flags interval``: ranges and prefixes) instead of one rule per entry. That keeps the verdict:
every exclusion rule is a plain RETURN with no side effect, so "any entry matches → RETURN"
is what a run of them does, in whatever order; an empty set matches nothing, like the absent
rules of an empty list. The loopback exclusion is exactly ``127.0.0.1`` (``-d 127.0.0.1/32``):
TCP to 127.0.0.2 is redirected, as under Consul.

Values are parsed as iptables parses them: ports are decimal or ``/etc/services`` names, ``a:b``
ranges (empty ends meaning 0 and 65535); UIDs are user names (resolved here, on the host, as
the iptables binary resolves them) or numbers, ``a-b`` ranges; CIDRs
are IPv4 addresses with an optional prefix length or dotted mask (host bits are masked, as
iptables does). Overlapping entries are merged (nftables refuses overlapping interval
elements; the union has the same effect). Anything iptables would refuse (an IPv6 CIDR in this
IPv4 pass, ``"-1"`` as a port, a host name) fails the ADD, as the iptables command would.

Differences from consul-cni, on purpose
---------------------------------------
* Atomic and repeatable: the transaction replaces the whole table (``add``/``delete``/``add``),
  so a retried ADD neither fails on "Chain already exists" nor leaves half a rule set.
* DEL removes the table when the namespace still exists (a gone namespace is fine); consul-cni's
  DEL is a no-op. CHECK verifies the table: its chains and base-chain hooks, every chain's rules
  in order (by their comments, which carry the ports, addresses and UIDs) and the sets'
  elements, naming the first difference; consul-cni's CHECK is a no-op. A rule whose body was
  edited in place but kept its comment is not detected. Without ``CONSUL_IPTABLES_CONFIG``
  (a runtime that passes no args to CHECK) only the chains are checked.
* Only Nomad's path: without ``CONSUL_IPTABLES_CONFIG``, consul-cni would read the rules from a
  Kubernetes pod annotation; that is refused here with an explicit error.
* No prevResult: consul-cni fakes a result labelled ``0.3.1`` (which Go prints only for a 0.3.1
  config); here the empty result is printed at the config's version.
"""

from __future__ import annotations

import ipaddress
import pwd
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from pycni import _json, netns
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import Plugin, PluginRequest
from pycni.types import parse_result
from pycni.types.consul import IptablesConfig

from ._common import emit, fail, in_netns, netns_gone, prev_result
from .kernel import nft

__all__ = [
    "ConsulTproxyPlugin",
    "Ruleset",
    "decode_config",
    "ruleset",
    "verify",
    "FAMILY",
    "TABLE",
    "DEFAULT_OUTBOUND_PORT",
]

FAMILY = "ip"
TABLE = "pycni_tproxy"
DEFAULT_OUTBOUND_PORT = 15001
KNOWN_ARGS = ("IP", "K8S_POD_NAME", "K8S_POD_NAMESPACE", "K8S_POD_INFRA_CONTAINER_ID", "CONSUL_IPTABLES_CONFIG")

INBOUND = "CONSUL_PROXY_INBOUND"
IN_REDIRECT = "CONSUL_PROXY_IN_REDIRECT"
OUTPUT = "CONSUL_PROXY_OUTPUT"
REDIRECT = "CONSUL_PROXY_REDIRECT"
DNS = "CONSUL_DNS_REDIRECT"
#: Base chains (type, hook, priority) as iptables' nat table has them.
BASE_CHAINS = {"PREROUTING": ("nat", "prerouting", -100), "OUTPUT": ("nat", "output", -100)}
CHAINS = (INBOUND, IN_REDIRECT, OUTPUT, REDIRECT, DNS, *BASE_CHAINS)

_T = f"{FAMILY} {TABLE}"
_UID_MAX = 0xFFFFFFFE  # iptables' owner match: UINT32_MAX - 1
_SETUP = "could not apply iptables setup"


# -- CONSUL_IPTABLES_CONFIG: Go's json.Unmarshal into consul/sdk iptables.Config ---------------


# Go field name, attribute, Go type. Keys match case-insensitively, as encoding/json does.
_FIELDS = (
    ("ConsulDNSIP", "consul_dns_ip", "string"),
    ("ConsulDNSPort", "consul_dns_port", "int"),
    ("ProxyUserID", "proxy_user_id", "string"),
    ("ProxyInboundPort", "proxy_inbound_port", "int"),
    ("ProxyOutboundPort", "proxy_outbound_port", "int"),
    ("ExcludeInboundPorts", "exclude_inbound_ports", "[]string"),
    ("ExcludeOutboundPorts", "exclude_outbound_ports", "[]string"),
    ("ExcludeOutboundCIDRs", "exclude_outbound_cidrs", "[]string"),
    ("ExcludeUIDs", "exclude_uids", "[]string"),
    ("NetNS", "netns", "string"),
    ("IptablesProvider", "", "iptables.Provider"),
)
_CONFIG_FIELDS = _json.GoFields(*(go for go, _, _ in _FIELDS))
_BY_NAME = {go: (go, attr, kind) for go, attr, kind in _FIELDS}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _go_kind(value: Any, *, literal: bool = False) -> str:
    """What Go's ``UnmarshalTypeError`` calls a JSON value (numbers with their text for ints)."""
    if literal and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"number {value}"
    return _json.go_kind(value)


class _Mismatch(Exception):
    def __init__(self, value: Any, go_type: str) -> None:
        super().__init__(go_type)
        self.what = _go_kind(value, literal=go_type == "int")
        self.go_type = go_type


def _decode_field(value: Any, kind: str) -> Any:
    if kind == "string":
        if not isinstance(value, str):
            raise _Mismatch(value, "string")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or not _INT64[0] <= value <= _INT64[1]:
            raise _Mismatch(value, "int")
        return value
    if kind == "[]string":
        if not isinstance(value, list):
            raise _Mismatch(value, "[]string")
        out = []
        for item in value:
            if item is not None and not isinstance(item, str):
                raise _Mismatch(item, "string")
            out.append(item or "")  # null in a []string is ""
        return tuple(out)
    raise _Mismatch(value, kind)  # IptablesProvider: an interface, nothing decodes into it


def decode_config(text: str) -> IptablesConfig:
    """``json.Unmarshal`` of the CNI arg into ``iptables.Config`` (consul-cni's messages)."""
    try:
        raw = _json.loads(text)
    except _json.JSONDecodeFailure as e:
        raise fail(f"could not unmarshal CNI args: {e}") from None
    if raw is None:
        return IptablesConfig()
    if not isinstance(raw, dict):
        problem = f"json: cannot unmarshal {_go_kind(raw)} into Go value of type iptables.Config"
        raise fail(f"could not unmarshal CNI args: {problem}")
    values: dict[str, Any] = {}
    first: str | None = None
    for name, value in _CONFIG_FIELDS.pairs(raw):
        if value is None:  # unknown keys are ignored, null leaves the zero value
            continue
        go, attr, kind = _BY_NAME[name]
        try:
            values[attr] = _decode_field(value, kind)
        except _Mismatch as e:
            # Go keeps decoding and reports the earliest type error.
            first = first or f"json: cannot unmarshal {e.what} into Go struct field Config.{go} of type {e.go_type}"
    if first is not None:
        raise fail(f"could not unmarshal CNI args: {first}")
    return IptablesConfig(**values)


# -- the rules ----------------------------------------------------------------------------------

Interval = tuple[int, int]


@attrs.frozen
class _Set:
    name: str
    type: str
    intervals: tuple[Interval, ...]
    render: str  # "int" or "ipv4"

    def element(self, iv: Interval) -> str:
        text = str if self.render == "int" else (lambda v: str(ipaddress.IPv4Address(v)))
        lo, hi = iv
        return text(lo) if lo == hi else f"{text(lo)}-{text(hi)}"


@attrs.frozen
class _Rule:
    chain: str
    body: str  # nft rule text
    iptables: str  # the Consul rule it implements; also the nft comment


@attrs.frozen
class Ruleset:
    """The table for one config: sets (merged intervals) and each chain's rules in order."""

    sets: tuple[_Set, ...]
    rules: tuple[_Rule, ...]

    def commands(self) -> list[str]:
        """One transaction that replaces ``table ip pycni_tproxy`` with this rule set."""
        out = [f"add table {_T}", f"delete table {_T}", f"add table {_T}"]
        for s in self.sets:
            out.append(f"add set {_T} {s.name} {{ type {s.type}; flags interval; }}")
            if s.intervals:
                out.append(f"add element {_T} {s.name} {{ {', '.join(map(s.element, s.intervals))} }}")
        for chain in CHAINS:
            base = BASE_CHAINS.get(chain)
            spec = f" {{ type {base[0]} hook {base[1]} priority {base[2]}; policy accept; }}" if base else ""
            out.append(f"add chain {_T} {chain}{spec}")
        out += [f'add rule {_T} {r.chain} {r.body} comment "{r.iptables}"' for r in self.rules]
        return out

    def chain_rules(self, chain: str) -> list[str]:
        return [r.iptables for r in self.rules if r.chain == chain]


def _setup_error(msg: str) -> CNIError:
    return fail(f"{_SETUP}: {msg}")


def _merge(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _port(text: str, field: str) -> int:
    if text.isascii() and text.isdigit() and int(text) <= 0xFFFF:
        return int(text)
    try:
        if text and text.isascii() and text.isprintable() and not text.isdigit():
            return socket.getservbyname(text, "tcp")
    except OSError:
        pass
    raise _setup_error(f"{field}: invalid port/service `{text}' specified")


def _port_interval(text: str, field: str) -> Interval:
    """iptables' ``--dport``: a port or service, or ``[lo]:[hi]``."""
    lo_text, sep, hi_text = text.partition(":")
    if not sep:
        port = _port(text, field)
        return port, port
    lo = _port(lo_text, field) if lo_text else 0
    hi = _port(hi_text, field) if hi_text else 0xFFFF
    if lo > hi:
        raise _setup_error(f"{field}: invalid portrange (min > max)")
    return lo, hi


def _uid_interval(text: str, field: str) -> Interval:
    """iptables' ``--uid-owner``: a user name, else ``uid[-uid]`` (``:`` works too)."""
    if text and "\0" not in text:
        try:
            uid = pwd.getpwnam(text).pw_uid
            return uid, uid
        except KeyError:
            pass
    lo_text, _, hi_text = text.replace(":", "-", 1).partition("-")
    bounds = [lo_text, hi_text or lo_text]
    if all(b.isascii() and b.isdigit() and int(b) <= _UID_MAX for b in bounds):
        lo, hi = int(bounds[0]), int(bounds[1])
        if lo <= hi:
            return lo, hi
    raise _setup_error(f'{field}: owner: Bad value for "--uid-owner" option: "{text}"')


def _cidr_interval(text: str, field: str) -> Interval:
    """iptables' ``-d``: an IPv4 address with an optional prefix length or dotted mask."""
    try:
        net = ipaddress.IPv4Network(text, strict=False)
    except ValueError:
        raise _setup_error(f"{field}: host/network `{text.partition('/')[0]}' not found") from None
    return int(net.network_address), int(net.broadcast_address)


def _check_port(value: int, field: str, low: int = 1) -> int:
    if not low <= value <= 0xFFFF:
        raise _setup_error(f"{field}: invalid port/service `{value}' specified")
    return value


def _dns_ip(text: str) -> str:
    """``verifyDualStackConfig`` for the IPv4-only setup (Go's ``net.ParseIP`` rules)."""
    try:
        if "%" in text:
            raise ValueError(text)
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise _setup_error("unable to parse consulDNSIP") from None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is None:
            raise _setup_error("for non dual stack setup ipv4 consulDNSIP required")
        ip = ip.ipv4_mapped
    return str(ip)


def ruleset(cfg: IptablesConfig) -> Ruleset:
    """consul/sdk ``Setup(cfg, dualStack=false)`` as nftables (errors are consul-cni's)."""
    dns_ip = _dns_ip(cfg.consul_dns_ip) if cfg.consul_dns_ip else ""
    if not cfg.proxy_user_id:
        raise _setup_error("ProxyUserID is required to set up traffic redirection")
    if cfg.proxy_inbound_port == 0:
        raise _setup_error("ProxyInboundPort is required to set up traffic redirection")
    inbound = _check_port(cfg.proxy_inbound_port, "ProxyInboundPort")
    outbound = _check_port(cfg.proxy_outbound_port or DEFAULT_OUTBOUND_PORT, "ProxyOutboundPort")
    dns_port = _check_port(cfg.consul_dns_port, "ConsulDNSPort", low=0)
    proxy_uid = _uid_interval(cfg.proxy_user_id, "ProxyUserID")
    uid_match = str(proxy_uid[0]) if proxy_uid[0] == proxy_uid[1] else f"{proxy_uid[0]}-{proxy_uid[1]}"

    def intervals(values: tuple[str, ...] | None, parse: Any, field: str) -> tuple[Interval, ...]:
        return _merge(parse(v, field) for v in values or ())

    sets = (
        _Set("exclude_uids", "uid", intervals(cfg.exclude_uids, _uid_interval, "ExcludeUIDs"), "int"),
        _Set(
            "exclude_outbound_cidrs",
            "ipv4_addr",
            intervals(cfg.exclude_outbound_cidrs, _cidr_interval, "ExcludeOutboundCIDRs"),
            "ipv4",
        ),
        _Set(
            "exclude_outbound_ports",
            "inet_service",
            intervals(cfg.exclude_outbound_ports, _port_interval, "ExcludeOutboundPorts"),
            "int",
        ),
        _Set(
            "exclude_inbound_ports",
            "inet_service",
            intervals(cfg.exclude_inbound_ports, _port_interval, "ExcludeInboundPorts"),
            "int",
        ),
    )

    rules = [
        _Rule(
            REDIRECT,
            f"meta l4proto tcp redirect to :{outbound}",
            f"-A {REDIRECT} -p tcp -j REDIRECT --to-port {outbound}",
        )
    ]
    if dns_ip and dns_port == 0:
        for proto in ("udp", "tcp"):
            rules.append(
                _Rule(
                    DNS,
                    f"{proto} dport 53 dnat to {dns_ip}",
                    f"-A {DNS} -p {proto} --dport 53 -j DNAT --to-destination {dns_ip}",
                )
            )
        for proto in ("udp", "tcp"):
            rules.append(_Rule("OUTPUT", f"{proto} dport 53 jump {DNS}", f"-A OUTPUT -p {proto} --dport 53 -j {DNS}"))
    elif dns_port != 0:
        ip = dns_ip or "127.0.0.1"
        for proto in ("udp", "tcp"):
            rules.append(
                _Rule(
                    DNS,
                    f"ip daddr {ip} {proto} dport 53 dnat to {ip}:{dns_port}",
                    f"-A {DNS} -p {proto} -d {ip} --dport 53 -j DNAT --to-destination {ip}:{dns_port}",
                )
            )
        for proto in ("udp", "tcp"):
            rules.append(
                _Rule(
                    "OUTPUT",
                    f"ip daddr {ip} {proto} dport 53 jump {DNS}",
                    f"-A OUTPUT -p {proto} -d {ip} --dport 53 -j {DNS}",
                )
            )
    rules += [
        _Rule("OUTPUT", f"meta l4proto tcp jump {OUTPUT}", f"-A OUTPUT -p tcp -j {OUTPUT}"),
        # Effective order of Consul's -I insertions: UIDs, CIDRs, ports (see the module docstring).
        _Rule(OUTPUT, "meta skuid @exclude_uids return", f"-I {OUTPUT} -m owner --uid-owner <ExcludeUIDs> -j RETURN"),
        _Rule(OUTPUT, "ip daddr @exclude_outbound_cidrs return", f"-I {OUTPUT} -d <ExcludeOutboundCIDRs> -j RETURN"),
        _Rule(
            OUTPUT,
            "tcp dport @exclude_outbound_ports return",
            f"-I {OUTPUT} -p tcp --dport <ExcludeOutboundPorts> -j RETURN",
        ),
        _Rule(
            OUTPUT, f"meta skuid {uid_match} return", f"-A {OUTPUT} -m owner --uid-owner {cfg.proxy_user_id} -j RETURN"
        ),
        _Rule(OUTPUT, "ip daddr 127.0.0.1 return", f"-A {OUTPUT} -d 127.0.0.1/32 -j RETURN"),
        _Rule(OUTPUT, f"jump {REDIRECT}", f"-A {OUTPUT} -j {REDIRECT}"),
        _Rule(
            IN_REDIRECT,
            f"meta l4proto tcp redirect to :{inbound}",
            f"-A {IN_REDIRECT} -p tcp -j REDIRECT --to-port {inbound}",
        ),
        _Rule("PREROUTING", f"meta l4proto tcp jump {INBOUND}", f"-A PREROUTING -p tcp -j {INBOUND}"),
        _Rule(
            INBOUND,
            "tcp dport @exclude_inbound_ports return",
            f"-I {INBOUND} -p tcp --dport <ExcludeInboundPorts> -j RETURN",
        ),
        _Rule(INBOUND, f"meta l4proto tcp jump {IN_REDIRECT}", f"-A {INBOUND} -p tcp -j {IN_REDIRECT}"),
    ]
    for rule in rules:
        # A comment is at most 128 bytes; the user name is the only free text (a name iptables knew).
        if len(rule.iptables.encode()) > 128 or '"' in rule.iptables or "\\" in rule.iptables:
            raise _setup_error(f"rule too long or unprintable: {rule.iptables[:60]}…")
    return Ruleset(sets, tuple(rules))


# -- CHECK: compare the table in the namespace with the rule set --------------------------------


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


# -- the plugin ---------------------------------------------------------------------------------


def _check_conf(config: Mapping[str, Any]) -> None:
    """consul-cni's ``parseConfig`` type checks (its ``PluginConf``; unknown keys are ignored)."""
    checks = (
        ("cniVersion", str, "string"),
        ("name", str, "string"),
        ("type", str, "string"),
        ("cni_bin_dir", str, "string"),
        ("cni_net_dir", str, "string"),
        ("kubeconfig", str, "string"),
        ("log_level", str, "string"),
        ("multus", bool, "bool"),
        ("runtime_config", dict, "struct {}"),
    )
    for key, typ, go in checks:
        value = _json.go_field(config, key)
        if value is None or (isinstance(value, typ) and (typ is bool or not isinstance(value, bool))):
            continue
        raise fail(
            "failed to parse network configuration: "
            f"json: cannot unmarshal {_go_kind(value)} into Go struct field PluginConf.{key} of type {go}"
        )


def _load_args(request: PluginRequest) -> dict[str, str]:
    """``types.LoadArgs`` into consul-cni's ``CNIArgs``; ``IP`` is a ``net.IP`` (parsed in place)."""
    for pair in request.args.split(";") if request.args else ():
        parts = pair.split("=")
        if len(parts) != 2 or parts[0] == "IgnoreUnknown":
            break  # load_args reports these (in order, as Go does)
        if parts[0] == "IP" and parts[1]:
            try:
                if "%" in parts[1]:
                    raise ValueError(parts[1])
                ipaddress.ip_address(parts[1])
            except ValueError:
                raise fail(
                    f"ARGS: error parsing value of pair {_json.dumps_compact(pair)}: invalid IP address: {parts[1]}"
                ) from None
    return request.load_args(*KNOWN_ARGS)


def _raw_config(request: PluginRequest) -> str:
    """``CONSUL_IPTABLES_CONFIG`` after consul-cni's argument checks ("" = none, on CHECK only)."""
    args = _load_args(request)
    raw = args.get("CONSUL_IPTABLES_CONFIG", "")
    if raw:
        return raw
    if not (args.get("K8S_POD_NAMESPACE") and args.get("K8S_POD_NAME")):
        if request.command == "CHECK":
            return ""
        raise fail("not running in a pod, namespace and pod should have values")
    raise fail(
        "pycni's consul-cni serves only Nomad (CONSUL_IPTABLES_CONFIG in CNI_ARGS): "
        f"Kubernetes pod {args['K8S_POD_NAMESPACE']}/{args['K8S_POD_NAME']} is not supported"
    )


def _require_netns(request: PluginRequest) -> None:
    # skel's check, before the plugin runs; without it Consul's executor would use *this* netns.
    if not request.netns:
        raise CNIError("required env variables [CNI_NETNS] missing", code=ErrorCode.INVALID_ENVIRONMENT_VARIABLES)


def _prev(request: PluginRequest) -> Any:
    try:
        return prev_result(request)
    except CNIError as e:
        raise fail(f"could not parse prevResult: {e.msg}", e.details) from e


def _list_table() -> list[dict[str, Any]] | None:
    return nft.list_table(FAMILY, TABLE)


def _remove_table() -> None:
    nft.run([f"add table {_T}", f"delete table {_T}"])


class ConsulTproxyPlugin(Plugin):
    """``consul-cni`` (Nomad's path) with nftables instead of iptables."""

    type = "consul-cni"

    def validate(self, request: PluginRequest) -> None:
        _require_netns(request)
        _check_conf(request.config)
        ruleset(decode_config(_raw_config(request)))

    def add(self, request: PluginRequest) -> dict[str, Any]:
        # consul-cni's order: config, args, pod check, prevResult, the tproxy JSON, Setup.
        _require_netns(request)
        _check_conf(request.config)
        prev = _prev(request)
        raw = _raw_config(request)
        if prev is not None and not prev.ips:
            raise fail("got no container IPs")
        cfg = attrs.evolve(decode_config(raw), netns=request.netns)  # CNI_NETNS wins over the JSON's
        rules = ruleset(cfg)
        try:
            in_netns(request.netns, nft.run, rules.commands())
        except nft.NftError as e:
            raise fail(f"{_SETUP}: {e.msg}", e.details) from e
        if prev is None:
            return parse_result({"cniVersion": request.cni_version}).to_json()
        return emit(prev, request)

    def check(self, request: PluginRequest) -> None:
        _require_netns(request)
        _check_conf(request.config)
        raw = _raw_config(request)
        expected = ruleset(decode_config(raw)) if raw else None
        try:
            objects = in_netns(request.netns, _list_table)
        except nft.NftError as e:
            raise fail(f"consul-cni: cannot list table {_T}: {e.msg}", e.details) from e
        problem = verify(objects, expected)
        if problem is not None:
            raise fail(f"consul-cni: {problem} in netns {request.netns}")

    def delete(self, request: PluginRequest) -> None:
        # consul-cni's DEL is a no-op; removing the table matters when the namespace outlives it.
        if not request.netns:
            return
        try:
            netns.run_in(request.netns, _remove_table)
        except netns.NetnsError as e:
            if netns_gone(e):
                return
            raise fail(str(e)) from e
        except nft.NftError as e:
            raise fail(f"consul-cni: failed to remove {FAMILY} {TABLE}: {e.msg}", e.details) from e

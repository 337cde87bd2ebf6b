"""consul/sdk's ``iptables.Setup(cfg, dualStack=false)`` as one nftables rule set, for ``table ip
pycni_tproxy``.

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
"""

from __future__ import annotations

import ipaddress
import pwd
import socket
from collections.abc import Iterable
from typing import Any

import attrs

from pycni.errors import CNIError
from pycni.types.consul import IptablesConfig

from .._common import fail

FAMILY = "ip"
TABLE = "pycni_tproxy"
DEFAULT_OUTBOUND_PORT = 15001

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

"""The host filters as the judge walks them: tables of chains of rules of matches (what the
nftables and the legacy iptables readers build), the attachment judged and its flows, a finding;
and what both readers share (an address match's network, xtables' targets that decide nothing)."""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Tri(enum.Enum):
    """How much of a flow a match covers."""

    NO = 0
    PART = 1  # a known part (a protocol, a port, a rate limit)
    MAYBE = 2  # cannot tell
    YES = 3


# --- the model ------------------------------------------------------------------------------------


#: How the judge names firewalld's table.
FIREWALLD_TABLE = "table inet firewalld"


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
    #: In a table iptables writes, where the firewall plugin's compatibility step puts its accepts.
    iptables: bool = False

    @property
    def answered(self) -> bool:
        """A drop the firewall plugin's ADD answers: its iptables compatibility step, or the
        firewalld zone sources it adds where firewalld's table drops."""
        return self.iptables or self.where.startswith(FIREWALLD_TABLE)

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


# --- what both readers share ----------------------------------------------------------------------


def _net(text: Any, length: Any = None) -> IPNetwork | None:
    try:
        if length is not None:
            return ipaddress.ip_network(f"{text}/{length}", strict=False)
        return ipaddress.ip_network(str(text), strict=False)
    except ValueError:
        return None


_XT_NEUTRAL_TARGETS = {"LOG", "NFLOG", "MARK", "CONNMARK", "TCPMSS", "CT", "TRACE", "DSCP", "TOS", "CLASSIFY"}
_XT_NEUTRAL_TARGETS |= {"CHECKSUM", "AUDIT", "TEE", "SECMARK", "CONNSECMARK", "IDLETIMER", "LED", "ULOG"}

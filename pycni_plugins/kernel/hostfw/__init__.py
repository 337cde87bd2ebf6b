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

import time
from collections.abc import Collection
from typing import Any

import attrs

from pycni.errors import CNIError, ErrorCode

from .. import nfnl, sysctl
from ..nft.transport import READ_RETRIES, VERIFY_EVERY, NftError, memo
from .judging import admin_rule, iptables_rule, judge, judge_chain
from .legacy import parse_legacy, read_legacy
from .model import Chain, Cond, Filter, Finding, Flow, IPNetwork, Rule, Target, Tri, flows
from .nftables import filter_from_json, read_nftables

__all__ = [
    "Tri",
    "Cond",
    "Rule",
    "Chain",
    "Filter",
    "Target",
    "Flow",
    "Finding",
    "IPNetwork",
    "flows",
    "judge",
    "judge_chain",
    "admin_rule",
    "iptables_rule",
    "filter_from_json",
    "read_nftables",
    "parse_legacy",
    "read_legacy",
    "filters",
    "bridged_hooks",
    "uplinks",
    "inspect",
    "check",
]


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
    """The interfaces the calling thread's namespace's default routes leave through
    (:func:`.ifconfig.default_route_indexes`), by IP version."""
    from ..ifconfig import default_route_indexes
    from ..links import get_link, iproute

    out: dict[int, tuple[str, ...]] = {}
    with iproute() as ipr:
        for version in (4, 6):
            found = (get_link(ipr, index=index) for index in default_route_indexes(ipr, (version,)))
            out[version] = tuple(link.name for link in found if link is not None)
    return out


def inspect(target: Target, only: Collection[str] | None = None) -> list[Finding]:
    """What of the calling thread's namespace's filtering drops ``target``'s traffic (the flows
    named in ``only``: ``egress``, ``replies``, ``bridged``, ``inbound``). The nftables part is
    memoised by generation; legacy iptables, br_netfilter's sysctls and the default routes'
    interfaces for :data:`VERIFY_EVERY` seconds."""
    found = filters()
    around = _surroundings(memo())
    return judge(found, target, around.bridged, around.uplinks, only)


def check(
    target: Target, only: Collection[str] | None = None, code: int = ErrorCode.INTERNAL, *, answered: bool = True
) -> None:
    """Raise ``code`` naming the first base chain that certainly drops ``target``'s traffic, the
    others in the details with the rule that lets it through. A "may drop" finding fails
    nothing: a judge unsure of a foreign rule must not fail a CHECK or a STATUS (which makes
    orchestrators call the network not ready) on a host where the traffic may well pass.
    Without ``answered``, the drops the firewall plugin's ADD answers are left out: iptables'
    ``FORWARD`` (its compatibility step) and firewalld's zones (its zone sources)."""
    try:
        found = [f for f in inspect(target, only) if f.certain and (answered or not f.answered)]
    except (NftError, OSError) as e:
        raise CNIError(f"cannot read the host's firewall: {e}", code=ErrorCode.INTERNAL) from e
    if found:
        fix = f"let it through: {found[0].remedy}" if found[0].remedy else ""
        raise CNIError(found[0].message, "; ".join([*(f.message for f in found[1:]), fix]).strip("; "), code=code)

"""Forced cleanup of an allocation's NAT leftovers when CNI DEL failed (Nomad's ``forceCleanup``).

DEL fails when the pause container or netns vanished underneath the client; the reference
plugins' host rules then leak (Nomad #6385, #18842). This removes, for one ``(network, alloc)``:

(a) the reference plugins' iptables-nft state in ``ip nat`` and ``ip6 nat``: the bridge plugin's
    masquerade chain ``CNI-<sha512(network+alloc)[:24]>`` with the POSTROUTING rule(s) jumping to
    it, and the portmap plugin's ``CNI-DN-<…[:21]>`` chain with its CNI-HOSTPORT-DNAT entry rules;
(b) pycni's own nftables state for the attachment, through a pluggable ``own_state`` hook.

The network name is a parameter (Nomad hard-codes "nomad": hashicorp/nomad#16455). A rule is the alloc's
when it jumps to one of its chains, or when it carries its comment (``name: "<net>" id: "<id>"``)
and jumps to a ``CNI-<hex>`` chain: iptables-nft 1.8 keeps ``-m comment`` as an opaque xt match
that nft JSON does not show, so the chain name, which the plugins derive from the same pair, is
the reliable key; a visible comment naming another owner vetoes the match. What a family holds
is deleted by handle, chains flushed and deleted, in one nftables transaction per family: as in
Nomad, IPv6 is best effort (its failure is logged and does not stop IPv4), IPv4 failures are the
result. Alloc ids are UUIDs; Nomad's rule regex takes only hex digits and dashes there, so any
other id is refused rather than matched loosely.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from .. import _json
from ..errors import CNIError
from ..sdk import hooks
from .errors import CleanupError

__all__ = [
    "NatTables",
    "PluginNat",
    "CleanupReport",
    "OwnStateHook",
    "force_cleanup",
    "remove_nat_leftovers",
    "masquerade_chain",
    "masquerade_comment",
    "dnat_chain",
    "dnat_comment",
]

log = logging.getLogger("pycni.nomad")

FAMILIES = ("ip6", "ip")  # Nomad: IPv6 best effort first, then IPv4
TABLE = "nat"
_CNI_CHAIN = re.compile(r"CNI-[0-9A-Fa-f]+")
_DNAT_CHAIN = re.compile(r"CNI-DN-[0-9A-Fa-f]+")
_ALLOC_ID = re.compile(r"[0-9A-Fa-f-]+")  # Nomad's ipRuleRe: id: \"([[:xdigit:]-]+)\"
_MAX_COMMENT = 255

OwnStateHook = Callable[[str, str], Iterable[str]]
"""``(network, container_id) -> descriptions of what it removed``; raises CNIError on failure."""


def _hash(network: str, container_id: str) -> str:
    return hashlib.sha512((network + container_id).encode()).hexdigest()


def masquerade_chain(network: str, container_id: str) -> str:
    """The bridge plugin's per-container masquerade chain (``utils.FormatChainName``)."""
    return ("CNI-" + _hash(network, container_id))[:28]


def dnat_chain(network: str, container_id: str) -> str:
    """The portmap plugin's per-container DNAT chain (``FormatChainNameWithPrefix(…, "DN-")``)."""
    return ("CNI-DN-" + _hash(network, container_id))[:28]


def masquerade_comment(network: str, container_id: str) -> str:
    return f"name: {_json.go_quote(network)} id: {_json.go_quote(container_id)}"


def dnat_comment(network: str, container_id: str) -> str:
    comment = f'dnat name: "{network}" id: "{container_id}"'
    return comment if len(comment) <= _MAX_COMMENT else comment[: _MAX_COMMENT - 2] + "..."


class NatTables(Protocol):
    """The nftables operations cleanup needs, in the host namespace."""

    def list_nat(self, family: str) -> list[Mapping[str, Any]] | None:
        """The JSON objects of table ``<family> nat``; None when there is no such table."""

    def apply(self, commands: Sequence[Mapping[str, Any]]) -> None:
        """Run ``commands`` (libnftables JSON) as one transaction; raise CleanupError on failure."""


class PluginNat:
    """:class:`NatTables` over the plugin package's one libnftables wrapper (hooks
    ``nft-list-table`` and ``nft-apply``), in the namespace of the calling thread."""

    def list_nat(self, family: str) -> list[Mapping[str, Any]] | None:
        try:
            objects: list[Mapping[str, Any]] | None = hooks.hook(hooks.NFT_LIST_TABLE)(family, TABLE)
        except CNIError as e:
            raise CleanupError(f"failed to list iptables rules: {e.details or e.msg}") from None
        except (ImportError, OSError) as e:
            raise CleanupError(f"failed to detect iptables: libnftables unavailable: {e}") from None
        return objects

    def apply(self, commands: Sequence[Mapping[str, Any]]) -> None:
        try:
            hooks.hook(hooks.NFT_APPLY)(commands)
        except CNIError as e:
            raise CleanupError("nftables transaction failed", e.details or e.msg) from None


@attrs.frozen
class CleanupReport:
    """What forced cleanup removed for ``alloc_id`` on ``network``."""

    network: str
    alloc_id: str
    removed: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"network": self.network, "allocID": self.alloc_id, "removed": list(self.removed)}


@attrs.frozen
class _Rule:
    """What cleanup needs of one nft JSON rule: where it is, where it jumps, its visible comment."""

    chain: str
    handle: int
    target: str
    comment: str | None
    has_source: bool

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> _Rule | None:
        rule = obj.get("rule")
        if not isinstance(rule, Mapping) or not isinstance(rule.get("handle"), int):
            return None
        target, has_source = "", False
        for expr in rule.get("expr") or ():
            if not isinstance(expr, Mapping):
                continue
            for verdict in ("jump", "goto"):
                if isinstance(expr.get(verdict), Mapping):
                    target = str(expr[verdict].get("target", ""))
            match = expr.get("match")
            if isinstance(match, Mapping) and isinstance(match.get("left"), Mapping):
                payload = match["left"].get("payload")
                has_source = has_source or (isinstance(payload, Mapping) and payload.get("field") == "saddr")
        comment = rule.get("comment")
        return cls(
            chain=str(rule.get("chain", "")),
            handle=rule["handle"],
            target=target,
            comment=comment if isinstance(comment, str) else None,
            has_source=has_source,
        )


def _plan(
    family: str, objects: Iterable[Mapping[str, Any]], network: str, alloc_id: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """The transaction commands and report lines for one family's nat table."""
    objects = list(objects)
    chains = {o["chain"].get("name") for o in objects if isinstance(o.get("chain"), Mapping)}
    rules = [r for r in map(_Rule.from_json, objects) if r is not None]
    masq_comment, dnat_cmt = masquerade_comment(network, alloc_id), dnat_comment(network, alloc_id)
    owned = {masquerade_chain(network, alloc_id), dnat_chain(network, alloc_id)}
    for rule in rules:
        if rule.chain == "POSTROUTING" and rule.comment == masq_comment:
            # Nomad's regex wants "-s <cidr> … -j CNI-<hex>"; anything else it refuses to guess at.
            if not (_CNI_CHAIN.fullmatch(rule.target) and rule.has_source):
                raise CleanupError(f"failed to parse postrouting rule for alloc {alloc_id}")
            owned.add(rule.target)
        elif rule.chain == "CNI-HOSTPORT-DNAT" and rule.comment == dnat_cmt and _DNAT_CHAIN.fullmatch(rule.target):
            owned.add(rule.target)
    owned &= chains
    doomed = [
        r for r in rules if r.target in owned and r.chain not in owned and r.comment in (None, masq_comment, dnat_cmt)
    ]

    commands: list[dict[str, Any]] = []
    report: list[str] = []
    for rule in doomed:
        ref = {"family": family, "table": TABLE, "chain": rule.chain, "handle": rule.handle}
        commands.append({"delete": {"rule": ref}})
        report.append(f"{family} {TABLE} {rule.chain} rule handle {rule.handle} (jump {rule.target})")
    for chain in sorted(owned):
        ref = {"family": family, "table": TABLE, "name": chain}
        commands += [{"flush": {"chain": ref}}, {"delete": {"chain": ref}}]
        count = sum(1 for r in rules if r.chain == chain)
        report.append(f"{family} {TABLE} chain {chain} ({count} rule{'' if count == 1 else 's'})")
    return commands, report


def remove_nat_leftovers(nat: NatTables, network: str, alloc_id: str) -> tuple[str, ...]:
    """Part (a): delete the reference plugins' NAT rules and chains of the alloc, each family in
    its own transaction (IPv6 first, then IPv4, as Nomad).

    Anything going wrong with ``ip6 nat`` (listing, an unparsable rule, the transaction) is logged
    and skipped; the same in ``ip nat`` raises :class:`CleanupError` and leaves that family as it
    was. A non-UUID ``alloc_id`` is refused before anything is read.
    """
    if not _ALLOC_ID.fullmatch(alloc_id):
        raise CleanupError(f"failed to parse postrouting rule for alloc {alloc_id}: alloc ids are UUIDs")
    report: list[str] = []
    for family in FAMILIES:
        try:
            report += _clean_family(nat, family, network, alloc_id)
        except CleanupError as e:
            if family != "ip6":
                raise
            log.warning("failed to cleanup ip6tables for alloc %s: %s", alloc_id, e)
    if not report:
        log.info("iptables cleanup: did not find postrouting rule for alloc %s", alloc_id)
    return tuple(report)


def _clean_family(nat: NatTables, family: str, network: str, alloc_id: str) -> list[str]:
    objects = nat.list_nat(family)
    if objects is None:
        return []
    commands, report = _plan(family, objects, network, alloc_id)
    if commands:
        try:
            nat.apply(commands)
        except CleanupError as e:
            raise CleanupError(f"failed to cleanup iptables rules for alloc {alloc_id}", str(e)) from None
    return report


def force_cleanup(
    network: str,
    alloc_id: str,
    *,
    nat: NatTables | None = None,
    own_state: OwnStateHook | None = None,
    host_netns: str | None = None,
) -> CleanupReport:
    """Remove the alloc's leftovers (a) and (b); run in ``host_netns`` (None: this namespace).

    Both parts always run; if either failed, the first failure is raised as a
    :class:`CleanupError` whose ``removed`` lists what the other part did remove.
    """
    from .. import netns

    return netns.run_in(host_netns, _force_cleanup, network, alloc_id, nat, own_state)


def _force_cleanup(network: str, alloc_id: str, nat: NatTables | None, own_state: OwnStateHook | None) -> CleanupReport:
    removed: list[str] = []
    errors: list[CNIError] = []
    try:
        removed += remove_nat_leftovers(nat or PluginNat(), network, alloc_id)
    except CNIError as e:
        errors.append(e)
    if own_state is not None:
        try:
            removed += own_state(network, alloc_id)
        except CNIError as e:
            errors.append(e)
    if errors:
        first, rest = errors[0], errors[1:]
        raise CleanupError(str(first), "; ".join(map(str, rest)), removed=tuple(removed), code=first.code)
    return CleanupReport(network, alloc_id, tuple(removed))

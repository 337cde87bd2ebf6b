"""firewall: accept forwarded traffic of the container's addresses, in pycni's nftables table.

Semantics of the reference meta-plugin (cniVersion >= 0.4.0): for every prevResult address,
forwarding is accepted *to* it for established/related connections and *from* it for anything;
an admin chain (``iptablesAdminChainName``, default ``CNI-ADMIN``; Nomad uses ``NOMAD-ADMIN``)
is jumped to first, so rules an admin puts there decide before ours; ``ingressPolicy``
``same-bridge`` drops traffic between bridges that have the policy, ``isolated`` also within
the bridge.

Both ``backend`` values of the reference are served by the same nftables implementation here;
``"backend": "firewalld"`` (zone ``firewalldZone``, default ``trusted``) also makes the container's
addresses sources of that firewalld zone over D-Bus, and so does any backend when firewalld
rejects the container's egress (:mod:`.firewalld_zone`). One nftables rule to know: an
``accept`` ends evaluation only in its own base chain, so another table's ``drop`` (say an
``ip filter FORWARD`` chain with policy drop) still drops; our accept cannot override it the way
an inserted rule in that chain would. A ``drop`` in the admin chain, on the other hand, is final.
"""

from __future__ import annotations

from typing import Any

from pycni.failpoints import failpoint
from pycni.sdk import GCReport, Plugin, PluginRequest

from . import firewalld_zone
from ._common import (
    Fields,
    attachment,
    dry_run,
    emit,
    fail,
    gc_report,
    left_behind,
    nftables_status,
    prev_result,
    valid_attachments,
)
from .kernel import layout, nft

__all__ = ["FirewallPlugin"]

DEFAULT_ADMIN_CHAIN = "CNI-ADMIN"
POLICIES = ("open", "same-bridge", "isolated")
_OWNER = "firewall"


def _config(request: PluginRequest) -> tuple[str, str]:
    f = Fields(request.config, "failed to load netconf")
    admin = f.string("iptablesAdminChainName") or DEFAULT_ADMIN_CHAIN
    if not layout.CHAIN_NAME.fullmatch(admin) or admin in layout.RESERVED_CHAINS:
        raise fail(f'invalid iptablesAdminChainName "{admin}"')
    policy = f.string("ingressPolicy") or "open"
    if policy not in POLICIES:
        raise fail(f'unknown ingress policy: "{policy}"')
    f.string("backend")
    return admin, policy


class FirewallPlugin(Plugin):
    type = "firewall"
    supported_versions = ("0.4.0", "1.0.0", "1.1.0")

    def validate(self, request: PluginRequest) -> None:
        _config(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        admin, policy = _config(request)
        prev = prev_result(request)
        if prev is None:
            raise fail("missing prevResult from earlier plugin")
        elements = [layout.firewall_element(ip.address.ip) for ip in prev.ips]
        sections = [layout.FIREWALL, layout.admin_section(admin)]
        shared: list[nft.Element] = []
        if policy != "open":
            if not prev.interfaces:
                raise fail(
                    f'interface needs to be set for ingress policy "{policy}", '
                    'make sure to chain "firewall" plugin with "bridge"'
                )
            sections.append(layout.ISOLATION)
            shared = layout.isolation_elements(prev.interfaces[0].name, policy == "isolated")
        try:
            # No element refers to the admin chain, so a missing one would not fail the
            # optimistic transaction: ensure the sections first (memoised per namespace for every thread).
            nft.ensure(sections)
            failpoint("firewall.add.after-ensure")
            nft.apply(_OWNER, attachment(request), elements, sections, shared, state_dir=request.state_dir)
        except nft.ElementConflict as e:
            raise fail(f"failed to add firewall rules: {e.msg}", left_behind(request, prev, "firewall")) from e
        except nft.NftError as e:
            raise fail(f"failed to add firewall rules: {e.msg}", e.details) from e
        firewalld_zone.add(request, prev, *firewalld_zone.options(request))  # firewalld hosts
        return emit(prev, request)

    def check(self, request: PluginRequest) -> None:
        admin, policy = _config(request)
        prev = prev_result(request)
        if prev is None:
            raise fail("missing prevResult from earlier plugin")
        elements = [layout.firewall_element(ip.address.ip) for ip in prev.ips]
        gone = nft.missing(attachment(request), elements)
        if gone:
            problem = nft.check(attachment(request), gone[:1])
            raise fail(f"expected firewall element {gone[0].key} not found in set {gone[0].set}", problem or "")
        problems = nft.skeleton_problems(_sections(admin, policy))
        if problems:
            raise fail(f"firewall rules incomplete: {problems[0]}", "; ".join(problems[1:]))
        firewalld_zone.check(request, prev, *firewalld_zone.options(request))  # firewalld hosts

    def delete(self, request: PluginRequest) -> None:
        _config(request)
        firewalld_zone.delete(request, *firewalld_zone.options(request))  # firewalld hosts
        nft.release(_OWNER, attachment(request), state_dir=request.state_dir)

    def gc(self, request: PluginRequest) -> GCReport:
        """Remove the firewall elements (and records) of this network's attachments not in
        ``cni.dev/valid-attachments``, and put back lost skeleton rules and admin jumps."""
        admin, policy = _config(request)
        dry = dry_run(request)
        try:
            valid = valid_attachments(request)
            sections = _sections(admin, policy)
            removed = nft.gc(
                request.network_name,
                valid,
                (_OWNER,),
                lambda owner, e: sections,
                lambda: sections,
                state_dir=request.state_dir,
                dry_run=dry,
            )
        except nft.NftError as e:
            raise fail(f"failed to collect firewall elements: {e.msg}", e.details) from e
        removed += firewalld_zone.gc(request.network_name, valid, state_dir=request.state_dir, dry_run=dry)
        return gc_report(removed)

    def status(self, request: PluginRequest) -> None:
        nftables_status()
        firewalld_zone.status(firewalld_zone.options(request)[0])  # firewalld hosts


def _sections(admin: str, policy: str) -> list[nft.Section]:
    sections = [layout.FIREWALL, layout.admin_section(admin)]
    if policy != "open":
        sections.append(layout.ISOLATION)
    return sections

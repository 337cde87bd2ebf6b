"""firewall: accept forwarded traffic of the container's addresses, in pycni's nftables table,
and, where the host's iptables ``FORWARD`` would drop it, in iptables too.

Semantics of the reference meta-plugin (cniVersion >= 0.4.0): for every prevResult address,
forwarding is accepted *to* it for established/related connections and *from* it for anything;
an admin chain (``iptablesAdminChainName``, default ``CNI-ADMIN``; Nomad uses ``NOMAD-ADMIN``)
is jumped to first, so rules an admin puts there decide before ours; ``ingressPolicy``
``same-bridge`` drops traffic between bridges that have the policy, ``isolated`` also within
the bridge.

One nftables rule to know: an ``accept`` ends evaluation only in its own base chain, so another
table's ``drop`` (Docker's ``ip filter FORWARD`` policy DROP, legacy iptables') still drops.
So, after its nftables elements, ADD takes the **iptables compatibility step** where it is
needed (:mod:`.kernel.iptables`): when an iptables ``filter`` table (iptables-nft's or legacy)
of the attachment's IP version drops or may drop its traffic (the judge of
:mod:`.kernel.hostfw`), has Docker's ``DOCKER-USER``, or already holds pycni's chain, the
accepts go there too, as the Go plugin's do: a jump at the top of ``FORWARD`` to
``PYCNI-FORWARD``, the attachment's two rules per address, and the accepts of pycni's admin
chain for the attachment's bridge (Nomad's ``-o <bridge> -d <subnet> -j ACCEPT``, so host ports
work where they do with the Go plugins). ``"iptablesCompat": "always"`` (pycni's key; default
``auto``) forces the step on any host (iptables-nft where no iptables table exists).
``"backend": "iptables"`` does not force it: Nomad's and podman's conflists always write it (the
Go plugin's default spelled out), and a plain host must not pay for iptables it does not have.
A record under the state dir (``<state>/iptables/<key>``, written before the rules) says where
the rules went: DEL removes
them (and the chain and jump with the last attachment rule), CHECK verifies them, GC removes
those of attachments not valid (recorded or only commented) and puts back lost ones of valid
recorded attachments (so ``pycni gc --reconcile`` restores them); the record alone is enough to
put them back (:mod:`.kernel.iptables.recorded`), which ``pycni serve`` does by itself after
``iptables -F`` or a Docker restart. A host without iptables tables runs no iptables tool.

``"backend": "firewalld"`` (zone ``firewalldZone``, default ``trusted``) makes the container's
addresses sources of that firewalld zone over D-Bus, and so does any backend when firewalld
rejects the container's egress (:mod:`.firewalld_zone`). A ``drop`` in the admin chain is final.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

from pycni.errors import CNIError
from pycni.failpoints import failpoint
from pycni.sdk import Attachment, GCReport, Plugin, PluginRequest
from pycni.types import Result

from . import firewalld_zone
from ._common import (
    Fields,
    attachment,
    dry_run,
    emit,
    fail,
    gc_report,
    left_behind,
    prev_result,
    valid_attachments,
)
from .kernel import hostfw, iptables, layout, nft
from .kernel.iptables import recorded

__all__ = ["FirewallPlugin"]

DEFAULT_ADMIN_CHAIN = "CNI-ADMIN"
POLICIES = ("open", "same-bridge", "isolated")
#: ``iptablesCompat``: ``auto`` (where the host's iptables needs it) or ``always``.
COMPAT_MODES = ("auto", "always")
_OWNER = "firewall"


def _config(request: PluginRequest) -> tuple[str, str, bool]:
    f = Fields(request.config, "failed to load netconf")
    admin = f.string("iptablesAdminChainName") or DEFAULT_ADMIN_CHAIN
    if not layout.CHAIN_NAME.fullmatch(admin) or admin in layout.RESERVED_CHAINS:
        raise fail(f'invalid iptablesAdminChainName "{admin}"')
    policy = f.string("ingressPolicy") or "open"
    if policy not in POLICIES:
        raise fail(f'unknown ingress policy: "{policy}"')
    f.string("backend")
    compat = f.string("iptablesCompat") or "auto"
    if compat not in COMPAT_MODES:
        raise fail(f'unknown iptablesCompat: "{compat}"')
    return admin, policy, compat == "always"


class FirewallPlugin(Plugin):
    type = "firewall"
    supported_versions = ("0.4.0", "1.0.0", "1.1.0")

    def validate(self, request: PluginRequest) -> None:
        _config(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        admin, policy, forced = _config(request)
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
        try:
            _compat_add(request, prev, admin, forced)
        except (CNIError, OSError) as e:
            msg = e.msg if isinstance(e, CNIError) else str(e)
            details = e.details if isinstance(e, CNIError) else ""
            try:
                _compat_del(request)
                nft.release(_OWNER, attachment(request), state_dir=request.state_dir)
            except (CNIError, OSError):
                details = f"{details}; a DEL of the attachment removes what is left".strip("; ")
            raise fail(f"failed to add iptables rules: {msg}", details) from e
        firewalld_zone.add(request, prev, *firewalld_zone.options(request))  # firewalld hosts
        return emit(prev, request)

    def check(self, request: PluginRequest) -> None:
        admin, policy, _ = _config(request)
        prev = prev_result(request)
        if prev is None:
            raise fail("missing prevResult from earlier plugin")
        elements = [layout.firewall_element(ip.address.ip) for ip in prev.ips]
        gone = nft.missing(attachment(request), elements)
        if gone:
            problem = nft.check(attachment(request), gone[:1])
            raise fail(
                f"expected firewall element {gone[0].key} not found in set {gone[0].set}",
                nft.hinted(request.network_name, problem or ""),
            )
        problems = nft.skeleton_problems(_sections(admin, policy))
        if problems:
            raise fail(f"firewall rules incomplete: {problems[0]}", nft.hinted(request.network_name, *problems[1:]))
        _compat_check(request)
        firewalld_zone.check(request, prev, *firewalld_zone.options(request))  # firewalld hosts

    def delete(self, request: PluginRequest) -> None:
        _config(request)
        firewalld_zone.delete(request, *firewalld_zone.options(request))  # firewalld hosts
        nft.release(_OWNER, attachment(request), state_dir=request.state_dir)
        try:
            _compat_del(request)
        except (CNIError, OSError) as e:
            raise fail(f"failed to delete iptables rules: {e}") from e

    def gc(self, request: PluginRequest) -> GCReport:
        """Remove the firewall elements (and records) of this network's attachments not in
        ``cni.dev/valid-attachments``, and put back lost skeleton rules and admin jumps."""
        admin, policy, _ = _config(request)
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
        try:
            removed += _compat_gc(request, valid, dry)
        except (CNIError, OSError) as e:
            raise fail(f"failed to collect iptables rules: {e}", "removed: " + ", ".join(removed)) from e
        removed += firewalld_zone.gc(request.network_name, valid, state_dir=request.state_dir, dry_run=dry)
        return gc_report(removed)

    def status(self, request: PluginRequest) -> None:
        nft.status()
        firewalld_zone.status(firewalld_zone.options(request)[0])  # firewalld hosts


def _sections(admin: str, policy: str) -> list[nft.Section]:
    sections = [layout.FIREWALL, layout.admin_section(admin)]
    if policy != "open":
        sections.append(layout.ISOLATION)
    return sections


# --- the iptables compatibility step ------------------------------------------------------------


def _host_side(prev: Result) -> str:
    """The attachment's host-side interface: the bridge (or a ptp host veth), the first
    interface of the prevResult outside any sandbox."""
    return next((i.name for i in prev.interfaces if not i.sandbox), "")


def _apply_record(record: dict[str, Any], tables: dict[iptables.Place, iptables.Table] | None = None) -> None:
    for place in recorded.places_of(record):
        iptables.apply(place, recorded.rules_of(record, place), (tables or {}).get(place))


def _compat_add(request: PluginRequest, prev: Result, admin: str, forced: bool) -> None:
    """The iptables compatibility step of ADD, where the host's iptables needs it: a filter
    table with Docker's chains, a drop policy or pycni's chain already, else one the judge says
    drops or may drop the attachment's traffic; with ``forced``, every one (iptables-nft's where
    there is none)."""
    versions = {ip.address.version for ip in prev.ips}
    legacy, nft_tables = iptables.survey(versions)
    candidates = sorted([*legacy, *nft_tables])
    if not candidates and not forced:
        return  # no iptables table: nothing of iptables can drop, no tool runs
    att = attachment(request)
    bridge = _host_side(prev)
    records = recorded.records(request.state_dir)

    def record_for(places: Iterable[iptables.Place]) -> dict[str, Any]:
        admin_rules = [(i, str(n), admin) for i, n in iptables.nft_admin_rules(admin, bridge)] if bridge else []
        return recorded.record(
            (att.network, att.container_id, att.ifname),
            nft.comment(att, _OWNER),
            places,
            [str(ip.address) for ip in prev.ips],
            admin_rules,
            recorded.here(),
        )

    with iptables.locked(request.state_dir):
        if not forced and len(candidates) == 1 and candidates[0].flavour == "legacy" and records.load(att.key) is None:
            # Legacy, a first ADD of the attachment: append to pycni's chain if it is there
            # (then the step is wanted), without reading the table first; else decide below.
            place = candidates[0]
            record = record_for([place])
            records.store(att.key, record)  # before the rules: DEL finds them
            if iptables.append_existing(place, recorded.rules_of(record, place)):
                return
            records.remove(att.key)
        # Read before the lock is safe: a stale view makes -N or -A fail the batch, then apply
        # reads again (a doubled jump, from two ADDs racing after FORWARD was flushed, goes
        # with the chain).
        tables = {p: nft_tables.get(p) or iptables.look(p) for p in candidates}
        # Never an admin's own nftables table that happens to be called ``ip filter``.
        tables = {p: t for p, t in tables.items() if t.iptables}
        wanted = {p for p, t in tables.items() if forced or t.needs()}
        undecided = [p for p, t in tables.items() if p not in wanted]
        if undecided and bridge:
            target = hostfw.Target(bridge, tuple(ip.address.network for ip in prev.ips))
            findings = hostfw.inspect(target, ("egress", "replies", "bridged"))
            wanted.update(p for p in undecided if any(f.where.startswith(p.where + " ") for f in findings))
        if forced:
            for version in versions - {p.version for p in wanted}:
                place = iptables.Place(version, "nft")
                table = iptables.look(place)
                if table.writable:
                    wanted.add(place)
                    tables[place] = table
        if not wanted:
            return
        record = record_for(wanted)
        records.store(att.key, record)  # before the rules: DEL finds them
        _apply_record(record, tables)


def _of_key(key: str) -> Callable[[str], bool]:
    """Whether an iptables rule's comment is that of the attachment ``key``."""
    return lambda text: nft.Comment.parse(text).key == key


def _compat_del(request: PluginRequest, att: Attachment | None = None) -> None:
    att = att or attachment(request)
    records = recorded.records(request.state_dir)
    record = records.load(att.key)
    if record is None:
        return
    hosts = [ipaddress.ip_interface(a) for a in record.get("addresses", ())]
    # The record goes under the lock too: a heal (which takes it) never sees the record
    # without the rules and puts back what this DEL removed.
    with iptables.locked(request.state_dir):
        for place in recorded.places_of(record):
            mine = [ipaddress.ip_network(f"{h.ip}/{h.max_prefixlen}") for h in hosts if h.version == place.version]
            if place.flavour == "nft" and iptables.remove_nft_fast(place, mine):
                continue
            iptables.remove(place, _of_key(att.key))
        records.remove(att.key)


def _compat_check(request: PluginRequest) -> None:
    att = attachment(request)
    record = recorded.records(request.state_dir).load(att.key)
    if not isinstance(record, dict):
        return
    for place in recorded.places_of(record):
        gone = iptables.missing(place, recorded.rules_of(record, place))
        if gone:
            raise fail(
                f"expected iptables rule not found: {gone[0]}",
                "; ".join([*gone[1:], nft.reconcile_hint(request.network_name) + " (or DEL and ADD)"]),
            )


def _compat_gc(request: PluginRequest, valid: set[tuple[str, str]], dry: bool) -> list[str]:
    """GC of the compatibility step: the rules (and records) of this network's attachments not
    in ``valid``, recorded or only commented; lost rules of valid recorded ones put back where
    their table still is (a host whose iptables table went away gets none made again)."""
    network = request.network_name
    records = recorded.records(request.state_dir)
    removed: list[str] = []
    keep = {Attachment(network, cid, ifname).key for cid, ifname in valid}
    places: set[iptables.Place] = set()
    restore: list[dict[str, Any]] = []
    for name in records.names():
        record = records.load(name)
        if not isinstance(record, dict) or record.get("network") != network:
            continue
        places.update(recorded.places_of(record))
        if name in keep:
            restore.append(record)
        else:
            removed.append(f"iptables rules of {record.get('container_id')}/{record.get('ifname')}")
            if not dry:
                with iptables.locked(request.state_dir):
                    for place in recorded.places_of(record):
                        iptables.remove(place, _of_key(name))
                    records.remove(name)
    there = {p for p in iptables.present() if iptables.look(p).iptables}
    places.update(there)
    safe = nft.Comment.of(Attachment(network, "", ""), _OWNER).network

    def stray(text: str) -> bool:
        c = nft.Comment.parse(text)
        return c.owner == _OWNER and c.network == safe and c.key not in keep

    for place in sorted(places):
        if dry or not iptables.loaded(place):
            continue
        with iptables.locked(request.state_dir):
            gone = iptables.remove(place, stray)
            for record in restore:
                if place in there and place in recorded.places_of(record):
                    _apply_record({**record, "places": [place.to_json()]})
        removed += [f"{place.tool()} rule {' '.join(r)}" for r in gone]
    return removed

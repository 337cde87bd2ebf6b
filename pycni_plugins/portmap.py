"""portmap: publish host ports to the container with DNAT, in pycni's nftables table.

Config and semantics follow the reference plugin (``runtimeConfig.portMappings`` with
``hostPort``/``containerPort``/``protocol``/``hostIP``, also in Go field-name spelling; ``snat``
default true; ``masqAll``), with these differences, all deliberate:

* one fixed skeleton and per-container map elements (:mod:`.kernel.layout`) instead of a chain
  and rules per container; DNAT only for local destinations (``fib daddr type local``), in
  prerouting and output, for IPv4 and IPv6;
* a host (protocol, host IP, port) already published by another attachment is refused with an
  error and nothing changed (the reference silently shadows it), and so is a (protocol, port)
  on one host IP while another attachment publishes it on every address, and the other way
  round (either would shadow the other's DNAT); re-ADD of the same attachment is idempotent
  and replaces its previous mappings in the same transaction;
* DEL removes exactly what ADD added, from the attachment's record, whether or not the runtime
  passes the mappings again (the reference's DEL is a no-op without them: leaked rules);
* the hairpin/localhost masquerade covers connections from the container's whole subnet (as the
  reference's legacy backend, not its nftables one, which only covers the container itself);
* ``backend`` is accepted and served by nftables; ``markMasqBit`` is validated and otherwise
  unused; ``externalSetMarkChain`` and ``conditionsV4``/``conditionsV6`` are refused (code 2);
* a mapping without ``protocol`` is TCP (the reference hands the empty string to iptables,
  which refuses it: ``unable to setup DNAT: ... unknown protocol ""``).

As the reference does, ADD then deletes the conntrack entries of UDP flows to a newly published
host port (per family; a failure is only logged), so that their next packets get DNAT'd.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import Mapping
from typing import Any

from pycni._json import go_field
from pycni.errors import CNIError, ErrorCode
from pycni.failpoints import failpoint
from pycni.sdk import Attachment, GCReport, Plugin, PluginRequest
from pycni.types import PortMapping, Result

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
from .kernel import hostfw, layout, nft, sysctl

__all__ = ["PortmapPlugin", "host_address", "parse_mappings"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
_OWNER = "portmap"
_NOT_CHAINED = "must be called as chained plugin"
log = logging.getLogger(__name__)


def host_address(m: PortMapping) -> tuple[IPAddress | None, int]:
    """``hostIP`` as (address, family): ``(None, 0)`` for every local address of the container's
    family; 0.0.0.0 and :: give ``(None, 4 or 6)``: every address of that family only."""
    if not m.host_ip:
        return None, 0
    try:
        if "%" in m.host_ip:
            raise ValueError(m.host_ip)  # a zone (fe80::1%eth0) is no host address nftables takes
        parsed = ipaddress.ip_address(m.host_ip)
    except ValueError:
        raise fail(f'invalid host ip "{m.host_ip}" provided for port {m.host_port}') from None
    return (None if parsed.is_unspecified else parsed), parsed.version


def parse_mappings(config: Mapping[str, Any]) -> list[PortMapping]:
    return _mappings(go_field(config, "runtimeConfig"))


def _mappings(runtime: Any) -> list[PortMapping]:
    """The mappings of ``runtimeConfig`` (the plugin passes ``request.runtime_config``, whose
    reader the request keeps: no second pass over the config's keys)."""
    entries = go_field(runtime, "portMappings") if isinstance(runtime, Mapping) else None
    if not entries:
        return []
    if not isinstance(entries, list):
        raise fail("failed to parse config: portMappings must be a list")
    out: list[PortMapping] = []
    seen: set[tuple[str, int, int, str]] = set()
    for entry in entries:
        mapping = PortMapping.from_json(entry)
        host_ip, family = host_address(mapping)
        key = (mapping.protocol, mapping.host_port, family, str(host_ip))
        if key in seen:
            raise fail(f"duplicate port mapping {mapping.host_ip or '*'}:{mapping.host_port}/{mapping.protocol}")
        seen.add(key)
        out.append(mapping)
    return out


def _check_options(request: PluginRequest) -> tuple[bool, bool]:
    f = Fields(request.config, "failed to parse config")
    snat = f.flag("snat", default=True)
    masq_all = f.flag("masqAll")
    bit = f.get("markMasqBit")  # f's one pass over the config's keys serves every read here
    external = f.string("externalSetMarkChain")
    if bit is not None and external:
        raise fail("Cannot specify externalSetMarkChain and markMasqBit")
    if bit is not None and (not isinstance(bit, int) or isinstance(bit, bool) or not 0 <= bit <= 31):
        raise fail("MasqMarkBit must be between 0 and 31")
    for key in ("externalSetMarkChain", "conditionsV4", "conditionsV6"):
        if f.get(key):
            raise CNIError(f"{key} is not supported by pycni's nftables portmap", code=ErrorCode.UNSUPPORTED_FIELD)
    return snat, masq_all


def container_addresses(request: PluginRequest, prev: Result) -> list[IPInterface]:
    """The first IPv4 and first IPv6 address of the container interface, as the reference picks."""
    found: dict[int, IPInterface] = {}
    for ip in prev.ips:
        if ip.interface is not None:
            if not 0 <= ip.interface < len(prev.interfaces):
                continue
            iface = prev.interfaces[ip.interface]
            if iface.name != request.ifname or not iface.sandbox:
                continue
        found.setdefault(ip.address.version, ip.address)
    return [found[v] for v in (4, 6) if v in found]


def _check_host_firewall(request: PluginRequest, prev: Result, mappings: list[PortMapping]) -> None:
    """Fail when the host's own forward filtering drops connections DNAT'd to the container
    (another table's drop, legacy iptables' FORWARD: :mod:`.kernel.hostfw`); the bridge plugin
    reports the container's egress and replies."""
    if not prev.interfaces or prev.interfaces[0].sandbox:
        return  # no host-side interface in front of the container (macvlan and the like)
    subnets = tuple(dict.fromkeys(a.network for a in container_addresses(request, prev)))
    ports = tuple(dict.fromkeys(f"{m.host_port}/{m.protocol}" for m in mappings))
    is_bridge = any(not i.sandbox for i in prev.interfaces[1:])
    hostfw.check(hostfw.Target(prev.interfaces[0].name, subnets, ports, is_bridge), only=("inbound",))


def _elements(
    mappings: list[PortMapping], addrs: list[IPInterface], snat: bool, masq_all: bool
) -> tuple[list[nft.Element], list[nft.Section]]:
    elements: list[nft.Element] = []
    sections: list[nft.Section] = [layout.PORTMAP]
    for addr in addrs:
        for m in mappings:
            host_ip, family = host_address(m)
            if family and family != addr.version:
                continue
            elements.append(layout.hostport_element(m.protocol, m.host_port, addr.ip, m.container_port, host_ip))
        if snat:
            elements.append(layout.hairpin_element(addr, masq_all))
            sections.append(layout.HAIRPIN_ALL if masq_all else layout.hairpin_subnet(addr.network))
    return elements, sections


def _route_localnet(addr: IPInterface) -> None:
    """``route_localnet=1`` on the host interface that routes to the container, so that a
    connection to 127.0.0.1:<hostPort> may leave with its (then masqueraded) loopback source."""
    from .kernel import routing  # pyroute2 (~150 ms to import) only where netlink is needed

    oif = routing.route_oif(str(addr.ip))
    if oif is None:
        return
    with contextlib.suppress(OSError):
        sysctl.ensure(f"net/ipv4/conf/{socket.if_indextoname(oif)}/route_localnet", 1)


def _flush_udp(mappings: list[PortMapping], addrs: list[IPInterface]) -> None:
    """Forget UDP flows that reached a newly published host port before its DNAT existed."""
    udp = [m for m in mappings if m.protocol == "udp"]
    wanted = sorted({(a.version, m.host_port) for a in addrs for m in udp if host_address(m)[1] in (0, a.version)})
    if not wanted:
        return
    from .kernel import conntrack  # pyroute2 (~150 ms to import) only where netlink is needed

    for version, port in wanted:
        try:
            conntrack.flush_udp_dport(version, port)
        except Exception as e:  # as the reference: the DNAT is in place, a stale flow only lingers
            log.warning("failed to delete stale UDP conntrack entries for port %d: %s", port, e)


def _port_text(e: nft.Element) -> str:
    parts = e.key.split(" . ")
    if len(parts) == 3:
        return f"host port {parts[0]}:{parts[2]}/{parts[1]}"
    return f"host port {parts[1]}/{parts[0]}"


def _conflict(e: nft.ElementConflict, request: PluginRequest, prev: Result) -> CNIError:
    details = left_behind(request, prev, "portmap")
    if e.element is None or not e.element.set.startswith(("hostports", "hostip_hostports")):
        return fail(f"failed to publish host ports: {e.msg}", details)
    owner = nft.Comment.parse(e.holder or "").label or "an unknown owner"
    return fail(f"{_port_text(e.element)} is already mapped by another container ({owner})", details)


def _wildcard(e: nft.Element) -> nft.Element:
    """The every-address key a host-IP-specific element must not coexist with (other holder)."""
    _, proto_port = e.key.split(" . ", 1)
    return nft.Element(e.set.removeprefix("hostip_"), proto_port, e.data, e.family)


def _shadowed(att: Attachment, wildcard: list[nft.Element]) -> nft.ElementConflict | None:
    """A host-IP-specific host port of another attachment that one of ``wildcard`` (every
    address) would shadow. Lists only the host-IP maps, which stay small."""
    for family_set in sorted({(e.family, "hostip_" + e.set) for e in wildcard}):
        wanted = {e.key for e in wildcard if "hostip_" + e.set == family_set[1]}
        for found in nft.map_elements(*family_set):
            concat = found.key.get("concat") if isinstance(found.key, dict) else None
            if not concat or len(concat) != 3 or found.parsed.names(att):
                continue
            if f"{concat[1]} . {concat[2]}" in wanted:
                error = nft.ElementConflict("host port shadowed")
                error.element = nft.Element(found.set, " . ".join(map(str, concat)), family=found.family)
                error.holder = found.comment
                return error
    return None


def _skeleton() -> list[nft.Section]:
    """Portmap's skeleton sections: the shared chains and one hairpin chain per subnet seen."""
    subnets = [layout.chain_subnet(c, "hairpin-") for c in nft.chains("inet")]
    return [layout.PORTMAP, *(layout.hairpin_subnet(n) for n in subnets if n is not None)]


class PortmapPlugin(Plugin):
    type = "portmap"

    def validate(self, request: PluginRequest) -> None:
        _check_options(request)
        _mappings(request.runtime_config)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        snat, masq_all = _check_options(request)
        prev = prev_result(request)
        if prev is None:
            raise fail(_NOT_CHAINED)
        mappings = _mappings(request.runtime_config)
        if not mappings:
            return emit(prev, request)
        addrs = container_addresses(request, prev)
        elements, sections = _elements(mappings, addrs, snat, masq_all)
        att = attachment(request)
        wildcard = [e for e in elements if e.set.startswith("hostports")]
        specific = [_wildcard(e) for e in elements if e.set.startswith("hostip_hostports")]
        try:
            looked = nft.generation() if wildcard else None
            conflict = _shadowed(att, wildcard)
            if conflict is not None:
                raise conflict
            previous = nft.apply(_OWNER, att, elements, sections, absent=specific, state_dir=request.state_dir)
            # A host-IP-specific ADD probes the every-address key in its own transaction; this
            # side can only look after its commit, so of two racing ADDs one always sees the other.
            # The second look is skipped when the ruleset generation shows that nothing but our
            # own commit happened since the first one began: then it would see what that one saw.
            quiet = looked is not None and nft.commits_since(looked) <= 1
            conflict = None if quiet else _shadowed(att, wildcard)
            if conflict is not None:
                if previous is None:
                    nft.release(_OWNER, att, state_dir=request.state_dir)
                else:
                    nft.apply(_OWNER, att, previous, sections, state_dir=request.state_dir)
                raise conflict
        except nft.ElementConflict as e:
            raise _conflict(e, request, prev) from e
        except nft.NftError as e:
            raise fail(f"failed to publish host ports: {e.msg}", e.details) from e
        failpoint("portmap.add.after-nft")
        _flush_udp(mappings, addrs)
        if snat and not masq_all:
            for addr in addrs:
                if addr.version == 4:
                    _route_localnet(addr)
        return emit(prev, request)

    def check(self, request: PluginRequest) -> None:
        snat, masq_all = _check_options(request)
        prev = prev_result(request)
        if prev is None:
            raise fail(_NOT_CHAINED)
        mappings = _mappings(request.runtime_config)
        if not mappings:
            return
        elements, sections = _elements(mappings, container_addresses(request, prev), snat, masq_all)
        gone = nft.missing(attachment(request), elements)
        if gone:
            problem = nft.check(attachment(request), gone)
            raise fail(
                f"missing hostport elements in table inet {nft.TABLE}: " + ", ".join(e.key for e in gone),
                nft.hinted(request.network_name, problem or ""),
            )
        problems = nft.skeleton_problems(sections)
        if problems:
            raise fail(f"host ports not published: {problems[0]}", nft.hinted(request.network_name, *problems[1:]))
        _check_host_firewall(request, prev, mappings)

    def delete(self, request: PluginRequest) -> None:
        nft.release(_OWNER, attachment(request), state_dir=request.state_dir)

    def gc(self, request: PluginRequest) -> GCReport:
        """Remove the host-port and hairpin elements (and records) of this network's attachments
        not in ``cni.dev/valid-attachments``, and put back lost skeleton rules."""
        _check_options(request)
        dry = dry_run(request)
        try:
            valid = valid_attachments(request)
            removed = nft.gc(
                request.network_name,
                valid,
                (_OWNER,),
                layout.sections_for,
                _skeleton,
                state_dir=request.state_dir,
                dry_run=dry,
            )
        except nft.NftError as e:
            raise fail(f"failed to collect host ports: {e.msg}", e.details) from e
        return gc_report(removed)

    def status(self, request: PluginRequest) -> None:
        nft.status()

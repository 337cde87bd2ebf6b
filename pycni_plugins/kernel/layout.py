"""What pycni keeps in ``table inet pycni`` / ``table bridge pycni``: sections and elements.

Every rule below is part of a fixed skeleton; containers only ever add and remove elements of
the hash sets and maps the rules look up (no interval sets: see :mod:`.nft`). ``nft list``::

    table inet pycni {
        map masq4 { type ipv4_addr : verdict }            # container addr -> goto masq-<subnet>
        map masq6 { type ipv6_addr : verdict }
        chain masq_postrouting { type nat hook postrouting priority srcnat; policy accept;
            ip saddr vmap @masq4
            ip6 saddr vmap @masq6 }
        chain masq-10_88_0_0_nm16 {                       # one per subnet, created on first use
            ip daddr != 10.88.0.0/16 ip daddr != 224.0.0.0/4 masquerade }

        map hostports4 { type inet_proto . inet_service : ipv4_addr . inet_service }
        map hostip_hostports4 { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
        map hairpin4 { type ipv4_addr : verdict }         # container addr -> goto hairpin-<subnet>
        (and the same three for IPv6)
        chain hostports {
            dnat ip to ip daddr . meta l4proto . th dport map @hostip_hostports4
            meta nfproto ipv4 dnat ip to meta l4proto . th dport map @hostports4
            (and the same two for IPv6) }
        chain hostports_prerouting { type nat hook prerouting priority dstnat; policy accept;
            fib daddr type local goto hostports }
        chain hostports_output { type nat hook output priority -100; policy accept;
            fib daddr type local goto hostports }
        chain hostports_postrouting { type nat hook postrouting priority srcnat; policy accept;
            ct status dnat ip daddr vmap @hairpin4
            ct status dnat ip6 daddr vmap @hairpin6 }
        chain hairpin-10_88_0_0_nm16 { ip saddr { 10.88.0.0/16, 127.0.0.0/8 } masquerade }

        set firewall4 { type ipv4_addr }  set firewall6 { type ipv6_addr }
        chain forward { type filter hook forward priority filter; policy accept;
            jump CNI-ADMIN                                # one per admin chain name, first
            ct state established,related ip daddr @firewall4 accept
            ip saddr @firewall4 accept
            (and the same two for IPv6) }
        chain CNI-ADMIN { }

        set isolation_bridges { type ifname }             # bridges with an ingress policy
        set isolation_self { type ifname . ifname }       # br . br for those bridges
        set isolated_self { type ifname . ifname }        # br . br for "isolated" bridges
        chain isolation { type filter hook forward priority filter - 1; policy accept;
            iifname . oifname @isolated_self drop
            iifname @isolation_bridges oifname @isolation_bridges iifname . oifname != @isolation_self drop }
    }
    table bridge pycni {
        set spoofchk_ports { type ifname }
        set spoofchk_allowed { type ifname . ether_addr }
        chain prerouting { type filter hook prerouting priority -300; policy accept;
            iifname @spoofchk_ports iifname . ether saddr != @spoofchk_allowed drop }
    }

DNAT happens only for local destinations (``fib daddr type local``), in prerouting and output:
the reference's nftables backend once DNAT'd any destination (GHSA-jv3w-x3r3-g6rm). Hairpin
masquerade is limited to connections this host DNAT'd (``ct status dnat``) from the container's
own subnet or from 127.0.0.0/8 (which needs ``route_localnet``), as the reference's legacy
backend does with its subnet-wide ``-s`` match.
"""

from __future__ import annotations

import ipaddress
import json
import re

from .nft import TABLE, Element, Section

__all__ = [
    "IPNetwork",
    "MASQ",
    "masq_subnet",
    "masq_element",
    "PORTMAP",
    "hairpin_subnet",
    "hairpin_element",
    "HAIRPIN_ALL",
    "hostport_element",
    "FIREWALL",
    "admin_section",
    "firewall_element",
    "ISOLATION",
    "isolation_elements",
    "SPOOFCHK",
    "spoofchk_elements",
    "RESERVED_CHAINS",
    "CHAIN_NAME",
    "quote",
    "chain_subnet",
    "sections_for",
    "section_named",
    "record_sections",
]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_I = f"inet {TABLE}"
_B = f"bridge {TABLE}"
_NAT_POST = "{ type nat hook postrouting priority srcnat; policy accept; }"


def _mangle(net: IPNetwork) -> str:
    # netavark's scheme: 10.88.0.0/16 -> 10_88_0_0_nm16, fd00::/64 -> fd00--_nm64
    return str(net.network_address).replace(".", "_").replace(":", "-") + f"_nm{net.prefixlen}"


def chain_subnet(chain: str, prefix: str) -> IPNetwork | None:
    """The subnet a ``<prefix><mangled subnet>`` chain (``masq-``, ``hairpin-``) was made for."""
    if not chain.startswith(prefix):
        return None
    addr, sep, length = chain[len(prefix) :].rpartition("_nm")
    if not sep:
        return None
    text = addr.replace("_", ".") if "_" in addr else addr.replace("-", ":")
    try:
        return ipaddress.ip_network(f"{text}/{length}")
    except ValueError:
        return None


def _v(net: IPNetwork | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    return "4" if net.version == 4 else "6"


def _ip(version: int) -> str:
    return "ip" if version == 4 else "ip6"


def quote(text: str) -> str:
    """An nft string literal (interface names)."""
    return json.dumps(text)


# --- bridge ipMasq ------------------------------------------------------------------------------

MASQ = Section(
    "inet",
    "masq_postrouting",
    spec=_NAT_POST,
    body=(
        f"add map {_I} masq4 {{ type ipv4_addr : verdict; }}",
        f"add map {_I} masq6 {{ type ipv6_addr : verdict; }}",
        f"add rule {_I} masq_postrouting ip saddr vmap @masq4",
        f"add rule {_I} masq_postrouting ip6 saddr vmap @masq6",
    ),
)


def masq_subnet(net: IPNetwork) -> Section:
    multicast = "224.0.0.0/4" if net.version == 4 else "ff00::/8"
    ip = _ip(net.version)
    chain = f"masq-{_mangle(net)}"
    return Section(
        "inet", chain, body=(f"add rule {_I} {chain} {ip} daddr != {net} {ip} daddr != {multicast} masquerade",)
    )


def masq_element(addr: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> Element:
    return Element(f"masq{_v(addr)}", str(addr.ip), f"goto masq-{_mangle(addr.network)}")


# --- portmap ------------------------------------------------------------------------------------

PORTMAP = Section(
    "inet",
    "hostports",
    body=(
        f"add map {_I} hostports4 {{ type inet_proto . inet_service : ipv4_addr . inet_service; }}",
        f"add map {_I} hostip_hostports4 {{ type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }}",
        f"add map {_I} hostports6 {{ type inet_proto . inet_service : ipv6_addr . inet_service; }}",
        f"add map {_I} hostip_hostports6 {{ type ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service; }}",
        f"add map {_I} hairpin4 {{ type ipv4_addr : verdict; }}",
        f"add map {_I} hairpin6 {{ type ipv6_addr : verdict; }}",
        f"add rule {_I} hostports dnat ip to ip daddr . meta l4proto . th dport map @hostip_hostports4",
        f"add rule {_I} hostports meta nfproto ipv4 dnat ip to meta l4proto . th dport map @hostports4",
        f"add rule {_I} hostports dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostip_hostports6",
        f"add rule {_I} hostports meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @hostports6",
        f"add chain {_I} hostports_prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}",
        f"add rule {_I} hostports_prerouting fib daddr type local goto hostports",
        f"add chain {_I} hostports_output {{ type nat hook output priority -100; policy accept; }}",
        f"add rule {_I} hostports_output fib daddr type local goto hostports",
        f"add chain {_I} hostports_postrouting {_NAT_POST}",
        f"add rule {_I} hostports_postrouting ct status dnat ip daddr vmap @hairpin4",
        f"add rule {_I} hostports_postrouting ct status dnat ip6 daddr vmap @hairpin6",
    ),
)


def hairpin_subnet(net: IPNetwork) -> Section:
    chain = f"hairpin-{_mangle(net)}"
    sources = f"{{ {net}, 127.0.0.0/8 }}" if net.version == 4 else str(net)
    return Section("inet", chain, body=(f"add rule {_I} {chain} {_ip(net.version)} saddr {sources} masquerade",))


#: ``masqAll``: masquerade every connection DNAT'd to the container, whatever its source.
HAIRPIN_ALL = Section("inet", "hairpin-all", body=(f"add rule {_I} hairpin-all masquerade",))


def hairpin_element(addr: ipaddress.IPv4Interface | ipaddress.IPv6Interface, masq_all: bool = False) -> Element:
    target = "hairpin-all" if masq_all else f"hairpin-{_mangle(addr.network)}"
    return Element(f"hairpin{_v(addr)}", str(addr.ip), f"goto {target}")


def hostport_element(
    protocol: str,
    host_port: int,
    container: ipaddress.IPv4Address | ipaddress.IPv6Address,
    container_port: int,
    host_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
) -> Element:
    """DNAT ``[host_ip] protocol/host_port`` to ``container:container_port`` (no host IP: any local)."""
    data = f"{container} . {container_port}"
    if host_ip is None:
        return Element(f"hostports{_v(container)}", f"{protocol} . {host_port}", data)
    return Element(f"hostip_hostports{_v(container)}", f"{host_ip} . {protocol} . {host_port}", data)


# --- firewall -----------------------------------------------------------------------------------

FIREWALL = Section(
    "inet",
    "forward",
    spec="{ type filter hook forward priority filter; policy accept; }",
    body=(
        f"add set {_I} firewall4 {{ type ipv4_addr; }}",
        f"add set {_I} firewall6 {{ type ipv6_addr; }}",
        f"add rule {_I} forward ct state established,related ip daddr @firewall4 accept",
        f"add rule {_I} forward ip saddr @firewall4 accept",
        f"add rule {_I} forward ct state established,related ip6 daddr @firewall6 accept",
        f"add rule {_I} forward ip6 saddr @firewall6 accept",
    ),
)

#: Chains of the skeleton: an admin chain may not take one of these names.
RESERVED_CHAINS = frozenset(
    {"masq_postrouting", "hostports", "hostports_prerouting", "hostports_output", "hostports_postrouting"}
    | {"hairpin-all", "epoch"}
    | {"forward", "isolation", "prerouting"}
)


#: What nft 1.0.6 accepts as a bare chain name (it has no quoted chain names).
CHAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,254}")


def admin_section(chain: str) -> Section:
    """The admin chain, jumped to before the accept rules so that admins' rules come first.

    ``chain`` must match :data:`CHAIN_NAME` and not be in :data:`RESERVED_CHAINS`.
    """
    return Section("inet", chain, body=(f"insert rule {_I} forward jump {chain}",))


def firewall_element(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Element:
    return Element(f"firewall{_v(addr)}", str(addr))


ISOLATION = Section(
    "inet",
    "isolation",
    spec="{ type filter hook forward priority filter - 1; policy accept; }",
    body=(
        f"add set {_I} isolation_bridges {{ type ifname; }}",
        f"add set {_I} isolation_self {{ type ifname . ifname; }}",
        f"add set {_I} isolated_self {{ type ifname . ifname; }}",
        f"add rule {_I} isolation iifname . oifname @isolated_self drop",
        f"add rule {_I} isolation iifname @isolation_bridges oifname @isolation_bridges"
        " iifname . oifname != @isolation_self drop",
    ),
)


def isolation_elements(bridge: str, isolated: bool) -> list[Element]:
    """Bridge-level elements (shared by every attachment on the bridge, never removed on DEL)."""
    q = quote(bridge)
    out = [Element("isolation_bridges", q), Element("isolation_self", f"{q} . {q}")]
    if isolated:
        out.append(Element("isolated_self", f"{q} . {q}"))
    return out


# --- bridge macspoofchk -------------------------------------------------------------------------

SPOOFCHK = Section(
    "bridge",
    "prerouting",
    spec="{ type filter hook prerouting priority -300; policy accept; }",
    body=(
        f"add set {_B} spoofchk_ports {{ type ifname; }}",
        f"add set {_B} spoofchk_allowed {{ type ifname . ether_addr; }}",
        f"add rule {_B} prerouting iifname @spoofchk_ports iifname . ether saddr != @spoofchk_allowed drop",
    ),
)


def spoofchk_elements(host_veth: str, mac: str) -> list[Element]:
    q = quote(host_veth)
    return [
        Element("spoofchk_ports", q, family="bridge"),
        Element("spoofchk_allowed", f"{q} . {mac}", family="bridge"),
    ]


def sections_for(owner: str, elements: list[Element]) -> list[Section]:
    """The sections an owner's elements need (their verdict maps jump to per-subnet chains)."""
    base = {"masq": [MASQ], "portmap": [PORTMAP], "firewall": [FIREWALL], "spoofchk": [SPOOFCHK]}.get(owner, [])
    out = list(base)
    for e in elements:
        target = (e.data or "").removeprefix("goto ")
        if target == "hairpin-all":
            section = HAIRPIN_ALL
        elif (net := chain_subnet(target, "masq-")) is not None:
            section = masq_subnet(net)
        elif (net := chain_subnet(target, "hairpin-")) is not None:
            section = hairpin_subnet(net)
        else:
            continue
        if section not in out:
            out.append(section)
    return out


_FIXED = {(s.family, s.sentinel): s for s in (MASQ, PORTMAP, HAIRPIN_ALL, FIREWALL, ISOLATION, SPOOFCHK)}


def section_named(family: str, sentinel: str) -> Section | None:
    """The section whose sentinel chain is ``sentinel`` (as a record names it: the fixed ones,
    the per-subnet masquerade and hairpin chains, an admin chain), or ``None``."""
    fixed = _FIXED.get((family, sentinel))
    if fixed is not None:
        return fixed
    if family != "inet":
        return None
    if sentinel.startswith("masq-") and (net := chain_subnet(sentinel, "masq-")) is not None:
        return masq_subnet(net)
    if sentinel.startswith("hairpin-") and (net := chain_subnet(sentinel, "hairpin-")) is not None:
        return hairpin_subnet(net)
    if CHAIN_NAME.fullmatch(sentinel) and sentinel not in RESERVED_CHAINS:
        return admin_section(sentinel)
    return None


def record_sections(owner: str, elements: list[Element], named: list[tuple[str, str]]) -> list[Section]:
    """The sections an element record needs: those it names (:func:`section_named`), else (a
    record written before records named them) what its owner's elements need (:func:`sections_for`)."""
    if not named:
        return sections_for(owner, elements)
    return [s for s in (section_named(f, n) for f, n in named) if s is not None]

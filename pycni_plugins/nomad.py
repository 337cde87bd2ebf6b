"""Nomad's kernel state that pycni's plugins own, for the configurator and CLI (``pycni.hooks``).

* ``forced-cleanup`` (:func:`remove_container`): pycni's own nftables elements and records of
  an allocation, removed when its CNI DEL failed (Nomad's ``forceCleanup``);
* ``forwarding-rules`` (:func:`ensure_forwarding_rules`): Nomad's ``ensureForwardingRules``.

Nomad's ``bridgeNetworkConfigurator`` (``networking_bridge_linux.go``), before every setup: the
admin chain (``NOMAD-ADMIN``) must exist and hold ``-o <bridge> -d <subnet> -j ACCEPT`` (IPv6 first
when configured), so that traffic forwarded to the allocations is accepted even if an admin's
later rules in that chain would refuse it. In pycni's table this accept ends only pycni's own
base chain: another table's drop still drops. On an iptables host (Docker's ``FORWARD`` policy
DROP, through iptables-nft or legacy) the firewall plugin's iptables step copies this rule, for
the attachment's bridge, into its ``PYCNI-FORWARD`` chain jumped from the top of ``FORWARD``
(:mod:`pycni_plugins.kernel.iptables`), so host ports work there as with the Go plugins; a
hardened ``inet filter``'s drop is not edited, and the bridge plugin's CHECK and STATUS name it
(:mod:`pycni_plugins.kernel.hostfw`).

pycni's firewall plugin keeps admin chains in ``table inet pycni`` (jumped to first from its
``forward`` chain, see :mod:`pycni_plugins.kernel.layout`), so the equivalent here is::

    table inet pycni {
        counter nomad-admin-4-<hash> { }                 # names the rule: see below
        chain forward { type filter hook forward priority filter; policy accept;
            jump NOMAD-ADMIN
            … }
        chain NOMAD-ADMIN {
            oifname "nomad" ip daddr 172.26.64.0/20 counter name "nomad-admin-4-<hash>" accept
                comment "-o nomad -d 172.26.64.0/20 -j ACCEPT" }
    }

Idempotent and race-free without listing the chain: each rule references a named counter whose
name hashes (family, bridge, subnet), and the rule is added by one transaction
``add counter X; delete counter X; add counter X; add rule … counter name X``. The kernel
refuses to delete an object a rule still references (EBUSY), so the transaction fails, changing
nothing, exactly when the rule is already there (whoever added it, even concurrently: commits
are serialised); when it is missing (never added, or an admin flushed the chain) the stale
counter, if any, is replaced and the rule appended. Nomad's version lists chains and rules
(``ListChains``/``Exists``) and tolerates a racing ``NewChain``; here the chains are created by
the firewall plugin's own race-free sections (:func:`pycni_plugins.kernel.nft.ensure`).

Unlike Nomad, the bridge name and subnets are validated first (nft has no escapes in strings):
an interface name without ``"`` or ``\\``, and a CIDR of the right family (host bits masked, as
iptables masks them).
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Any

from pycni.errors import ConfigError
from pycni.sdk import Attachment

from .kernel import layout, nft

__all__ = ["ensure_forwarding_rules", "forwarding_rule_commands", "remove_container"]

_IFNAME_MAX = 15


def _subnet(text: str, version: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        net = None
    if net is None or net.version != version:
        raise ConfigError(f'invalid {"IPv4" if version == 4 else "IPv6"} subnet "{text}"')
    return net


def _bridge(name: str) -> str:
    if not name or len(name) > _IFNAME_MAX or any(c in name for c in '"\\/:\0') or any(c.isspace() for c in name):
        raise ConfigError(f'invalid bridge name "{name}"')
    return name


def forwarding_rule_commands(admin_chain: str, bridge: str, subnet: str, version: int) -> list[str]:
    """The transaction that appends ``bridge``/``subnet``'s accept rule to ``admin_chain`` unless present."""
    net = _subnet(subnet, version)
    name = _bridge(bridge)
    digest = hashlib.sha256(f"{name}\0{net}".encode()).hexdigest()[:16]
    counter = f"nomad-admin-{version}-{digest}"
    t = f"inet {nft.TABLE}"
    ip = "ip" if version == 4 else "ip6"
    return [
        f"add counter {t} {counter}",
        f"delete counter {t} {counter}",
        f"add counter {t} {counter}",
        f'add rule {t} {admin_chain} oifname "{name}" {ip} daddr {net} counter name "{counter}" accept'
        f' comment "-o {name} -d {net} -j ACCEPT"',
    ]


def _apply(admin_chain: str, commands: list[str]) -> None:
    sections = [layout.FIREWALL, layout.admin_section(admin_chain)]
    nft.ensure(sections)
    for attempt in (1, 2):
        try:
            nft.run(commands)
            return
        except nft.NftBusy:
            return  # the counter is in use: the rule is there
        except nft.NftNotFound:
            if attempt == 2:
                raise
            nft.ensure(sections, force=True)  # someone deleted the chains behind ensure's memo


def ensure_forwarding_rules(admin_chain: str, bridge: str, ipv4_subnet: str, ipv6_subnet: str = "") -> None:
    """Nomad's ``ensureForwardingRules`` in the calling thread's namespace: IPv6 (if set) first.

    Both rules are validated before either is applied.
    """
    rules = [forwarding_rule_commands(admin_chain, bridge, ipv6_subnet, 6)] if ipv6_subnet else []
    rules.append(forwarding_rule_commands(admin_chain, bridge, ipv4_subnet, 4))
    for commands in rules:
        _apply(admin_chain, commands)


def _owned_by(network: str, container_id: str, key: str, group: dict[str, Any]) -> bool:
    """Whether an :func:`~.kernel.nft.attachments` group belongs to (network, container_id), any ifname."""
    record = group.get("record")
    if isinstance(record, dict):
        return bool(record.get("network") == network and record.get("container_id") == container_id)
    found = nft.Comment.parse(group.get("comment", ""))
    if found.ifname is None:
        return False
    # The key hashes the exact triple: recomputing it from the comment's ifname is exact. A
    # sanitised or cut ifname cannot be rehashed; then the (sanitised) names must match.
    if Attachment(network, container_id, found.ifname).key == key:
        return True
    safe = nft.Comment.of(Attachment(network, container_id, ""), "x")
    return found.network == safe.network and found.container_id == safe.container_id


def remove_container(network: str, container_id: str, state_dir: str) -> list[str]:
    """Remove every pycni element and state record (under ``state_dir``) of ``container_id`` on
    ``network`` (any interface, any owner) in the calling thread's namespace; returns what was removed."""
    return nft.remove_attachments(
        lambda key, group: _owned_by(network, container_id, key, group),
        f"{container_id} on {network}",
        state_dir=state_dir,
    )

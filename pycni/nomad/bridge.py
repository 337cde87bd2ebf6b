"""Nomad's ``bridge`` network mode: the generated conflist plus the admin-chain forwarding rule.

Nomad's ``bridgeNetworkConfigurator`` (``networking_bridge_linux.go``) wraps the CNI configurator
with the conflist of :mod:`.conflist` and, before every setup, ``ensureForwardingRules``: chain
``NOMAD-ADMIN`` of the filter table must exist and hold ``-o <bridge> -d <subnet> -j ACCEPT``
(IPv6 first when configured), so that traffic forwarded to the allocations is accepted even if
an admin's rules in that chain, or a DROP policy, would refuse it.

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

from .. import netns
from ..errors import CNIError, ConfigError
from .configurator import GoCNIClient, NetworkConfigurator
from .conflist import ADMIN_CHAIN, BridgeConfig, bridge_conflist
from .errors import ForwardingRulesError
from .models import Allocation, Node
from .tproxy import uses_transparent_proxy

__all__ = ["BridgeNetworkConfigurator", "ensure_forwarding_rules", "forwarding_rule_commands"]

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


def forwarding_rule_commands(bridge: str, subnet: str, version: int) -> list[str]:
    """The transaction that appends ``bridge``/``subnet``'s accept rule to NOMAD-ADMIN unless present."""
    from pycni_plugins.kernel.nft import TABLE

    net = _subnet(subnet, version)
    name = _bridge(bridge)
    digest = hashlib.sha256(f"{name}\0{net}".encode()).hexdigest()[:16]
    counter = f"nomad-admin-{version}-{digest}"
    t = f"inet {TABLE}"
    ip = "ip" if version == 4 else "ip6"
    return [
        f"add counter {t} {counter}",
        f"delete counter {t} {counter}",
        f"add counter {t} {counter}",
        f'add rule {t} {ADMIN_CHAIN} oifname "{name}" {ip} daddr {net} counter name "{counter}" accept'
        f' comment "-o {name} -d {net} -j ACCEPT"',
    ]


def _apply(commands: list[str]) -> None:
    from pycni_plugins.kernel import layout, nft

    sections = [layout.FIREWALL, layout.admin_section(ADMIN_CHAIN)]
    nft.ensure(sections)
    for attempt in (1, 2):
        try:
            nft.run(commands)
            return
        except nft.NftError as e:
            if "Device or resource busy" in e.msg:
                return  # the counter is in use: the rule is there
            if attempt == 2 or "No such file or directory" not in e.msg:
                raise
            nft.ensure(sections, force=True)  # someone deleted the chains behind ensure's memo


def ensure_forwarding_rules(bridge: str, ipv4_subnet: str, ipv6_subnet: str = "") -> None:
    """Nomad's ``ensureForwardingRules`` in the calling thread's namespace: IPv6 (if set) first.

    Both rules are validated before either is applied.
    """
    rules = [forwarding_rule_commands(bridge, ipv6_subnet, 6)] if ipv6_subnet else []
    rules.append(forwarding_rule_commands(bridge, ipv4_subnet, 4))
    for commands in rules:
        _apply(commands)


class BridgeNetworkConfigurator(NetworkConfigurator):
    """Nomad's bridge mode: the embedded conflist, and the forwarding rule before every setup.

    ``bridge`` gets the client's defaults (``nomad``, ``172.26.64.0/20``); ``host_netns`` is the
    namespace the plugins run in (the client's ``host_netns``), where the rule belongs.
    """

    def __init__(
        self, client: GoCNIClient, bridge: BridgeConfig, node: Node, *, host_netns: str | None = None, **kwargs: Any
    ) -> None:
        self.bridge = bridge.with_defaults()
        self.host_netns = host_netns
        super().__init__(client, bridge_conflist(self.bridge), node, **kwargs)

    @classmethod
    def for_alloc(
        cls,
        client: GoCNIClient,
        alloc: Allocation,
        node: Node,
        *,
        bridge_name: str = "",
        subnet: str = "",
        subnet_ipv6: str = "",
        hairpin: bool = False,
        **kwargs: Any,
    ) -> BridgeNetworkConfigurator:
        """As Nomad's ``newBridgeNetworkConfigurator``: consul-cni only for transparent-proxy groups."""
        config = BridgeConfig(bridge_name, subnet, subnet_ipv6, hairpin, uses_transparent_proxy(alloc.group))
        return cls(client, config, node, **kwargs)

    def _prepare(self) -> None:
        b = self.bridge
        try:
            netns.run_in(self.host_netns, ensure_forwarding_rules, b.bridge_name, b.ipv4_subnet, b.ipv6_subnet)
        except (CNIError, OSError) as e:
            raise ForwardingRulesError(e) from e

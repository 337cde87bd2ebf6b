"""Nomad's ``bridge`` network mode: the generated conflist plus the admin-chain forwarding rule.

Nomad's ``bridgeNetworkConfigurator`` (``networking_bridge_linux.go``) wraps the CNI configurator
with the conflist of :mod:`.conflist` and, before every setup, ``ensureForwardingRules``: chain
``NOMAD-ADMIN`` must hold ``-o <bridge> -d <subnet> -j ACCEPT`` (IPv6 first when configured). That
rule lives in the firewall plugin's nftables table, so the plugin package applies it: the
``forwarding-rules`` hook (:mod:`pycni.sdk.hooks`; pycni's own in :mod:`pycni_plugins.nomad`).
"""

from __future__ import annotations

from typing import Any

from .. import netns
from ..errors import CNIError
from ..sdk import hooks
from .configurator import GoCNIClient, NetworkConfigurator
from .conflist import ADMIN_CHAIN, NomadBridgeConfig, bridge_conflist
from .errors import ForwardingRulesError
from .models import Allocation, Node
from .tproxy import uses_transparent_proxy

__all__ = ["BridgeNetworkConfigurator", "ensure_forwarding_rules"]


def ensure_forwarding_rules(bridge: str, ipv4_subnet: str, ipv6_subnet: str = "") -> None:
    """Nomad's ``ensureForwardingRules`` in the calling thread's namespace: IPv6 (if set) first.

    Both rules are validated (ConfigError) before either is applied.
    """
    hooks.hook(hooks.FORWARDING_RULES)(ADMIN_CHAIN, bridge, ipv4_subnet, ipv6_subnet)


class BridgeNetworkConfigurator(NetworkConfigurator):
    """Nomad's bridge mode: the embedded conflist, and the forwarding rule before every setup.

    ``bridge`` gets the client's defaults (``nomad``, ``172.26.64.0/20``); ``host_netns`` is the
    namespace the plugins run in (the client's ``host_netns``), where the rule belongs.
    """

    def __init__(
        self,
        client: GoCNIClient,
        bridge: NomadBridgeConfig,
        node: Node,
        *,
        host_netns: str | None = None,
        **kwargs: Any,
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
        config = NomadBridgeConfig(bridge_name, subnet, subnet_ipv6, hairpin, uses_transparent_proxy(alloc.group))
        return cls(client, config, node, **kwargs)

    def _prepare(self) -> None:
        b = self.bridge
        try:
            netns.run_in(self.host_netns, ensure_forwarding_rules, b.bridge_name, b.ipv4_subnet, b.ipv6_subnet)
        except (CNIError, OSError) as e:
            raise ForwardingRulesError(e) from e

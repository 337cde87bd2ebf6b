"""Nomad's CNI network configurator, faithful to ``client/allocrunner/networking_cni.go``.

- :mod:`.models`: the allocation and node as Nomad's HTTP API serialises them.
- :mod:`.ports`, :mod:`.tproxy`, :mod:`.args`: what Setup passes to the plugins (port maps,
  ``CONSUL_IPTABLES_CONFIG``, CNI args).
- :mod:`.status`: go-cni result → the allocation's network status.
- :mod:`.conflist`, :mod:`.conf`: the bridge conflist Nomad generates; config lookup by name.
- :mod:`.configurator`: setup (ADD with retries, or CHECK on restore) and teardown.
- :mod:`.bridge`: bridge mode (embedded conflist + the NOMAD-ADMIN forwarding rule).
- :mod:`.cleanup`: forced removal of an allocation's leftover NAT state after a failed DEL.
"""

from ..types.consul import IptablesConfig
from .args import cni_args
from .bridge import BridgeNetworkConfigurator, ensure_forwarding_rules
from .cleanup import CleanupReport, force_cleanup
from .conf import ConfSource, load_cni_conf, network_mode
from .configurator import NetworkConfigurator, make_client
from .conflist import NomadBridgeConfig, bridge_conflist, validate_subnets
from .errors import (
    CheckFailedError,
    CleanupError,
    ConfLoadError,
    DecodeError,
    ForwardingRulesError,
    InitError,
    SetupError,
    StatusError,
    TransparentProxyError,
)
from .models import Allocation, Node
from .ports import PortMapping, PortMappings, port_mappings
from .status import AllocNetworkStatus, DNSConfig, alloc_net_status, result_from_json, with_consul_dns
from .tproxy import dns_from_attrs, transparent_proxy_config

__all__ = [
    "Allocation",
    "Node",
    "PortMapping",
    "PortMappings",
    "port_mappings",
    "IptablesConfig",
    "transparent_proxy_config",
    "dns_from_attrs",
    "cni_args",
    "AllocNetworkStatus",
    "DNSConfig",
    "alloc_net_status",
    "with_consul_dns",
    "result_from_json",
    "NomadBridgeConfig",
    "bridge_conflist",
    "validate_subnets",
    "ConfSource",
    "load_cni_conf",
    "network_mode",
    "NetworkConfigurator",
    "make_client",
    "BridgeNetworkConfigurator",
    "ensure_forwarding_rules",
    "CleanupReport",
    "force_cleanup",
    "DecodeError",
    "ConfLoadError",
    "TransparentProxyError",
    "InitError",
    "SetupError",
    "CheckFailedError",
    "ForwardingRulesError",
    "StatusError",
    "CleanupError",
]

"""The public surface, pinned: a name added to or dropped from a public package's ``__all__`` is a
decision this test makes visible (httpx's ``test_exported_members``)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import pycni
import pycni_plugins

PUBLIC = {
    "pycni": {
        "CNIError",
        "CacheError",
        "ConfigError",
        "ErrorCode",
        "InvalidArgumentError",
        "MultiError",
        "NetworkNotFoundError",
        "NoConfigsFoundError",
        "PluginError",
        "PluginNotFoundError",
        "PluginTimeoutError",
        "ResultError",
        "VersionError",
        "__version__",
    },
    "pycni.sdk": {
        "Attachment",
        "GCAttachment",
        "COMMANDS",
        "DEFAULT_STATE_DIR",
        "STATE_DIR_ENV",
        "GCReport",
        "Plugin",
        "PluginRequest",
        "builtin_plugin",
        "builtin_plugins",
        "default_state_dir",
        "delegate",
        "environ",
        "environment",
        "find_plugin",
        "ifname_problem",
        "internal_errors",
        "load_args",
        "parse_cni_args",
        "validate_attachment_key",
        "validate_container_id",
        "validate_ifname",
        "validate_network_name",
    },
    "pycni.sdk.hooks": {
        "FORCED_CLEANUP",
        "FORWARDING_RULES",
        "HOOK_GROUP",
        "NFT_APPLY",
        "IPAM_LEASES",
        "NFT_ATTACHMENTS",
        "NFT_LIST_TABLE",
        "hook",
    },
    "pycni.testing": {"Handler", "MockBackend", "PluginCall", "passthrough"},
    "pycni.types": {
        "AnyResult",
        "DNS",
        "IPAddress",
        "IPConfig",
        "IPConfig020",
        "IPConfig040",
        "IPInterface",
        "Interface",
        "PortMapping",
        "Result",
        "Result020",
        "Result040",
        "Route",
        "convert",
        "parse_result",
    },
    "pycni.nomad": {
        "AllocNetworkStatus",
        "Allocation",
        "NomadBridgeConfig",
        "BridgeNetworkConfigurator",
        "CheckFailedError",
        "CleanupError",
        "CleanupReport",
        "ConfLoadError",
        "ConfSource",
        "DNSConfig",
        "DecodeError",
        "ForwardingRulesError",
        "InitError",
        "IptablesConfig",
        "NetworkConfigurator",
        "Node",
        "PortMapping",
        "PortMappings",
        "SetupError",
        "StatusError",
        "TransparentProxyError",
        "alloc_net_status",
        "bridge_conflist",
        "cni_args",
        "dns_from_attrs",
        "ensure_forwarding_rules",
        "force_cleanup",
        "load_cni_conf",
        "make_client",
        "network_mode",
        "port_mappings",
        "result_from_json",
        "transparent_proxy_config",
        "validate_subnets",
        "with_consul_dns",
    },
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_package_exports_exactly_its_pinned_names(name: str) -> None:
    module = importlib.import_module(name)
    assert set(module.__all__) == PUBLIC[name]
    assert len(module.__all__) == len(set(module.__all__)), "a name listed twice"


def _all_modules() -> list[str]:
    names = []
    for package in (pycni, pycni_plugins):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith(".__main__"):  # runs the CLI on import
                names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _all_modules())
def test_every_name_in_a_modules_all_exists(name: str) -> None:
    module = importlib.import_module(name)
    missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert missing == []

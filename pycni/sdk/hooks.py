"""Hooks: the plugin-owned kernel state the runtime side reaches without importing the plugins.

The Nomad configurator and the CLI need some of what the built-in plugins keep in the kernel
(pycni's nftables elements of an allocation, the NOMAD-ADMIN forwarding rule, the reference
plugins' NAT leftovers read through the one libnftables wrapper). A plugin package provides
each hook under its name in the ``pycni.hooks`` entry point group, as plugins are registered in
``pycni.plugins``; the caller looks it up here by name and never imports the package.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from ..errors import CNIError, ErrorCode

__all__ = [
    "HOOK_GROUP",
    "FORCED_CLEANUP",
    "FORWARDING_RULES",
    "NFT_ATTACHMENTS",
    "NFT_LIST_TABLE",
    "NFT_APPLY",
    "IPAM_LEASES",
    "hook",
]

HOOK_GROUP = "pycni.hooks"
#: ``(network, container_id, state_dir) -> list[str]``: remove pycni's own kernel state of every
#: interface of the container on the network, and its records under ``state_dir`` (forced
#: cleanup after a failed DEL); what it removed.
FORCED_CLEANUP = "forced-cleanup"
#: ``(admin_chain, bridge, ipv4_subnet, ipv6_subnet) -> None``: Nomad's ``ensureForwardingRules``
#: in the calling thread's namespace; bad names and subnets raise ConfigError before any change.
FORWARDING_RULES = "forwarding-rules"
#: ``(state_dir) -> dict[str, dict]``: pycni's nftables elements (and the records under
#: ``state_dir``) grouped by attachment key.
NFT_ATTACHMENTS = "nft-attachments"
#: ``(family, table) -> list[dict] | None``: the JSON objects of a table (None: no such table).
NFT_LIST_TABLE = "nft-list-table"
#: ``(commands: Sequence[Mapping]) -> None``: libnftables JSON commands as one transaction.
NFT_APPLY = "nft-apply"
#: ``(network, plugin_config) -> list[tuple[str, str]]``: ``(ip, "containerID/ifname")`` of
#: every IPAM lease one plugin config's IPAM keeps for the network (none: ``[]``).
IPAM_LEASES = "ipam-leases"


@cache
def hook(name: str) -> Callable[..., Any]:
    """The hook registered under ``name``; :class:`CNIError` (code 999) when none is, or it fails to load."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=HOOK_GROUP, name=name):
        try:
            loaded: Callable[..., Any] = ep.load()
        except ImportError as e:
            raise CNIError(f"hook {name!r} failed to load: {e}", code=ErrorCode.INTERNAL) from None
        return loaded
    raise CNIError(
        f"no plugin package provides the hook {name!r} (entry point group {HOOK_GROUP})", code=ErrorCode.INTERNAL
    )

"""host-local IPAM, in-process: the reference plugin's config, allocation order, errors and disk format.

Split as the reference's ``plugins/ipam/host-local`` is:

- :mod:`.config`: the ``ipam`` config, ranges and requested IPs (``allocator.LoadIPAMConfig``);
- :mod:`.allocator`: one IP per range set, round-robin, all-or-nothing (``backend/allocator``);
- :mod:`.store`: the :class:`~.store.Store` protocol the allocator works through (``backend.Store``),
  with :mod:`.disk` (``backend/disk``: the reference's on-disk format, so Go and pycni can share a
  data dir both ways) and :mod:`.fake_store` (in memory, for tests; ``backend/testing``);
- :mod:`.lease_cache`: a long-lived process keeps each directory's leases in memory, exact through
  inotify, so an operation's cost does not grow with the number of leases;
- :mod:`.resolv` (``resolvConf``) and :mod:`.result` (the result through pycni.types, per version).

Every error the Go plugin reports as a plain Go error is raised with code 999 and the same text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pycni.failpoints import failpoint
from pycni.sdk import GCReport, Plugin, PluginRequest
from pycni.types import DNS

from ._errors import fail
from .allocator import allocate
from .config import DEFAULT_DATA_DIR, HostLocalConfig, IPRange, load_config
from .disk import DiskStore
from .resolv import parse_resolv_conf
from .result import build_result

__all__ = [
    "DEFAULT_DATA_DIR",
    "HostLocalConfig",
    "HostLocalPlugin",
    "IPRange",
    "load_config",
    "network_leases",
    "parse_resolv_conf",
]


class HostLocalPlugin(Plugin):
    """The ``host-local`` IPAM plugin: ADD allocates, DEL releases by (container ID, ifname), CHECK finds."""

    type = "host-local"

    def validate(self, request: PluginRequest) -> None:
        load_config(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf = load_config(request)
        dns = parse_resolv_conf(conf.resolv_conf) if conf.resolv_conf else DNS()
        with DiskStore(conf.data_dir, conf.name) as store, store.locked():
            allocated = allocate(store, conf, request.container_id, request.ifname)
            failpoint("host-local.add.after-lease")  # leased, lock held, nobody told yet
        return build_result(conf.cni_version, allocated, conf.routes, dns)

    def delete(self, request: PluginRequest) -> None:
        conf = load_config(request)
        with DiskStore(conf.data_dir, conf.name) as store, store.locked():
            failpoint("host-local.del.before-release")  # lock held
            store.release(request.container_id, request.ifname, passes=len(conf.range_sets))

    def gc(self, request: PluginRequest) -> GCReport:
        """Release every lease of the network whose attachment is not in
        ``cni.dev/valid-attachments`` (a legacy bare-ID lease: whose container has no valid
        attachment), under the lock; with ``pycni.dev/dry-run`` only report them."""
        from .._common import dry_run, gc_report, valid_attachments

        conf = load_config(request)
        valid = valid_attachments(request)
        if dry_run(request) and not os.path.isdir(os.path.join(conf.data_dir, conf.name)):
            return gc_report([])  # no lease to report, and a dry run makes no directory
        with DiskStore(conf.data_dir, conf.name) as store, store.locked():
            removed = store.collect(valid, dry_run=dry_run(request))
        return gc_report([f"host-local lease {ip} of {owner} (network {conf.name})" for ip, owner in removed])

    def status(self, request: PluginRequest) -> None:
        """Ready whenever the config is valid (nothing is touched on disk)."""
        load_config(request)

    def check(self, request: PluginRequest) -> None:
        conf = load_config(request)
        with DiskStore(conf.data_dir, conf.name) as store, store.locked():
            current, legacy = store.find(request.container_id, request.ifname)
        if not (current or legacy):
            raise fail(f"host-local: Failed to find address added by container {request.container_id}")


def network_leases(network: str, plugin: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``pycni.hooks`` ``ipam-leases`` hook: ``(ip, "containerID/ifname")`` of every lease of
    ``network`` in the host-local data dir of one plugin config (its ``ipam``, or itself when it
    is host-local); [] for other IPAM types or before any lease dir exists (nothing is created)."""
    from .store import stale_leases

    ipam = plugin if plugin.get("type") == HostLocalPlugin.type else plugin.get("ipam")
    if not isinstance(ipam, Mapping) or ipam.get("type") != HostLocalPlugin.type:
        return []
    data_dir = ipam.get("dataDir") or DEFAULT_DATA_DIR
    if not isinstance(data_dir, str) or not os.path.isdir(os.path.join(data_dir, network)):
        return []
    with DiskStore(data_dir, network) as store, store.locked():
        return sorted(stale_leases(store.lease_files(), set()))

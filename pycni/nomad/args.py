"""The CNI args (``CNI_ARGS`` pairs) Nomad's Setup and Check pass to every plugin.

In order of precedence, lowest first: ``IgnoreUnknown=true`` (plugins must tolerate keys they do
not know), the jobspec's ``network.cni.args`` of each network (later networks overwrite, and may
overwrite ``IgnoreUnknown``), the workload identity ``NOMAD_*`` keys, and
``CONSUL_IPTABLES_CONFIG`` for transparent proxy. A ``NOMAD_*`` value containing ``;`` (the pair
separator) is skipped with a warning; nothing else is validated, exactly as in Nomad.
Teardown passes no args at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..types.consul import IptablesConfig
from .models import Allocation, NetworkResource

__all__ = ["cni_args", "add_custom_cni_args", "add_nomad_workload_cni_args", "CONSUL_IPTABLES_CONFIG"]

CONSUL_IPTABLES_CONFIG = "CONSUL_IPTABLES_CONFIG"
log = logging.getLogger("pycni.nomad")


def add_custom_cni_args(networks: Iterable[NetworkResource], args: dict[str, str]) -> None:
    for network in networks:
        if network.cni is not None:
            args.update(network.cni.args)


def add_nomad_workload_cni_args(alloc: Allocation, args: dict[str, str]) -> None:
    workload = {
        "NOMAD_REGION": alloc.job.region,
        "NOMAD_NAMESPACE": alloc.namespace,
        "NOMAD_JOB_ID": alloc.job.id,
        "NOMAD_GROUP_NAME": alloc.task_group,
        "NOMAD_ALLOC_ID": alloc.id,
    }
    for key, value in workload.items():
        # Job IDs and group names may contain ";", which CNI_ARGS cannot carry.
        if ";" in value:
            log.warning("Skipping CNI arg because it contains a semicolon: key=%s value=%r", key, value)
        else:
            args[key] = value


def cni_args(alloc: Allocation, tproxy: IptablesConfig | None = None) -> dict[str, str]:
    args = {"IgnoreUnknown": "true"}
    add_custom_cni_args(alloc.group.networks, args)
    add_nomad_workload_cni_args(alloc, args)
    if tproxy is not None:
        args[CONSUL_IPTABLES_CONFIG] = tproxy.to_json()
    return args

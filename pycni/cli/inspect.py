"""``pycni inspect [NETWORK]``: every attachment, from the runtime's cache and the plugins' records.

A row per attachment: the cache entry (container ID, ifname, netns and whether it is still a
live namespace, addresses, host ports, host-side links) merged with what the built-in plugins
keep of it (host-local leases, pycni's nftables elements and records, reached through the
``pycni.hooks`` entry points, never by importing the plugins). What is stale is what
``pycni gc NETWORK --reconcile`` would change: its dry run (:meth:`Runtime.reconcile_network_list`)
decides (its stale attachments, and what its plugins would collect, matched to the attachment
each item names). A table on a terminal, JSON otherwise (or with ``--json``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import click

from .. import config
from ..errors import CNIError, ConfigError
from ._base import cache_dir_option, on_terminal, plugin_path_option, state_dir_option
from .runtime_commands import DEFAULT_NETWORK, conf_dir_option, embedded_conflist, load_network, runtime_for

if TYPE_CHECKING:
    from ..cache import CachedAttachment
    from ..runtime import Runtime

__all__ = ["inspect", "attachments_of"]

_COLUMNS = (
    ("NETWORK", "network"),
    ("CONTAINER", "containerId"),
    ("IFNAME", "ifname"),
    ("NETNS", "netns"),
    ("ADDRESSES", "addresses"),
    ("HOST PORTS", "hostPorts"),
    ("HOST LINK", "hostLinks"),
    ("STALE", "stale"),
)


def _row(network: str, container_id: str, ifname: str) -> dict[str, Any]:
    return {
        "network": network,
        "containerId": container_id,
        "ifname": ifname,
        "cached": False,
        "netns": None,
        "netnsAlive": None,
        "addresses": [],
        "hostPorts": [],
        "hostLinks": [],
        "leases": [],
        "nftElements": {},
        "reconcile": [],
        "stale": None,
    }


def _from_cache(entry: CachedAttachment, alive: bool) -> dict[str, Any]:
    row = _row(entry.network, entry.container_id, entry.ifname)
    result = entry.result or {}
    interfaces = [i for i in result.get("interfaces") or () if isinstance(i, Mapping)]
    row |= {
        "cached": True,
        "netns": entry.netns,
        "netnsAlive": alive,
        "addresses": [str(ip.get("address")) for ip in result.get("ips") or () if isinstance(ip, Mapping)],
        "hostPorts": [_port(p) for p in entry.capability_args.get("portMappings") or () if isinstance(p, Mapping)],
        "hostLinks": [str(i.get("name")) for i in interfaces if not i.get("sandbox")],
    }
    return row


def _port(mapping: Mapping[str, Any]) -> str:
    host_ip = f"{mapping['hostIP']}:" if mapping.get("hostIP") else ""
    proto = mapping.get("protocol") or "tcp"
    return f"{host_ip}{mapping.get('hostPort')}/{proto}->{mapping.get('containerPort')}"


def _owner(group: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(network, container ID, ifname) of an nft attachment group: its record, else its comment
    (``<key> <owner> <network> <containerID> <ifname>``)."""
    record = group.get("record")
    if isinstance(record, Mapping):
        return str(record.get("network")), str(record.get("container_id")), str(record.get("ifname"))
    fields = str(group.get("comment", "")).split(" ")
    return (fields[2], fields[3], fields[4]) if len(fields) >= 5 else None


def _plugin_configs(net: config.NetworkConfigList) -> Iterator[Mapping[str, Any]]:
    """Every plugin config of ``net``, a folded list's inner ones included."""
    from ..chain import CHAIN_TYPE

    for plugin in net.plugins:
        yield plugin.raw
        inner = plugin.raw.get("plugins") if plugin.type == CHAIN_TYPE else None
        if isinstance(inner, list):
            yield from (p for p in inner if isinstance(p, dict))


def attachments_of(
    runtime: Runtime, networks: Iterable[config.NetworkConfigList]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The rows of every attachment of ``networks``, each network's reconcile dry-run report,
    and warnings (plugin records that could not be read)."""
    from .. import netns
    from ..sdk import Attachment, builtin_plugin, hooks

    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    reports: list[dict[str, Any]] = []
    warnings: list[str] = []
    nets = list(networks)
    for entry in runtime.get_cached_attachments():
        if any(entry.network == n.name for n in nets):
            rows[(entry.network, entry.container_id, entry.ifname)] = _from_cache(entry, netns.is_netns(entry.netns))
    for net in nets:
        for plugin in _plugin_configs(net):
            try:
                leases = hooks.hook(hooks.IPAM_LEASES)(net.name, plugin)
            except (CNIError, OSError) as e:
                warnings.append(f"{net.name}: host-local leases of {plugin.get('type')} unreadable: {e}")
                continue
            for ip, owner in leases:
                cid, _, ifname = owner.partition("/")  # a legacy lease: "<containerID> (legacy lease)"
                rows.setdefault((net.name, cid, ifname), _row(net.name, cid, ifname))["leases"].append(ip)
        report = runtime.reconcile_network_list(net, dry_run=True)
        reports.append(report.to_json())
        for stale in report.stale_attachments:
            for key, row in rows.items():
                if key[0] == net.name and stale.startswith(f"{key[1]}/{key[2]} "):
                    row["stale"] = "netns gone: gc --reconcile DELs it"
    if any(builtin_plugin(p.type) is not None for n in nets for p in n.plugins):
        try:
            groups: dict[str, Any] = hooks.hook(hooks.NFT_ATTACHMENTS)(runtime.state_dir)
        except (CNIError, OSError) as e:
            warnings.append(f"pycni nftables elements unreadable: {e}")
            groups = {}
        by_key = {Attachment(*k).key: k for k in rows}
        names = {n.name for n in nets}
        for digest, group in groups.items():
            owner = by_key.get(digest) or _owner(group)
            if owner is None or owner[0] not in names:
                continue
            row = rows.setdefault(owner, _row(*owner))
            row["nftElements"] = {o: len(e) for o, e in group.get("elements", {}).items()}
    for done in reports:
        for item in done["collected"]:
            for row in rows.values():
                who = re.escape(f"{row['containerId']}/{row['ifname']}")
                if row["network"] == done["network"] and re.search(rf" of {who}(\s|$)", item):
                    row["reconcile"].append(item)
    for row in rows.values():
        if not row["cached"]:
            row["stale"] = "not in the cache" + (": gc --reconcile collects it" if row["reconcile"] else "")
    return sorted(rows.values(), key=lambda r: (r["network"], r["containerId"], r["ifname"])), reports, warnings


def _cell(value: Any) -> str:
    if value is None or value == []:
        return "-"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    cells = [[h for h, _ in _COLUMNS]]
    for row in rows:
        line = [_cell(row[k]) for _, k in _COLUMNS]
        if row["netns"] is not None:
            line[3] = f"{row['netns'] or '-'} ({'alive' if row['netnsAlive'] else 'gone'})"
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(_COLUMNS) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1] for line in cells]


@click.command()
@click.argument("network", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the default when stdout is not a terminal).")
@conf_dir_option
@plugin_path_option()
@cache_dir_option()
@state_dir_option()
def inspect(network: str | None, as_json: bool, **opts: Any) -> None:
    """Every attachment of NETWORK (default: of every network in --conf-dir, and of the embedded
    nomad one when the cache has some): container, ifname, netns (alive or gone), addresses, host ports, host-side link,
    and what is stale (what `pycni gc NETWORK --reconcile` would change)."""
    runtime = runtime_for(opts | {"backend": "auto", "timeout": None})
    warnings: list[str] = []
    if network is not None:
        nets = [load_network(opts["conf_dir"], network)]
    else:
        errors: list[ConfigError] = []
        nets = config.list_networks(opts["conf_dir"], errors=errors)
        warnings += [f"skipped {' '.join(str(e).split())}" for e in errors]
        cached = {a.network for a in runtime.get_cached_attachments()}
        if DEFAULT_NETWORK in cached and all(n.name != DEFAULT_NETWORK for n in nets):
            nets.append(embedded_conflist())
    rows, reports, more = attachments_of(runtime, nets)
    for warning in warnings + more:
        click.echo(f"warning: {warning}", err=True)
    if as_json or not on_terminal():
        click.echo(json.dumps({"attachments": rows, "reconcile": reports}, indent=2))
        return
    for line in _table(rows):
        click.echo(line)
    for report in reports:
        for item in report["collected"]:
            click.echo(f"{report['network']}: `pycni gc {report['network']} --reconcile` would change {item}")
        for item in report["skipped"]:
            click.echo(f"{report['network']}: not inspected by the dry run: {item}")

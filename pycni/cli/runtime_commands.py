"""cnitool's verbs (add/check/del/gc/status) plus ``version`` and ``conf``.

The environment is read as cnitool reads it (``NETCONFPATH``, ``CNI_PATH``, ``CNI_IFNAME``,
``CNI_ARGS``, ``CAP_ARGS``) and the container ID is derived the same way, so a cnitool user
switches by changing the command name; every option overrides its variable.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .. import _json, config
from ..cache import DEFAULT_CACHE_DIR
from ..errors import CNIError, ConfigError, InvalidArgumentError, NetworkNotFoundError, NoConfigsFoundError
from ..sdk import parse_cni_args
from ..version import supports_status
from ._base import backend_option, cache_dir_option, on_terminal, plugin_path_option, state_dir_option

if TYPE_CHECKING:  # imported where used: the CLI loads the runtime lazily
    from ..runtime import Runtime
    from ..runtime_conf import RuntimeConf
    from ..sdk import GCAttachment

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "COMMANDS",
    "container_id_for",
    "load_network",
    "embedded_network",
    "DEFAULT_NETWORK",
    "embedded_conflist",
    "conf_dir_option",
    "runtime_for",
]

DEFAULT_NETWORK = "nomad"


def container_id_for(netns_path: str) -> str:
    """cnitool's ID: ``cnitool-`` + hex of the first 10 bytes of SHA-512 of the netns path."""
    return "cnitool-" + hashlib.sha512(netns_path.encode()).hexdigest()[:20]


def load_network(conf_dir: str, name: str) -> config.NetworkConfigList:
    """The named network from ``conf_dir``; ``nomad`` falls back to the embedded Nomad bridge."""
    try:
        return config.load_conflist(conf_dir, name)
    except (NoConfigsFoundError, NetworkNotFoundError):
        if name != DEFAULT_NETWORK:
            raise _unknown_network(conf_dir, name) from None
    return embedded_conflist()


def embedded_conflist() -> config.NetworkConfigList:
    """The embedded default network (``nomad``) as the runtime loads it."""
    return config.conflist_from_bytes(embedded_network(), source="<embedded nomad network>")


def _unknown_network(conf_dir: str, name: str) -> NetworkNotFoundError:
    """One line: where it was looked for, the close names, and how to see them all."""
    import difflib

    names = [n.name for n in config.list_networks(conf_dir, errors=[])] + [DEFAULT_NETWORK]
    close = difflib.get_close_matches(name, dict.fromkeys(names), n=3)
    where = conf_dir if os.path.isdir(conf_dir) else f"{conf_dir} (no such directory)"
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    return NetworkNotFoundError(f"no network named {name!r} in {where}{hint}; `pycni conf list` lists them all")


def embedded_network(ipam_data_dir: str | None = None) -> bytes:
    """Nomad's default bridge conflist (nomad, 172.26.64.0/20, loopback/bridge/firewall/portmap),
    its IPAM leases in ``ipam_data_dir`` (default: Nomad's)."""
    from ..nomad.conflist import DEFAULT_IPAM_DATA_DIR, NomadBridgeConfig, bridge_conflist

    return bridge_conflist(NomadBridgeConfig(ipam_data_dir=ipam_data_dir or DEFAULT_IPAM_DATA_DIR).with_defaults())


conf_dir_option = click.option(
    "--conf-dir",
    envvar="NETCONFPATH",
    default=config.DEFAULT_CONF_DIR,
    show_default=True,
    help="Network configuration directory [$NETCONFPATH].",
)


def _timeout_option(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    from ..backends import validate_timeout

    try:
        return validate_timeout(value)
    except InvalidArgumentError as e:
        raise click.BadParameter(e.msg) from None


def runtime_for(opts: dict[str, Any]) -> Runtime:
    from ..runtime import Runtime

    return Runtime(
        opts["plugin_path"].split(":") if opts["plugin_path"] else None,
        cache_dir=opts.get("cache_dir") or DEFAULT_CACHE_DIR,
        state_dir=opts.get("state_dir"),
        backend=opts["backend"],
        timeout=opts.get("timeout"),
    )


def _rt(opts: dict[str, Any], netns: str) -> RuntimeConf:
    from ..runtime_conf import RuntimeConf

    netns_path = os.path.abspath(netns) if netns else ""
    try:
        args = parse_cni_args(opts["args"] or "")
    except CNIError as e:
        raise InvalidArgumentError(f"invalid CNI_ARGS: {e.msg}") from None
    cap_args: Any = {}
    if opts["cap_args"]:
        try:
            cap_args = _json.loads(opts["cap_args"])
        except _json.JSONDecodeFailure as e:
            raise InvalidArgumentError(f"invalid CAP_ARGS: {e}") from None
        if not isinstance(cap_args, dict):
            raise InvalidArgumentError("invalid CAP_ARGS: expected a JSON object")
    return RuntimeConf(
        container_id=opts["container_id"] or container_id_for(netns_path),
        netns=netns_path,
        ifname=opts["ifname"] or "eth0",
        args=args,
        capability_args=cap_args,
    )


#: Every option of the cnitool verbs, in help order; each defaults to cnitool's environment variable.
_OPTIONS: dict[str, Callable[[F], F]] = {
    "conf_dir": conf_dir_option,
    "plugin_path": plugin_path_option(),
    "ifname": click.option(
        "--ifname",
        "-i",
        envvar="CNI_IFNAME",
        default="eth0",
        show_default=True,
        help="Interface name in the container [$CNI_IFNAME].",
    ),
    "container_id": click.option(
        "--container-id", default="", help="Container ID (default: derived from NETNS like cnitool)."
    ),
    "args": click.option("--args", envvar="CNI_ARGS", default="", help="CNI_ARGS, K=V;K2=V2 [$CNI_ARGS]."),
    "cap_args": click.option(
        "--cap-args", envvar="CAP_ARGS", default="", help="Capability args, a JSON object [$CAP_ARGS]."
    ),
    "cache_dir": cache_dir_option(),
    "state_dir": state_dir_option(),
    "timeout": click.option(
        "--timeout",
        type=float,
        callback=_timeout_option,
        envvar="PYCNI_TIMEOUT",
        default=None,
        help="Seconds per exec'd plugin call [$PYCNI_TIMEOUT].",
    ),
    "backend": backend_option(),
}


def _with(*names: str) -> Callable[[F], F]:
    """The options ``names`` (a verb lists only those it uses)."""

    def apply(fn: F) -> F:
        for name in reversed([n for n in _OPTIONS if n in names]):
            fn = _OPTIONS[name](fn)
        return fn

    return apply


_PLUGINS = ("plugin_path", "state_dir", "timeout", "backend")
#: add, check, del: a network and one attachment.
_common = _with("conf_dir", "ifname", "container_id", "args", "cap_args", "cache_dir", *_PLUGINS)


@click.command()
@click.argument("network")
@click.argument("netns")
@click.option("--rollback", is_flag=True, help="On failure, DEL the plugins that ran.")
@_common
def add(network: str, netns: str, rollback: bool, **opts: Any) -> None:
    """ADD the container in NETNS to NETWORK; print the result."""
    net = load_network(opts["conf_dir"], network)
    result = runtime_for(opts).add_network_list(net, _rt(opts, netns), rollback=rollback)
    click.echo(json.dumps(result.to_json(), indent=4), nl=False)


@click.command()
@click.argument("network")
@click.argument("netns")
@_common
def check(network: str, netns: str, **opts: Any) -> None:
    """CHECK the container's attachment to NETWORK."""
    net, rt = load_network(opts["conf_dir"], network), _rt(opts, netns)
    runtime_for(opts).check_network_list(net, rt)
    if on_terminal():
        skipped = " (disableCheck: nothing checked)" if net.disable_check else ""
        click.echo(f"{net.name}: {rt.container_id}/{rt.ifname} checks out{skipped}")


@click.command(name="del")
@click.argument("network")
@click.argument("netns")
@click.option("--best-effort", is_flag=True, help="Run every plugin's DEL even after failures; report all.")
@_common
def delete(network: str, netns: str, best_effort: bool, **opts: Any) -> None:
    """DEL the container's attachment to NETWORK."""
    net = load_network(opts["conf_dir"], network)
    runtime_for(opts).delete_network_list(net, _rt(opts, netns), best_effort=best_effort)


def _attachment(value: str) -> GCAttachment:
    from ..sdk import GCAttachment

    cid, sep, ifname = value.rpartition(":")
    if not sep or not cid or not ifname:
        raise click.BadParameter(f"{value!r} is not CONTAINER_ID:IFNAME")
    return GCAttachment(cid, ifname)


@click.command()
@click.argument("network")
@click.option(
    "--valid",
    "valid",
    multiple=True,
    metavar="CID:IFNAME",
    help="A still-valid attachment (repeatable); every other cached attachment is stale.",
)
@click.option(
    "--all-stale",
    is_flag=True,
    help="Treat every cached attachment as stale (cnitool's gc without valid attachments).",
)
@click.option(
    "--reconcile",
    is_flag=True,
    help="Collect what crashes and reboots left: DEL attachments whose netns is gone, then GC every plugin "
    "with the other cached attachments valid (built-in plugins report what they removed). Prints a JSON report.",
)
@click.option("--dry-run", is_flag=True, help="Change nothing: print (JSON) what would be collected.")
@_with("conf_dir", "cache_dir", *_PLUGINS)
def gc(network: str, valid: tuple[str, ...], all_stale: bool, reconcile: bool, dry_run: bool, **opts: Any) -> None:
    """GC NETWORK: DEL stale cached attachments, then GC every plugin.

    Which attachments are stale is said explicitly: --valid for each live one, --all-stale for
    none live, or --reconcile (those whose netns is gone). With none of them gc refuses.
    """
    if sum((bool(valid), all_stale, reconcile)) > 1:
        raise click.UsageError("--valid, --all-stale and --reconcile are alternatives: choose one")
    net = load_network(opts["conf_dir"], network)
    runtime = runtime_for(opts)
    if reconcile:
        report = runtime.reconcile_network_list(net, dry_run=dry_run)
        click.echo(json.dumps(report.to_json(), indent=2))
        if report.errors:
            raise SystemExit(1)
        return
    keep = {(a.container_id, a.ifname) for a in map(_attachment, valid)}
    stale = [
        a for a in runtime.get_cached_attachments() if a.network == net.name and (a.container_id, a.ifname) not in keep
    ]
    if dry_run:
        listed = [f"{a.container_id}/{a.ifname} (netns {a.netns or '-'})" for a in stale]
        click.echo(json.dumps({"network": net.name, "dryRun": True, "staleAttachments": listed}, indent=2))
        return
    if not (valid or all_stale):
        would = f"DEL {', '.join(f'{a.container_id}/{a.ifname}' for a in stale)} and " if stale else ""
        raise click.ClickException(
            f"refusing to GC {net.name!r} without valid attachments: it would {would}have every plugin remove "
            f"all it keeps for {net.name!r}. Name the live ones with --valid CID:IFNAME, pass --all-stale, "
            "or --reconcile (only those whose netns is gone); --dry-run lists"
        )
    runtime.gc_network_list(net, [_attachment(v) for v in valid] if valid else None)


@click.command()
@click.argument("network")
@_with("conf_dir", *_PLUGINS)
def status(network: str, **opts: Any) -> None:
    """STATUS of NETWORK's plugins (exit 1 with the plugin's code when not ready)."""
    net = load_network(opts["conf_dir"], network)
    runtime_for(opts).get_status_network_list(net)
    if on_terminal():
        if supports_status(net.cni_version):
            click.echo(f"{net.name}: ready ({len(net.plugins)} plugin(s) answered STATUS)")
        else:
            click.echo(f"{net.name}: cniVersion {net.cni_version} predates STATUS; nothing to ask")


@click.command()
@click.argument("plugin_type", required=False)
@_with("plugin_path", "timeout", "backend")
def version(plugin_type: str | None, **opts: Any) -> None:
    """pycni's version, or a plugin's VERSION answer."""
    from .. import __version__
    from ..version import SUPPORTED

    if plugin_type is None:
        out = {"pycni": __version__, "cniVersion": SUPPORTED[-1], "supportedVersions": list(SUPPORTED)}
    else:
        out = runtime_for(opts).get_version_info(plugin_type).to_json()
    click.echo(json.dumps(out, indent=2))


@click.group()
def conf() -> None:
    """Inspect a network configuration directory."""


def _summary(net: config.NetworkConfigList) -> dict[str, Any]:
    return {
        "name": net.name,
        "cniVersion": net.cni_version,
        "plugins": [p.type for p in net.plugins],
        "source": net.source,
    }


@conf.command(name="list")
@conf_dir_option
def conf_list(conf_dir: str) -> None:
    """Every network in the dir, in load order (the first file of a name wins), then the embedded
    nomad network unless the dir has one (marked "embedded"). A file that cannot be loaded is
    reported on stderr and the rest are listed (exit 1 then)."""
    if not os.path.isdir(conf_dir):
        raise click.BadParameter(f"{conf_dir} is not a directory", param_hint="--conf-dir")
    errors: list[ConfigError] = []
    listed = [_summary(n) for n in config.list_networks(conf_dir, errors=errors)]
    if all(n["name"] != DEFAULT_NETWORK for n in listed):
        listed.append(_summary(embedded_conflist()) | {"embedded": True})
    click.echo(json.dumps(listed, indent=2))
    for error in errors:
        click.echo(f"pycni: skipped {' '.join(str(error).split())}", err=True)
    if errors:
        raise SystemExit(1)


@conf.command(name="show")
@click.argument("name")
@conf_dir_option
def conf_show(name: str, conf_dir: str) -> None:
    """The network NAME as the runtime loads it (drop-ins appended, cniVersion selected)."""
    net = load_network(conf_dir, name)
    out = _summary(net) | {
        "disableCheck": net.disable_check,
        "disableGC": net.disable_gc,
        "plugins": [dict(p.raw) for p in net.plugins],
    }
    click.echo(json.dumps(out, indent=2))


@conf.command(name="validate")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--plugins", "check_plugins", is_flag=True, help="Also check each plugin exists and supports the version."
)
@plugin_path_option()
@backend_option()
def conf_validate(path: str, check_plugins: bool, plugin_path: str, backend: str) -> None:
    """Parse PATH (.conflist, or a single .conf/.json); print its summary."""
    if path.endswith(".conflist"):
        net = config.conflist_from_file(path)
    else:
        net = config.conflist_from_conf(config.conf_from_file(path))
    out = _summary(net)
    if check_plugins:
        from ..runtime import Runtime

        out["capabilities"] = Runtime(
            plugin_path.split(":") if plugin_path else None, backend=backend
        ).validate_network_list(net)
    click.echo(json.dumps(out, indent=2))


COMMANDS = [add, check, delete, gc, status, version, conf]

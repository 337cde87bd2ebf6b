"""``pycni nomad …``: Nomad's CNI configurator pieces from the command line, JSON in and out.

Inputs are Nomad API JSON (``nomad operator api /v1/allocation/<id>``, ``/v1/node/<id>``).
A failure prints one line with its CNI error code on stderr and exits 1; usage errors exit 2.
Imports of pycni's Nomad code are deferred so ``--help`` stays fast.
"""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING, Any

import click

from ._base import Group, backend_option, cache_dir_option, plugin_path_option, state_dir_option

if TYPE_CHECKING:
    from ..nomad.models import Allocation, Node

__all__ = ["nomad"]


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


def _alloc(stream: IO[bytes]) -> Allocation:
    from ..nomad.models import Allocation

    return Allocation.loads(stream.read())


def _node(stream: IO[bytes]) -> Node:
    from ..nomad.models import Node

    return Node.loads(stream.read())


alloc_option = click.option(
    "--alloc", "alloc_file", type=click.File("rb"), required=True, help="Allocation JSON (Nomad API form; - = stdin)."
)
node_option = click.option(
    "--node", "node_file", type=click.File("rb"), required=True, help="Node JSON (Nomad API form)."
)
netns_option = click.option("--netns", required=True, help="Path of the allocation's network namespace.")


@click.group(name="nomad", cls=Group)
def nomad() -> None:
    """Nomad's CNI network configurator: conflist, port maps, tproxy, CNI args, status."""


@nomad.command()
@click.option("--bridge-name", default="nomad", show_default=True, help="Bridge interface (bridge_network_name).")
@click.option("--subnet", default="172.26.64.0/20", show_default=True, help="IPv4 alloc subnet.")
@click.option("--subnet-ipv6", default="", help="IPv6 alloc subnet (bridge_network_subnet_ipv6); unset = no IPv6.")
@click.option("--hairpin", is_flag=True, help="Hairpin mode (bridge_network_hairpin_mode).")
@click.option("--consul-cni", is_flag=True, help="Append consul-cni (groups with transparent proxy).")
@click.option("--fold", "folded", is_flag=True, help="Folded: one pycni-chain plugin holding the list.")
def conflist(bridge_name: str, subnet: str, subnet_ipv6: str, hairpin: bool, consul_cni: bool, folded: bool) -> None:
    """Print the bridge conflist exactly as the Nomad client writes it (no trailing newline);
    with --fold, its folded form (`pycni conf fold`)."""
    from ..nomad.conflist import NomadBridgeConfig, bridge_conflist, validate_subnets

    validate_subnets(subnet, subnet_ipv6)
    conf = NomadBridgeConfig(bridge_name, subnet, subnet_ipv6, hairpin, consul_cni).with_defaults()
    data = bridge_conflist(conf)
    if folded:
        from ..chain import fold

        data = fold(data)
    click.echo(data, nl=False)


@nomad.command()
@alloc_option
@click.option("--ignore-host-ip", is_flag=True, help="Drop host IPs (the client's bind_wildcard_default_host_network).")
def ports(alloc_file: IO[bytes], ignore_host_ip: bool) -> None:
    """Print the portMappings capability (label, hostPort, containerPort, protocol[, hostIP])."""
    from ..nomad.ports import port_mappings

    _echo_json(port_mappings(_alloc(alloc_file), ignore_host_ip).to_json())


@nomad.command()
@alloc_option
@node_option
@netns_option
def tproxy(alloc_file: IO[bytes], node_file: IO[bytes], netns: str) -> None:
    """Print the CONSUL_IPTABLES_CONFIG value, or null without a transparent proxy."""
    from ..nomad.ports import port_mappings
    from ..nomad.tproxy import transparent_proxy_config

    alloc = _alloc(alloc_file)
    # Host IPs do not matter here: only the port numbers feed the tproxy config.
    config = transparent_proxy_config(alloc, _node(node_file), netns, port_mappings(alloc, ignore_host_ip=True))
    click.echo(config.to_json() if config is not None else "null")


@nomad.command(name="cni-args")
@alloc_option
@node_option
@netns_option
def cni_args_command(alloc_file: IO[bytes], node_file: IO[bytes], netns: str) -> None:
    """Print the CNI args Setup passes to every plugin, as a JSON object."""
    from ..nomad.args import cni_args
    from ..nomad.ports import port_mappings
    from ..nomad.tproxy import transparent_proxy_config

    alloc = _alloc(alloc_file)
    config = transparent_proxy_config(alloc, _node(node_file), netns, port_mappings(alloc, ignore_host_ip=True))
    _echo_json(cni_args(alloc, config))


@nomad.command()
@click.argument("result_file", metavar="RESULT.json", type=click.File("rb"))
@click.option("--default-ifname", default="eth0", show_default=True, help="go-cni's default interface (plain results).")
def status(result_file: IO[bytes], default_ifname: str) -> None:
    """Print the allocation network status of a go-cni Result (Go JSON) or plain CNI result(s)."""
    from ..nomad.models import load_json
    from ..nomad.status import alloc_net_status, result_from_json

    result = result_from_json(load_json(result_file.read(), "result"), default_ifname=default_ifname)
    _echo_json(alloc_net_status(result).to_json())


# -- setup / teardown ----------------------------------------------------------------------------


def _run_options(fn: Any) -> Any:
    options = [
        alloc_option,
        node_option,
        netns_option,
        click.option("--conf-dir", default=None, help="Use network NAME from this dir (cni/<name> mode)."),
        click.option("--network", default=None, help="Network name in --conf-dir."),
        click.option("--bridge-name", default="nomad", show_default=True, help="Embedded bridge: bridge name."),
        click.option("--subnet", default="172.26.64.0/20", show_default=True, help="Embedded bridge: IPv4 subnet."),
        click.option("--subnet-ipv6", default="", help="Embedded bridge: IPv6 subnet."),
        click.option("--hairpin", is_flag=True, help="Embedded bridge: hairpin mode."),
        plugin_path_option("--cni-path"),
        backend_option(),
        cache_dir_option(),
        state_dir_option(),
        click.option("--host-netns", default=None, help="Run the plugins in this network namespace (a path)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _configurator(opts: dict[str, Any], alloc: Allocation) -> Any:
    """Nomad's configurator for the alloc: ``cni/<name>`` from --conf-dir, else the bridge network."""
    import functools

    from ..nomad import BridgeNetworkConfigurator, NetworkConfigurator, make_client
    from ..nomad.cleanup import force_cleanup
    from ..nomad.conflist import validate_subnets
    from ..sdk import default_state_dir

    cni_mode = bool(opts["conf_dir"] or opts["network"])
    if cni_mode and not (opts["conf_dir"] and opts["network"]):
        raise click.UsageError("--conf-dir and --network go together")
    if not cni_mode:
        validate_subnets(opts["subnet"], opts["subnet_ipv6"])
    state_dir = opts["state_dir"] or default_state_dir()  # the runtime and forced cleanup share it
    client = make_client(
        opts["plugin_path"],
        cache_dir=opts["cache_dir"],
        state_dir=state_dir,
        backend=opts["backend"],
        host_netns=opts["host_netns"],
    )
    cleanup = functools.partial(force_cleanup, host_netns=opts["host_netns"], own_state=_own_state(state_dir))
    node = _node(opts.pop("node_file"))
    if cni_mode:
        return NetworkConfigurator(client, (opts["conf_dir"], opts["network"]), node, cleanup=cleanup)
    return BridgeNetworkConfigurator.for_alloc(
        client,
        alloc,
        node,
        bridge_name=opts["bridge_name"],
        subnet=opts["subnet"],
        subnet_ipv6=opts["subnet_ipv6"],
        hairpin=opts["hairpin"],
        host_netns=opts["host_netns"],
        cleanup=cleanup,
    )


def _own_state(state_dir: str) -> Any:
    """pycni's own kernel state of the alloc (records under ``state_dir``), removed by forced
    cleanup (the plugins' hook)."""
    from ..sdk import hooks

    remove = hooks.hook(hooks.FORCED_CLEANUP)
    return lambda network, alloc_id: tuple(remove(network, alloc_id, state_dir))


@nomad.command()
@_run_options
@click.option("--existing", is_flag=True, help="The namespace already existed (restore): CHECK instead of ADD.")
def setup(alloc_file: IO[bytes], netns: str, existing: bool, **opts: Any) -> None:
    """Set up the allocation's network for real; print its network status (null after a restore CHECK)."""
    alloc = _alloc(alloc_file)
    status = _configurator(opts, alloc).setup(alloc, netns, created=not existing)
    _echo_json(status.to_json() if status is not None else None)


@nomad.command()
@_run_options
def teardown(alloc_file: IO[bytes], netns: str, **opts: Any) -> None:
    """Tear the allocation's network down; print the forced-cleanup report (null when DEL succeeded)."""
    alloc = _alloc(alloc_file)
    report = _configurator(opts, alloc).teardown(alloc, netns)
    _echo_json(report.to_json() if report is not None else None)

"""``pycni nomad …``: Nomad's CNI configurator pieces from the command line, JSON in and out.

Inputs are Nomad API JSON (``nomad operator api /v1/allocation/<id>``, ``/v1/node/<id>``).
A failure prints one line with its CNI error code on stderr and exits 1; usage errors exit 2.
Imports of pycni's Nomad code are deferred so ``--help`` stays fast.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from ..errors import CNIError

if TYPE_CHECKING:
    from ..nomad.models import Allocation, Node

__all__ = ["nomad"]

F = TypeVar("F", bound=Callable[..., Any])


class CNIFailure(click.ClickException):
    """A :class:`~pycni.errors.CNIError` as a one-line CLI error (exit status 1)."""

    def __init__(self, error: CNIError) -> None:
        super().__init__(f"{' '.join(str(error).split())} (CNI error code {error.code})")


def _reports_cni_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CNIError as e:
            raise CNIFailure(e) from None

    return wrapper  # type: ignore[return-value]


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


@click.group(name="nomad")
def nomad() -> None:
    """Nomad's CNI network configurator: conflist, port maps, tproxy, CNI args, status."""


@nomad.command()
@click.option("--bridge-name", default="nomad", show_default=True, help="Bridge interface (bridge_network_name).")
@click.option("--subnet", default="172.26.64.0/20", show_default=True, help="IPv4 alloc subnet.")
@click.option("--subnet-ipv6", default="", help="IPv6 alloc subnet (bridge_network_subnet_ipv6); unset = no IPv6.")
@click.option("--hairpin", is_flag=True, help="Hairpin mode (bridge_network_hairpin_mode).")
@click.option("--consul-cni", is_flag=True, help="Append consul-cni (groups with transparent proxy).")
@_reports_cni_errors
def conflist(bridge_name: str, subnet: str, subnet_ipv6: str, hairpin: bool, consul_cni: bool) -> None:
    """Print the bridge conflist exactly as the Nomad client writes it (no trailing newline)."""
    from ..nomad.conflist import BridgeConfig, bridge_conflist, validate_subnets

    validate_subnets(subnet, subnet_ipv6)
    conf = BridgeConfig(bridge_name, subnet, subnet_ipv6, hairpin, consul_cni).with_defaults()
    click.echo(bridge_conflist(conf), nl=False)


@nomad.command()
@alloc_option
@click.option("--ignore-host-ip", is_flag=True, help="Drop host IPs (the client's bind_wildcard_default_host_network).")
@_reports_cni_errors
def ports(alloc_file: IO[bytes], ignore_host_ip: bool) -> None:
    """Print the portMappings capability (label, hostPort, containerPort, protocol[, hostIP])."""
    from ..nomad.ports import port_mappings

    _echo_json([p.to_json() for p in port_mappings(_alloc(alloc_file), ignore_host_ip)])


@nomad.command()
@alloc_option
@node_option
@netns_option
@_reports_cni_errors
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
@_reports_cni_errors
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
@_reports_cni_errors
def status(result_file: IO[bytes], default_ifname: str) -> None:
    """Print the allocation network status of a go-cni Result (Go JSON) or plain CNI result(s)."""
    from ..nomad.models import load_json
    from ..nomad.status import alloc_net_status, result_from_json

    result = result_from_json(load_json(result_file.read(), "result"), default_ifname=default_ifname)
    _echo_json(alloc_net_status(result).to_json())


# -- setup / teardown ----------------------------------------------------------------------------
# Left for the lead to wire once pycni.client and the in-process plugins settle: build the client
# with pycni.nomad.make_client(), the conf from bridge_conflist(...) or (conf_dir, name), then
# NetworkConfigurator(client, conf, node).setup(alloc, netns, created) / .teardown(alloc, netns).

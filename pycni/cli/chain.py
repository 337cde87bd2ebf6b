"""``pycni conf fold`` and ``pycni conf unfold``: a network list as one ``pycni-chain`` plugin
(one exec per network for an exec'ing runtime), and back."""

from __future__ import annotations

import os

import click

from .. import config
from ..errors import ConfigError

__all__ = ["fold", "unfold"]


def _source(network: str, conf_dir: str) -> tuple[bytes, str]:
    """The bytes and path of NETWORK: a file, else the file of that name in ``conf_dir`` (the
    file as written: drop-ins stay outside, where the runtime appends them)."""
    if os.path.exists(network):
        path = network
    else:
        from .runtime_commands import load_network

        path = load_network(conf_dir, network).source
        if not os.path.isfile(path):
            raise ConfigError(f'network "{network}" has no file to fold (it is {path})')
    with open(path, "rb") as f:
        return f.read(), path


def _write(data: bytes, out: str | None) -> None:
    """To stdout, or replacing ``out`` atomically: a runtime reading the config directory sees
    the old list or the new one, never half of it (``out`` may be the file folded)."""
    if out is None:
        click.echo(data, nl=False)
        return
    partial = f"{out}.pycni-partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, out)


_conf_dir = click.option(
    "--conf-dir",
    envvar="NETCONFPATH",
    default=config.DEFAULT_CONF_DIR,
    show_default=True,
    help="Network configuration directory, for NETWORK by name [$NETCONFPATH].",
)
_out = click.option("-o", "--output", "out", type=click.Path(dir_okay=False), help="Write here instead of stdout.")


@click.command(name="fold")
@click.argument("network")
@_conf_dir
@_out
@click.option("--best-effort-del", is_flag=True, help="DEL runs every inner plugin and reports every failure.")
def fold(network: str, conf_dir: str, out: str | None, best_effort_del: bool) -> None:
    """Print NETWORK (a name in the conf dir, or a file) folded: one pycni-chain plugin holding
    its plugins, so an exec'ing runtime starts one process for the whole list."""
    from ..chain import fold as fold_list

    data, path = _source(network, conf_dir)
    _write(fold_list(data, best_effort_del=best_effort_del, source=path), out)


@click.command(name="unfold")
@click.argument("network")
@_conf_dir
@_out
def unfold(network: str, conf_dir: str, out: str | None) -> None:
    """Print a folded NETWORK (a name in the conf dir, or a file) as the list it came from."""
    from ..chain import unfold as unfold_list

    data, path = _source(network, conf_dir)
    _write(unfold_list(data, source=path), out)

"""``pycni plugins``: the built-in in-process plugins, and installing them as CNI binaries."""

from __future__ import annotations

import json

import click

from ._base import Group

__all__ = ["plugins"]


@click.group(cls=Group)
def plugins() -> None:
    """Built-in plugins (also exec'able by any CNI runtime once installed)."""


@plugins.command(name="list")
def list_plugins() -> None:
    """Every built-in plugin type and its version."""
    from pycni_plugins.install import list_builtin

    click.echo(json.dumps([{"type": t, "version": v} for t, v in list_builtin()], indent=2))


@plugins.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--type", "types", multiple=True, metavar="TYPE", help="Only these types (repeatable).")
@click.option(
    "--socket",
    "socket_path",
    default=None,
    help="The `pycni serve` socket the shims use when PYCNI_SOCKET is unset [default /run/pycni/pycni.sock].",
)
def install(directory: str, types: tuple[str, ...], socket_path: str | None) -> None:
    """Write an executable per plugin type into DIRECTORY (e.g. /opt/cni/bin) for libcni,
    cnitool, containerd, Nomad or podman to exec: a shim handing each call to `pycni serve`,
    or running the plugin itself when no daemon answers."""
    from pycni_plugins.install import install as do_install

    try:
        written = do_install(directory, types or None, socket=socket_path)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--type") from None
    for path in written:
        click.echo(path)

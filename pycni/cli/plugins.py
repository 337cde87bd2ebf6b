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
@click.option(
    "--force",
    is_flag=True,
    help="Replace files pycni did not write (a Go plugin of the same type), and install even where another "
    "user could replace the plugins (warns instead).",
)
def install(directory: str, types: tuple[str, ...], socket_path: str | None, force: bool) -> None:
    """Write an executable per plugin type into DIRECTORY (e.g. /opt/cni/bin) for libcni,
    cnitool, containerd, Nomad or podman to exec: a shim handing each call to `pycni serve`,
    or running the plugin itself when no daemon answers. DIRECTORY and its ancestors must be
    owned by root or you and writable by no one else (a sticky /tmp aside), and a file of the
    same name must be an earlier shim, unless --force."""
    from pycni._fs import unsafe_ancestor
    from pycni_plugins.install import ForeignFiles, UnsafeDirectory
    from pycni_plugins.install import install as do_install

    unsafe = unsafe_ancestor(directory) if force else None
    if unsafe:
        click.echo(f"warning: another user could replace the plugins installed in {directory}: {unsafe}", err=True)
    try:
        written = do_install(directory, types or None, socket=socket_path, force=force)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--type") from None
    except UnsafeDirectory as e:
        raise click.ClickException(f"{e} (--force to install anyway)") from None
    except ForeignFiles as e:
        raise click.ClickException(f"{e}; nothing installed (--force replaces them)") from None
    for path in written:
        click.echo(path)


@plugins.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--type", "types", multiple=True, metavar="TYPE", help="Only these types (repeatable).")
def uninstall(directory: str, types: tuple[str, ...]) -> None:
    """Remove the shims `pycni plugins install` wrote in DIRECTORY; every other file stays."""
    from pycni_plugins.install import uninstall as do_uninstall

    for path in do_uninstall(directory, types or None):
        click.echo(path)

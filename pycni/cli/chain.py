"""``pycni conf fold`` and ``pycni conf unfold``: a network list as one ``pycni-chain`` plugin
(one exec per network for an exec'ing runtime), and back."""

from __future__ import annotations

import os

import click

from ..errors import ConfigError
from .runtime_commands import conf_dir_option, load_network

__all__ = ["fold", "unfold"]


def _source(network: str, conf_dir: str) -> tuple[bytes, str]:
    """The bytes and path of NETWORK: a file, else the file of that name in ``conf_dir`` (the
    file as written: drop-ins stay outside, where the runtime appends them)."""
    if os.path.exists(network):
        path = network
    else:
        path = load_network(conf_dir, network).source
        if not os.path.isfile(path):
            raise ConfigError(f'network "{network}" has no file to fold (it is {path})')
    try:
        with open(path, "rb") as f:
            return f.read(), path
    except OSError as e:
        raise click.FileError(path, e.strerror) from None


def _write(data: bytes, out: str | None) -> None:
    """To stdout, or replacing ``out`` atomically: a runtime reading the config directory sees
    the old list or the new one, never half of it (``out`` may be the file folded)."""
    if out is None:
        click.echo(data, nl=False)
        return
    from .._fs import write_atomic

    try:
        dir_fd = os.open(os.path.dirname(os.path.abspath(out)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            write_atomic(dir_fd, os.path.basename(out), data, mode=0o644)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise click.FileError(out, e.strerror) from None


_out = click.option("-o", "--output", "out", type=click.Path(dir_okay=False), help="Write here instead of stdout.")


@click.command(name="fold")
@click.argument("network")
@conf_dir_option
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
@conf_dir_option
@_out
def unfold(network: str, conf_dir: str, out: str | None) -> None:
    """Print a folded NETWORK (a name in the conf dir, or a file) as the list it came from."""
    from ..chain import unfold as unfold_list

    data, path = _source(network, conf_dir)
    _write(unfold_list(data, source=path), out)

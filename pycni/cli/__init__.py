"""The ``pycni`` command line: a cnitool-compatible runtime CLI and more.

Failures print one line (with the CNI error code) on stderr and exit 1; usage errors exit 2.
Heavy modules (pyroute2, the plugins) are imported only by the commands that need them.
"""

from __future__ import annotations

import click

from .._version import __version__
from ._base import Group

__all__ = ["main", "cli"]


class _Group(Group):
    """Loads subcommand modules on first use so ``pycni add`` does not pay for ``pycni demo``."""

    lazy = {
        "nomad": ("pycni.cli.nomad", "nomad"),
        "demo": ("pycni.cli.demo", "demo"),
        "plugins": ("pycni.cli.plugins", "plugins"),
        "serve": ("pycni.cli.serve", "serve"),
        "fuzz": ("pycni.cli.fuzz", "fuzz"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            import importlib

            module, attr = self.lazy[name]
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, name)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="pycni", message="%(prog)s %(version)s")
def cli() -> None:
    """pycni: run CNI network configurations (cnitool-compatible) with exec'd or in-process plugins."""


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="pycni")


def _register() -> None:
    from .runtime_commands import COMMANDS

    for command in COMMANDS:
        cli.add_command(command)


_register()

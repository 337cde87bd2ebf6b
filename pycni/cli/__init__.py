"""The ``pycni`` command line: a cnitool-compatible runtime CLI and more.

Failures print one line (with the CNI error code) on stderr and exit 1; usage errors exit 2.
``--log-level`` (``$PYCNI_LOG_LEVEL``) turns on the log, on stderr (:mod:`pycni.sdk.logs`).
Heavy modules (pyroute2, the plugins) are imported only by the commands that need them.
"""

from __future__ import annotations

import click

from .._version import __version__
from ._base import Group, configure_logging, log_level_option

__all__ = ["main", "cli"]


class _Group(Group):
    """Loads subcommand modules on first use so ``pycni add`` does not pay for ``pycni demo``."""

    lazy = {
        "nomad": ("pycni.cli.nomad", "nomad"),
        "demo": ("pycni.cli.demo", "demo"),
        "plugins": ("pycni.cli.plugins", "plugins"),
        "serve": ("pycni.cli.serve", "serve"),
        "fuzz": ("pycni.cli.fuzz", "fuzz"),
        "inspect": ("pycni.cli.inspect", "inspect"),
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
@log_level_option()
@click.pass_context
def cli(ctx: click.Context, log_level: int | None) -> None:
    """pycni: run CNI network configurations (cnitool-compatible) with exec'd or in-process plugins."""
    ctx.obj = log_level
    if ctx.invoked_subcommand != "serve":  # the daemon has a log of its own
        configure_logging(log_level)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="pycni")


def _register() -> None:
    from .chain import fold, unfold
    from .runtime_commands import COMMANDS, conf

    for command in COMMANDS:
        cli.add_command(command)
    conf.add_command(fold)
    conf.add_command(unfold)


_register()

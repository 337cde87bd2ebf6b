"""What every pycni command group shares: a CNI failure is one line on stderr, exit status 1."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import IO, Any, TypeVar

import click

from ..backends import BACKEND_NAMES
from ..cache import DEFAULT_CACHE_DIR
from ..errors import CNIError
from ..runtime import DEFAULT_PLUGIN_PATH
from ..sdk import logs

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "CNIFailure",
    "ExtraMissing",
    "Group",
    "on_terminal",
    "backend_option",
    "cache_dir_option",
    "state_dir_option",
    "plugin_path_option",
    "log_level_option",
    "configure_logging",
]


def on_terminal() -> bool:
    """Whether stdout is a terminal: a person reading, not a script (who gets JSON, or nothing
    but the exit status)."""
    return sys.stdout.isatty()


class CNIFailure(click.ClickException):
    """A :class:`~pycni.errors.CNIError` as the CLI reports it: ``pycni: error (code N): msg``."""

    exit_code = 1

    def __init__(self, error: CNIError) -> None:
        self.error = error
        super().__init__(" ".join(str(error).split()))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"pycni: error (code {self.error.code}): {self.message}", err=True, file=file)


class ExtraMissing(click.ClickException):
    """A verb whose optional dependencies (an extra of pycni's) are not installed: one line naming
    the extra to install."""

    def __init__(self, extra: str, error: ModuleNotFoundError) -> None:
        super().__init__(f"{error.name} is not installed: pip install 'pycni[{extra}]'")

    @classmethod
    def check(cls, extra: str, modules: tuple[str, ...], error: ImportError) -> None:
        """Raise for ``error`` if it is one of ``modules`` (the extra's) missing; else nothing."""
        if isinstance(error, ModuleNotFoundError) and (error.name or "").partition(".")[0] in modules:
            raise cls(extra, error) from None


class Group(click.Group):
    """A group whose commands' CNI errors become :class:`CNIFailure` (nested groups included)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CNIError as e:
            raise CNIFailure(e) from None


def backend_option() -> Callable[[F], F]:
    return click.option(
        "--backend",
        type=click.Choice(BACKEND_NAMES),
        envvar="PYCNI_BACKEND",
        default="auto",
        show_default=True,
        help="How plugins run: exec'd, in-process, or in-process where built in [$PYCNI_BACKEND].",
    )


def cache_dir_option() -> Callable[[F], F]:
    return click.option(
        "--cache-dir",
        envvar="PYCNI_CACHE_DIR",
        default=DEFAULT_CACHE_DIR,
        show_default=True,
        help="Results cache root [$PYCNI_CACHE_DIR].",
    )


def state_dir_option() -> Callable[[F], F]:
    # No envvar here: the runtime resolves $PYCNI_STATE_DIR (pycni.sdk.default_state_dir).
    return click.option(
        "--state-dir",
        default=None,
        help="The plugins' state dir [$PYCNI_STATE_DIR, else /run/pycni].",
    )


def plugin_path_option(name: str = "--plugin-path") -> Callable[[F], F]:
    """The plugin dirs of every verb: ``$CNI_PATH``, else the runtime's one default."""
    return click.option(
        name,
        "plugin_path",
        envvar="CNI_PATH",
        default=":".join(DEFAULT_PLUGIN_PATH),
        show_default=True,
        help="Plugin dirs for exec'd plugins, ':'-separated [$CNI_PATH].",
    )


def _level(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """A level name (any case) or number, as :func:`..sdk.logs.parse_level` reads it (the
    exec'd plugins and the daemon read ``$PYCNI_LOG_LEVEL`` the same way)."""
    try:
        return logs.parse_level(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def log_level_option() -> Callable[[F], F]:
    """The global ``--log-level``: a level name, passed on as a :mod:`logging` level (``None``:
    not given; each verb's default applies)."""
    return click.option(
        "--log-level",
        metavar="[" + "|".join(logs.LEVELS) + "|N]",
        envvar=logs.LEVEL_ENV,
        default=None,
        callback=_level,
        help="Log pycni's work at this level on stderr: debug shows every plugin call and kernel "
        "change [$PYCNI_LOG_LEVEL; default: warning, and info for serve].",
    )


def configure_logging(level: int | None) -> None:
    """The CLI's log: stderr, text; warning when no level is given. A level given is passed on
    to the plugins it execs (``$PYCNI_LOG_LEVEL``), whose stderr the runtime logs."""
    if level is not None:
        os.environ[logs.LEVEL_ENV] = logging.getLevelName(level).lower()
    logs.configure(level if level is not None else logging.WARNING)

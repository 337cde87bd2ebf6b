"""What every pycni command group shares: a CNI failure is one line on stderr, exit status 1."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any, TypeVar

import click

from ..backends import BACKEND_NAMES
from ..cache import DEFAULT_CACHE_DIR
from ..errors import CNIError
from ..runtime import DEFAULT_PLUGIN_PATH

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "CNIFailure",
    "ExtraMissing",
    "Group",
    "backend_option",
    "cache_dir_option",
    "state_dir_option",
    "plugin_path_option",
]


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


#: The plugin path of the verbs that also use distribution-packaged plugins (Debian: /usr/lib/cni).
WITH_PACKAGED_PLUGINS = ":".join((*DEFAULT_PLUGIN_PATH, "/usr/lib/cni"))


def plugin_path_option(default: str = "", name: str = "--plugin-path") -> Callable[[F], F]:
    return click.option(
        name,
        "plugin_path",
        envvar="CNI_PATH",
        default=default,
        show_default=bool(default),
        help="Plugin dirs for exec'd plugins, ':'-separated [$CNI_PATH].",
    )

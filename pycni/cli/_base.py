"""What every pycni command group shares: a CNI failure is one line on stderr, exit status 1."""

from __future__ import annotations

from typing import IO, Any

import click

from ..errors import CNIError

__all__ = ["CNIFailure", "Group"]


class CNIFailure(click.ClickException):
    """A :class:`~pycni.errors.CNIError` as the CLI reports it: ``pycni: error (code N): msg``."""

    exit_code = 1

    def __init__(self, error: CNIError) -> None:
        self.error = error
        super().__init__(" ".join(str(error).split()))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"pycni: error (code {self.error.code}): {self.message}", err=True, file=file)


class Group(click.Group):
    """A group whose commands' CNI errors become :class:`CNIFailure` (nested groups included)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CNIError as e:
            raise CNIFailure(e) from None

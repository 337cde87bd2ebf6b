"""``pycni fuzz``: a CNI plugin executable against the CNI contract (see :mod:`pycni.testing.fuzz`).

hypothesis and pyroute2 are imported only when the command runs, so ``pycni --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from ._base import ExtraMissing

__all__ = ["fuzz"]

_COMMANDS = ("ADD", "CHECK", "DEL")


def _commands(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(v.strip().upper() for v in value.split(",") if v.strip()))
    unknown = [n for n in names if n not in _COMMANDS]
    if unknown or not names:
        raise click.BadParameter(f"{', '.join(unknown) or 'nothing'}: choose from {','.join(_COMMANDS)}")
    return names


@click.command()
@click.argument("plugin", type=click.Path(exists=True, dir_okay=False))
@click.option("--type", "plugin_type", metavar="T", help="Plugin type the configs are made for [the file's name].")
@click.option("--commands", default="ADD,CHECK,DEL", show_default=True, callback=_commands, help="Commands to call.")
@click.option("--examples", default=100, show_default=True, type=click.IntRange(1), help="Examples to try.")
@click.option("--seed", type=int, help="Seed for a reproducible run [random].")
@click.option("--timeout", default=10.0, show_default=True, type=click.FloatRange(0.1), help="Seconds per call.")
@click.option(
    "--report",
    "report_path",
    metavar="FILE",
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the report (JSON) to FILE.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout (instead of text).")
def fuzz(
    plugin: str,
    plugin_type: str | None,
    commands: tuple[str, ...],
    examples: int,
    seed: int | None,
    timeout: float,
    report_path: str | None,
    as_json: bool,
) -> None:
    """Fuzz the CNI plugin executable PLUGIN against the CNI contract.

    Every example runs in a fresh throwaway host network namespace (the plugin is exec'd there)
    with a container namespace, a temp data dir and subnets from 198.18.0.0/15; nothing touches
    the machine's own namespace. Configs are valid for the type or mutated, with prevResults of
    every version, CNI_ARGS and capability args. A violation is shrunk and printed as a
    reproducer (stdin, env, command line). Exit status 1 iff a contract violation was found.
    Needs root and hypothesis (pip install 'pycni[fuzz]').
    """
    try:
        from ..testing import fuzz as engine
    except ImportError as e:
        ExtraMissing.check("fuzz", ("hypothesis",), e)
        raise
    if os.geteuid() != 0:
        raise click.UsageError("pycni fuzz needs root: it creates network namespaces (and touches nothing else)")
    plugin = os.path.abspath(plugin)
    if not os.access(plugin, os.X_OK):
        raise click.BadParameter(f"{plugin} is not executable", param_hint="PLUGIN")
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "big")
    options = engine.Options(
        plugin=plugin,
        plugin_type=plugin_type or os.path.basename(plugin),
        commands=commands,
        examples=examples,
        seed=seed,
        timeout=timeout,
        versions=engine.probe_versions(plugin, timeout),
    )
    with _stopped_cleanly_by(signal.SIGTERM, signal.SIGHUP), _progress(examples) as progress:
        report = engine.fuzz(options, progress)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
    else:
        for violation in report.violations:
            click.echo(violation.reproducer() + "\n")
        click.echo(report.summary())
    if report_path:
        with open(report_path, "w") as f:
            json.dump(report.to_json(), f, indent=1)
            f.write("\n")
    sys.exit(1 if report.violations else 0)


@contextlib.contextmanager
def _stopped_cleanly_by(*signals: signal.Signals) -> Iterator[None]:
    """Each of ``signals`` (a CI timeout's SIGTERM, a closed terminal's SIGHUP) unwinds the run
    as Ctrl-C does, so every namespace, temp dir and plugin process it made is removed; then the
    process dies of that signal, as its sender expects. Further signals are ignored meanwhile."""
    caught: list[int] = []

    def stop(signum: int, frame: object) -> None:
        for s in signals:
            signal.signal(s, signal.SIG_IGN)
        caught.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in signals}
    try:
        yield
    except KeyboardInterrupt:
        if not caught:
            raise
        click.echo(f"pycni fuzz: stopped by {signal.Signals(caught[0]).name}; cleaned up", err=True)
        signal.signal(caught[0], signal.SIG_DFL)
        os.kill(os.getpid(), caught[0])
        raise  # not reached: the signal's default action ends the process
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[Any, bool], None] | None]:
    """click's progress bar on stderr, on a terminal only: examples run, and the shrinking runs
    once a violation is found."""
    if not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=total, label="examples", file=sys.stderr, show_pos=True) as bar:

        def update(report: Any, shrinking: bool) -> None:
            if shrinking:
                bar.label = f"examples ({report.after_first_violation} shrinking runs)"
            bar.update(min(report.examples, total) - bar.pos)

        yield update

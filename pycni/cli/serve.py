"""``pycni serve``: the daemon behind the installed shims (imported only by this verb)."""

from __future__ import annotations

import click

from ..sdk import logs

__all__ = ["serve"]


@click.command()
@click.option(
    "--socket",
    "socket_path",
    envvar="PYCNI_SOCKET",
    default=None,
    help="Unix socket to serve on [$PYCNI_SOCKET; default /run/pycni/pycni.sock]; a socket "
    "passed by systemd (LISTEN_FDS) wins.",
)
@click.option("--check", is_flag=True, help="Only tell whether a daemon answers on the socket (exit 0 if so).")
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Requests run at once (one waiting for a lock does not count).",
)
@click.option(
    "--queue",
    type=click.IntRange(0, 4096),
    default=64,
    show_default=True,
    help="Connections that may wait for a worker (beyond it, or --wait, the shim runs the plugin itself).",
)
@click.option(
    "--wait",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="Seconds a request waits for a worker before its shim runs the plugin itself "
    "(CNI error 11, try again later, under PYCNI_DAEMON=required).",
)
@click.option(
    "--deadline",
    type=click.FloatRange(0, min_open=True),
    default=120.0,
    show_default=True,
    help="Seconds after which a request still waiting for a lock gives up (as it does at once "
    "when its caller goes away).",
)
@click.option(
    "--drain",
    type=click.FloatRange(0),
    default=30.0,
    show_default=True,
    help="Seconds running requests get to finish on SIGTERM.",
)
@click.option(
    "--heal/--no-heal",
    default=True,
    show_default=True,
    help="Watch each host namespace served for a firewall reload that removes pycni's nftables state, and put it back.",
)
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    default="text",
    show_default=True,
    help="Log lines as text (no timestamps on systemd's journal, which adds them) or as JSON "
    "objects (time, level, logger, message, and the attachment's network, container, ifname).",
)
@click.pass_obj
def serve(
    log_level: int | None,
    socket_path: str | None,
    check: bool,
    workers: int,
    queue: int,
    wait: float,
    deadline: float,
    drain: float,
    heal: bool,
    log_format: str,
) -> None:
    """Run the built-in plugins for the shims `pycni plugins install` writes (foreground, logs to
    stderr, one line per request; the global --log-level debug adds every kernel change). Tells
    systemd when it listens ($NOTIFY_SOCKET). SIGTERM stops accepting, lets running requests
    finish and removes the socket."""
    from pycni_plugins.serve import socket_path as resolve

    path = resolve(socket_path)
    if check:
        from pycni_plugins.serve.sockets import check as do_check

        ok, line = do_check(path)
        click.echo(line, err=not ok)
        raise SystemExit(0 if ok else 1)
    from pycni_plugins.serve.daemon import Limits, run

    limits = Limits(workers=workers, queue=queue, wait=wait, deadline=deadline, drain=drain)
    run(path, limits, heal=heal, level=log_level, fmt=log_format)

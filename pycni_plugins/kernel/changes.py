"""Every kernel change, logged at debug by the few doors it goes through: a netlink request that
changes something (:func:`.links.call` and :mod:`.batch`: links, addresses, routes, rules, qdiscs and filters,
conntrack entries; :mod:`.tc`'s own tbf request), an nftables transaction
(:mod:`.nft.transport`'s contexts), a sysctl write (:mod:`.sysctl`), an iptables-restore batch
(:mod:`.iptables`), a firewalld zone source (:mod:`.firewalld`). Each line names the network
namespace it happened in (its inode, as ``ls -l /proc/<pid>/ns/net`` shows it); the attachment
it was made for is on the record (:mod:`pycni.sdk.logs`). The doors test :data:`log`'s level
before calling in here, so a disabled log costs one cached comparison per request.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from pycni import netns
from pycni._json import dumps_compact_ascii

__all__ = ["log", "netlink", "netlink_batched", "nft_transaction", "tbf", "sysctl", "iptables", "firewalld"]

log = logging.getLogger("pycni_plugins.kernel")

#: Netlink verbs (and request methods) that read: not changes.
_READS = ("get", "dump", "show", "<lambda>")
#: nft commands that read.
_NFT_READS = ("list", "get", "metainfo")


def _netns() -> str:
    try:
        return str(netns.own_identity()[1])
    except OSError:
        return "?"


def _value(value: Any) -> str:
    return value if isinstance(value, str) and value and " " not in value else repr(value)


def _unwrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    # pyroute2's sync IPRoute hands out partials of its runner around the async API's method.
    while isinstance(method, functools.partial):
        method = method.args[0] if method.args and callable(method.args[0]) else method.func
    return method


def netlink(method: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], error: int = 0) -> None:
    """A pyroute2 request ``method(*args, **kwargs)`` that ended with ``error`` (an errno, 0: none)."""
    method = _unwrapped(method)
    verb = args[0] if args and isinstance(args[0], str) else getattr(method, "__name__", "?")
    if verb.startswith(_READS):
        return
    what = getattr(method, "__name__", "?")
    rest = args[1:] if args and args[0] == verb else args
    owner = type(getattr(method, "__self__", None)).__name__
    words = [f"{owner}.{what}" if what == verb else f"{what} {verb}"]
    words += [_value(a) for a in rest]
    words += [f"{k}={_value(v)}" for k, v in kwargs.items()]
    outcome = f" failed: {os.strerror(error)}" if error else ""
    log.debug("netlink %s [netns %s]%s", " ".join(words), _netns(), outcome)


def netlink_batched(verb: str, words: list[str], error: int = 0) -> None:
    """A change request sent in a :mod:`.batch`, as ``key=value`` words."""
    outcome = f" failed: {os.strerror(error)}" if error else ""
    log.debug("netlink %s %s [netns %s]%s", verb, " ".join(words), _netns(), outcome)


def nft_transaction(commands: str, rc: int, err: str = "") -> None:
    """One libnftables call, its commands as text or JSON text (``json_cmd`` sends them
    through ``cmd``); logged only if it would change something."""
    if commands.lstrip().startswith("{"):
        items: list[Mapping[str, Any]] = json.loads(commands).get("nftables", [])
        changes = [dumps_compact_ascii(c) for c in items if not set(c) <= set(_NFT_READS)]
    else:
        lines = (line.strip() for line in commands.splitlines())
        changes = [line for line in lines if line and not line.startswith(_NFT_READS)]
    if not changes:
        return
    error = (err or "").strip()
    outcome = f" failed: {error.splitlines()[0] if error else rc}" if rc else ""
    log.debug("nft transaction [netns %s]%s: %s", _netns(), outcome, "; ".join(changes))


def tbf(index: int, rate: int, limit: int, buffer: int) -> None:
    """A root tbf qdisc, which :mod:`.tc` sends on a netlink socket of its own."""
    log.debug(
        "netlink tc add tbf index=%d handle=1: rate=%d limit=%d buffer=%d [netns %s]",
        index,
        rate,
        limit,
        buffer,
        _netns(),
    )


def sysctl(name: str, value: str | int) -> None:
    log.debug("sysctl %s=%s [netns %s]", name, value, _netns())


def iptables(tool: str, lines: list[str] | tuple[str, ...]) -> None:
    """One ``<tool>-restore --noflush`` batch of the filter table (the compatibility step)."""
    log.debug("%s [netns %s]: %s", tool, _netns(), "; ".join(lines))


def firewalld(method: str, zone: str, source: str) -> None:
    """A firewalld zone source added or removed over D-Bus (firewalld's own namespace)."""
    log.debug("firewalld %s zone=%s source=%s", method, zone, source)

"""The compatibility step's records, and a heal from them alone.

The firewall plugin's ADD records where its iptables rules went (``<state>/iptables/<attachment
key>``: the attachment, the comment of its rules, the places, its addresses, the admin rules of
its bridge and the cookie of the host namespace), written before the rules; DEL removes the rules
and then the record, both under the state dir's iptables lock (:func:`~.locked`). So the record
alone says what should be there, with no plugin config: :func:`restore` puts back, in the calling
thread's namespace, the chain, the jump and every recorded rule that is missing, where the
recorded table is still iptables' own (a table that went away is not made again) — what ``pycni
serve`` runs after ``iptables -F``, a Docker restart or an ``nft flush ruleset`` (and ``pycni gc
--reconcile``, for the valid attachments of one network).

iptables-nft's tables tell a watcher of nftables notifications when they change; legacy
iptables' do not, so :func:`fingerprint` is what a poller compares: the ``filter`` table's hook
offsets, entry count and size (``IPT_SO_GET_INFO``, one ``getsockopt``, no exec), which any
removal of pycni's rules changes.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from collections.abc import Iterable
from typing import Any

from ..state import Records
from . import CHAIN, Place, admin_tokens, apply, attachment_rules, comment_of, loaded, locked, look
from .rules import sig_of_tokens

__all__ = ["SUB", "records", "record", "places_of", "rules_of", "recorded_places", "restore", "fingerprint", "here"]

SUB = "iptables"


def records(state_dir: str) -> Records:
    return Records(SUB, state_dir)


def record(
    attachment: tuple[str, str, str],
    comment: str,
    places: Iterable[Place],
    addresses: Iterable[str],
    admin: Iterable[tuple[str, str, str]],
    netns: int | None,
) -> dict[str, Any]:
    """An attachment's record: ``attachment`` as (network, container id, ifname), its rules'
    ``comment``, the ``places`` they go, its ``addresses`` (``ip/prefix``), the ``admin`` rules
    of its bridge as (interface, subnet, admin chain) and the cookie of the host namespace
    (``None``: the kernel has none; such a record is restored in any namespace)."""
    network, container_id, ifname = attachment
    out: dict[str, Any] = {
        "network": network,
        "container_id": container_id,
        "ifname": ifname,
        "comment": comment,
        "places": [p.to_json() for p in sorted(places)],
        "addresses": list(addresses),
        "admin": [list(a) for a in admin],
    }
    if netns is not None:
        out["netns"] = netns
    return out


def places_of(rec: Any) -> list[Place]:
    found = [Place.from_json(p) for p in (rec.get("places") or ())] if isinstance(rec, dict) else []
    return [p for p in found if p is not None]


def rules_of(rec: dict[str, Any], place: Place) -> list[tuple[str, ...]]:
    """The rules ``rec`` puts in ``place``: its bridge's admin rules, then two per address."""
    nets = [ipaddress.ip_interface(a) for a in rec.get("addresses", ())]
    out = [
        admin_tokens(str(iface), ipaddress.ip_network(net), str(chain))
        for iface, net, chain in rec.get("admin", ())
        if ipaddress.ip_network(net).version == place.version
    ]
    hosts = [ipaddress.ip_network(f"{n.ip}/{n.max_prefixlen}") for n in nets if n.version == place.version]
    return out + attachment_rules(hosts, str(rec.get("comment", "")))


def here() -> int | None:
    """The cookie of the calling thread's namespace (``None``: the kernel has none)."""
    from ..nft.transport import memo

    return memo().cookie


def _mine(rec: Any, here: int | None) -> bool:
    return isinstance(rec, dict) and (here is None or rec.get("netns", here) == here)


def recorded_places(state_dir: str, here: int | None = None) -> set[Place]:
    """The places the records under ``state_dir`` of the namespace ``here`` (a cookie; ``None``:
    any) put rules in."""
    store = records(state_dir)
    return {p for name in store.names() if _mine(rec := store.load(name), here) for p in places_of(rec)}


def restore(state_dir: str, flavours: Iterable[str] = ("nft", "legacy")) -> list[str]:
    """Heal the calling thread's namespace: for every record under ``state_dir`` of this
    namespace, put back what is missing of pycni's chain, its jump and the recorded rules, in
    each recorded place of ``flavours`` whose ``filter`` table is still iptables' own (one read
    and at most one ``-restore`` batch per place), under the state dir's iptables lock, so an
    attachment whose DEL has run is never restored. Returns what was put back (nothing when
    nothing recorded is missing)."""
    store = records(state_dir)
    if not store.names():
        return []
    cookie = here()
    wanted = set(flavours)
    out: list[str] = []
    with locked(state_dir):
        by_place: dict[Place, list[tuple[str, ...]]] = {}
        who: dict[str, str] = {}
        for name in store.names():
            rec = store.load(name)
            if not isinstance(rec, dict) or not _mine(rec, cookie):
                continue
            who[str(rec.get("comment", ""))] = f"{rec.get('container_id')}/{rec.get('ifname')}"
            for place in places_of(rec):
                if place.flavour in wanted:
                    by_place.setdefault(place, []).extend(rules_of(rec, place))
        for place, rules in sorted(by_place.items()):
            if not loaded(place):
                continue
            table = look(place)
            if not table.iptables:
                continue  # gone (a flushed ruleset): nothing drops there, nothing is made again
            tool = place.tool()
            gone = [] if CHAIN in table.chains else [f"restored {tool} chain {CHAIN}"]
            gone += [] if table.jumped else [f"restored {tool} jump FORWARD -> {CHAIN}"]
            out += gone + [f"restored {tool} rule {_describe(r, who)}" for r in apply(place, rules, table)]
    return out


def _describe(rule: tuple[str, ...], who: dict[str, str]) -> str:
    field, net, ct, oif = sig_of_tokens(rule)
    comment = comment_of(rule)
    if oif:
        return f"accept to {net} on {oif} ({comment})"
    what = f"accept of replies to {net}" if ct else f"accept from {net}"
    return f"{what} of {who.get(comment, comment)}"


_GETINFO = struct.Struct("32sI5I5III")  # struct ipt_getinfo / ip6t_getinfo
_SO_GET_INFO = 64  # IPT_SO_GET_INFO, IP6T_SO_GET_INFO
_libc: Any = None


def fingerprint(place: Place) -> tuple[int, ...] | None:
    """Legacy iptables' ``filter`` table of ``place`` in the calling thread's namespace, as its
    hooks' offsets, entry count and size (``None``: not loaded, or not readable). Equal
    fingerprints mean nothing was added or removed (a rule replaced by one of the same size
    aside). Never loads the table: only read where :func:`~.loaded` says it is."""
    global _libc
    if place.flavour != "legacy" or not loaded(place):
        return None
    family, level = (
        (socket.AF_INET, socket.IPPROTO_IP) if place.version == 4 else (socket.AF_INET6, socket.IPPROTO_IPV6)
    )
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    try:
        with socket.socket(family, socket.SOCK_RAW, socket.IPPROTO_RAW) as sock:
            buf = ctypes.create_string_buffer(_GETINFO.pack(b"filter", 0, *(0,) * 10, 0, 0), _GETINFO.size)
            size = ctypes.c_uint(_GETINFO.size)
            if _libc.getsockopt(sock.fileno(), level, _SO_GET_INFO, buf, ctypes.byref(size)) != 0:
                return None
    except OSError:
        return None
    return tuple(_GETINFO.unpack(buf.raw)[1:])

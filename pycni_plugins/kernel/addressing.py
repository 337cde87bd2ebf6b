"""A link's addresses, in the calling thread's network namespace (through :func:`.links.call`,
with an ``ipr`` of a :func:`.links.iproute` block opened in the same thread): listed, added
(IPv4's broadcast as ``ip addr`` sets it), deleted, and IPv6's duplicate address detection
waited out."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import time
from collections.abc import Iterable
from typing import Any

from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

from . import batch
from .errors import LinkError
from .links import IPRoute, call

__all__ = ["IPInterface", "addresses", "of_link", "add_address", "del_address", "wait_dad"]

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface

# linux/if_addr.h
IFA_F_NODAD, IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x02, 0x08, 0x40
_IFA_ADDRESS, _IFA_LOCAL = (
    next(n for n, (name, *_) in enumerate(ifaddrmsg.nla_map) if name == a) for a in ("IFA_ADDRESS", "IFA_LOCAL")
)
_IFADDRMSG = struct.Struct("=BBBBI")  # struct ifaddrmsg: family, prefixlen, flags, scope, index


def addresses(ipr: IPRoute, index: int, family: int | None = None) -> list[tuple[IPInterface, int]]:
    """``(address/prefix, IFA flags)`` of a link; ``family`` limits it to AF_INET or AF_INET6."""
    spec: dict[str, Any] = {"index": index}
    if family:
        spec["family"] = family
    return _listed(call(ipr.addr, "dump", **spec))


def _listed(msgs: Iterable[Any]) -> list[tuple[IPInterface, int]]:
    out = []
    for msg in msgs:
        ip = msg.get("local") or msg.get("address")
        if ip is not None:
            out.append((ipaddress.ip_interface(f"{ip}/{msg['prefixlen']}"), msg.get("flags", 0)))
    return out


def of_link(msgs: Iterable[bytes], index: int) -> list[IPInterface]:
    """The addresses of link ``index`` among the messages of an address dump (:mod:`.batch`'s,
    as bytes): read from the bytes, what :func:`addresses` reads of pyroute2's decoding (IFA_LOCAL,
    else IFA_ADDRESS, with the prefix length), without decoding the other attributes (~50 µs a
    message)."""
    out: list[IPInterface] = []
    for data in msgs:
        _, prefixlen, _, _, link = _IFADDRMSG.unpack_from(data, batch.HEADER_SIZE)
        if link != index:
            continue
        found = batch.attributes(data, batch.HEADER_SIZE + _IFADDRMSG.size, (_IFA_LOCAL, _IFA_ADDRESS))
        ip = found.get(_IFA_LOCAL)
        if ip is None:
            ip = found.get(_IFA_ADDRESS)
        if ip is not None:
            out.append(ipaddress.ip_interface((ipaddress.ip_address(bytes(ip)), prefixlen)))
    return out


def add_address(ipr: IPRoute, index: int, addr: IPInterface, *, nodad: bool = False, exist_ok: bool = False) -> bool:
    """Add ``addr``; IPv4 prefixes shorter than /31 get their broadcast address as ``ip addr`` does.

    Returns False when ``exist_ok`` and the address was already there.
    """
    spec: dict[str, Any] = {"index": index, "address": str(addr.ip), "prefixlen": addr.network.prefixlen}
    if addr.version == 4 and addr.network.prefixlen < 31:
        spec["broadcast"] = str(addr.network.broadcast_address)
    if nodad:
        spec["flags"] = IFA_F_NODAD
    try:
        call(ipr.addr, "add", **spec)
    except LinkError as e:
        if exist_ok and e.errno == errno.EEXIST:
            return False
        raise
    return True


def del_address(ipr: IPRoute, index: int, addr: IPInterface) -> None:
    try:
        call(ipr.addr, "del", index=index, address=str(addr.ip), prefixlen=addr.network.prefixlen)
    except LinkError as e:
        if e.errno != errno.EADDRNOTAVAIL:
            raise


def wait_dad(ipr: IPRoute, index: int, timeout: float = 5.0) -> None:
    """Wait until no IPv6 address of the link is tentative; DAD failure is an error."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        tentative = False
        for addr, flags in addresses(ipr, index, socket.AF_INET6):
            if flags & IFA_F_DADFAILED:
                raise LinkError(errno.EADDRINUSE, f"DAD failed for {addr}")
            if flags & IFA_F_TENTATIVE:
                tentative = True
        if not tentative:
            return
        if time.monotonic() >= deadline:
            raise LinkError(errno.ETIMEDOUT, "timed out waiting for IPv6 addresses to leave the tentative state")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)

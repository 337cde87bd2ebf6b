"""Links, addresses and routes over rtnetlink, in the calling thread's network namespace.

This speaks raw netlink (``socket.AF_NETLINK``) for the few requests the plugins make, instead of
pyroute2: importing pyroute2 costs ~130 ms, more than a whole exec'd Go plugin, and its
synchronous API runs an asyncio loop and decodes every attribute of every reply (~1 ms a
request here, against ~0.05 ms for a raw request). The socket of :func:`iproute` belongs to the
namespace of the thread that opens it; nothing here keeps one across calls.

:func:`delete_link` returns once the kernel has *unlisted* the device (its RTM_DELLINK
notification): the request's own acknowledgement only comes after the kernel's RCU barrier and
refcount wait (~15 ms here), which a helper thread collects.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

__all__ = [
    "IPInterface",
    "Link",
    "LinkError",
    "Netlink",
    "iproute",
    "get_link",
    "dump_links",
    "random_mac",
    "random_veth_name",
    "ensure_bridge",
    "add_veth",
    "set_up",
    "set_down",
    "set_mac",
    "set_brport",
    "set_port_vlans",
    "delete_link",
    "addresses",
    "add_address",
    "del_address",
    "add_route",
    "route_oif",
    "has_route",
    "wait_oper_up",
    "wait_dad",
]

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# linux/netlink.h, linux/rtnetlink.h, linux/if_link.h, linux/if_addr.h, linux/if_bridge.h
_NLMSG = struct.Struct("=IHHII")
_IFINFO = struct.Struct("=BxHiII")
_IFADDR = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTATTR = struct.Struct("=HH")
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x2, 0x4, 0x300
NLM_F_EXCL, NLM_F_CREATE, NLM_F_APPEND = 0x200, 0x400, 0x800
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK = 16, 17, 18, 19
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_MASTER = 1, 3, 4, 5, 10
IFLA_PROTINFO, IFLA_OPERSTATE, IFLA_LINKINFO, IFLA_AF_SPEC, IFLA_NET_NS_FD, IFLA_EXT_MASK = 12, 16, 18, 26, 28, 29
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER, IFLA_BR_VLAN_FILTERING = 1, 2, 1, 7
IFLA_BRPORT_MODE, IFLA_BRPORT_ISOLATED = 4, 33
IFLA_BRIDGE_VLAN_INFO = 2
BRIDGE_VLAN_INFO_PVID, BRIDGE_VLAN_INFO_UNTAGGED = 0x2, 0x4
RTEXT_FILTER_SKIP_STATS = 0x8
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST, IFA_FLAGS = 1, 2, 4, 8
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_MULTIPATH, RTA_TABLE = 1, 4, 5, 6, 9, 15
NLA_F_NESTED = 0x8000
IFF_UP, IFF_PROMISC = 0x1, 0x100
IFA_F_NODAD, IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x02, 0x08, 0x40
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253
_SOL_NETLINK, _NETLINK_GET_STRICT_CHK = 270, 12
_OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")


class LinkError(OSError):
    """A netlink request failed; ``errno`` is the kernel's."""


def _error(code: int, what: str = "") -> LinkError:
    text = os.strerror(code)
    return LinkError(code, f"{what}: {text}" if what else text)


# --- encoding / decoding ------------------------------------------------------------------------


def _attr(kind: int, payload: bytes) -> bytes:
    size = _RTATTR.size + len(payload)
    return _RTATTR.pack(size, kind) + payload + b"\0" * (-size % 4)


def _nested(kind: int, *attrs_: bytes) -> bytes:
    return _attr(kind | NLA_F_NESTED, b"".join(attrs_))


def _u8(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack("=B", value))


def _u32(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack("=I", value))


def _str(kind: int, value: str) -> bytes:
    return _attr(kind, value.encode() + b"\0")


def _mac(text: str) -> bytes:
    return bytes(int(x, 16) for x in text.split(":"))


def _attrs(data: bytes, pos: int, end: int | None = None) -> dict[int, bytes]:
    """Attributes from ``pos`` (the first one wins; nested flags stripped from the type)."""
    out: dict[int, bytes] = {}
    end = len(data) if end is None else end
    while pos + _RTATTR.size <= end:
        size, kind = _RTATTR.unpack_from(data, pos)
        if size < _RTATTR.size:
            break
        out.setdefault(kind & ~NLA_F_NESTED & 0x7FFF, data[pos + _RTATTR.size : pos + size])
        pos += (size + 3) & ~3
    return out


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


class Netlink:
    """One NETLINK_ROUTE socket, bound to the namespace of the thread that creates it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.sock.setsockopt(_SOL_NETLINK, _NETLINK_GET_STRICT_CHK, 1)
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def request(self, kind: int, flags: int, body: bytes) -> list[bytes]:
        """Send one request; the reply messages (a dump's entries; ``[]`` for an ACK)."""
        self.seq += 1
        seq = self.seq
        self.sock.send(_NLMSG.pack(_NLMSG.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0) + body)
        out: list[bytes] = []
        while True:
            data = self.sock.recv(1 << 16)
            pos = 0
            while pos + _NLMSG.size <= len(data):
                length, mtype, mflags, mseq, _ = _NLMSG.unpack_from(data, pos)
                if length < _NLMSG.size:
                    raise _error(errno.EBADMSG)
                msg = data[pos : pos + length]
                pos += (length + 3) & ~3
                if mseq != seq:
                    continue
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", msg, _NLMSG.size)[0]
                    if code:
                        raise _error(code)
                    return out
                if mtype == NLMSG_DONE:
                    return out
                out.append(msg)
                if not mflags & NLM_F_MULTI and not flags & NLM_F_ACK:
                    return out


@contextmanager
def iproute() -> Iterator[Netlink]:
    """A netlink socket in the calling thread's current namespace, closed afterwards."""
    nl = Netlink()
    try:
        yield nl
    finally:
        nl.close()


# --- links --------------------------------------------------------------------------------------


@attrs.frozen
class Link:
    index: int
    name: str
    mac: str
    kind: str
    flags: int
    mtu: int
    master: int
    peer_index: int
    operstate: str

    @property
    def up(self) -> bool:
        return bool(self.flags & IFF_UP)

    @property
    def promisc(self) -> bool:
        return bool(self.flags & IFF_PROMISC)


def _u32_of(raw: bytes | None) -> int:
    return struct.unpack_from("=I", raw)[0] if raw and len(raw) >= 4 else 0


def _parse_link(msg: bytes) -> Link:
    _, _, index, flags, _ = _IFINFO.unpack_from(msg, _NLMSG.size)
    a = _attrs(msg, _NLMSG.size + _IFINFO.size)
    kind = ""
    if IFLA_LINKINFO in a:
        info = _attrs(a[IFLA_LINKINFO], 0)
        kind = _cstr(info.get(IFLA_INFO_KIND, b""))
    oper = a.get(IFLA_OPERSTATE, b"\0")[0]
    return Link(
        index=index,
        name=_cstr(a.get(IFLA_IFNAME, b"")),
        mac=":".join(f"{b:02x}" for b in a.get(IFLA_ADDRESS, b"")),
        kind=kind,
        flags=flags,
        mtu=_u32_of(a.get(IFLA_MTU)),
        master=_u32_of(a.get(IFLA_MASTER)),
        peer_index=_u32_of(a.get(IFLA_LINK)),
        operstate=_OPERSTATES[oper] if oper < len(_OPERSTATES) else "UNKNOWN",
    )


def _ifinfo(index: int = 0, family: int = socket.AF_UNSPEC, flags: int = 0, change: int = 0) -> bytes:
    return _IFINFO.pack(family, 0, index, flags, change)


def get_link(nl: Netlink, name: str | None = None, *, index: int | None = None) -> Link | None:
    """The link by name or index, ``None`` if there is none."""
    body = _ifinfo(index or 0) + _u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)
    if index is None:
        body += _str(IFLA_IFNAME, name or "")
    try:
        msgs = nl.request(RTM_GETLINK, 0, body)
    except LinkError as e:
        if e.errno == errno.ENODEV:
            return None
        raise
    return _parse_link(msgs[0]) if msgs else None


def dump_links(nl: Netlink) -> list[Link]:
    body = _ifinfo() + _u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)
    return [_parse_link(m) for m in nl.request(RTM_GETLINK, NLM_F_DUMP, body)]


def random_mac() -> str:
    """A random locally administered unicast MAC, like the kernel's ``eth_random_addr``."""
    b = bytearray(secrets.token_bytes(6))
    b[0] = (b[0] & 0xFE) | 0x02
    return ":".join(f"{x:02x}" for x in b)


def random_veth_name() -> str:
    return "veth" + secrets.token_hex(4)


def ensure_bridge(nl: Netlink, name: str, *, mtu: int = 0, vlan_filtering: bool = False) -> tuple[Link, bool]:
    """The bridge ``name``, created if missing (a concurrent creator's EEXIST is fine).

    Returns the link and whether this call created it. An existing bridge's MTU and VLAN
    filtering are left as they are, as the reference plugin does.
    """
    link = get_link(nl, name)
    created = False
    if link is None:
        data = _nested(IFLA_INFO_DATA, _u8(IFLA_BR_VLAN_FILTERING, 1)) if vlan_filtering else b""
        body = _ifinfo() + _str(IFLA_IFNAME, name) + _nested(IFLA_LINKINFO, _str(IFLA_INFO_KIND, "bridge"), data)
        if mtu > 0:
            body += _u32(IFLA_MTU, mtu)
        try:
            nl.request(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)
            created = True
        except LinkError as e:
            if e.errno != errno.EEXIST:
                raise
        link = get_link(nl, name)
        if link is None:
            raise _error(errno.ENODEV, f"bridge {name!r} vanished right after creation")
    if link.kind != "bridge":
        raise LinkError(errno.EEXIST, f'"{name}" already exists but is not a bridge')
    return link, created


def add_veth(
    nl: Netlink,
    host_name: str,
    host_mac: str,
    *,
    peer_name: str,
    peer_netns_fd: int,
    peer_mac: str | None,
    mtu: int,
    master: int | None,
) -> None:
    """One RTM_NEWLINK: a veth whose host end is UP (and enslaved to ``master``) here and whose
    peer is created directly in the namespace ``peer_netns_fd`` (never moved: a move costs an
    extra round of namespace work and notifications)."""
    peer = _ifinfo() + _str(IFLA_IFNAME, peer_name) + _u32(IFLA_NET_NS_FD, peer_netns_fd)
    if peer_mac:
        peer += _attr(IFLA_ADDRESS, _mac(peer_mac))
    body = _ifinfo(flags=IFF_UP, change=IFF_UP) + _str(IFLA_IFNAME, host_name) + _attr(IFLA_ADDRESS, _mac(host_mac))
    if mtu > 0:
        peer += _u32(IFLA_MTU, mtu)
        body += _u32(IFLA_MTU, mtu)
    if master:
        body += _u32(IFLA_MASTER, master)
    body += _nested(IFLA_LINKINFO, _str(IFLA_INFO_KIND, "veth"), _nested(IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer)))
    nl.request(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)


def set_up(nl: Netlink, index: int, *, promisc: bool = False) -> None:
    flags = IFF_UP | (IFF_PROMISC if promisc else 0)
    nl.request(RTM_NEWLINK, NLM_F_ACK, _ifinfo(index, flags=flags, change=flags))


def set_down(nl: Netlink, index: int) -> None:
    nl.request(RTM_NEWLINK, NLM_F_ACK, _ifinfo(index, flags=0, change=IFF_UP))


def set_mac(nl: Netlink, index: int, mac: str) -> None:
    nl.request(RTM_NEWLINK, NLM_F_ACK, _ifinfo(index) + _attr(IFLA_ADDRESS, _mac(mac)))


def set_brport(nl: Netlink, index: int, *, hairpin: bool = False, isolated: bool = False) -> None:
    """Bridge port flags (IFLA_PROTINFO on an AF_BRIDGE RTM_SETLINK): only those set to True."""
    flags = (_u8(IFLA_BRPORT_MODE, 1) if hairpin else b"") + (_u8(IFLA_BRPORT_ISOLATED, 1) if isolated else b"")
    if flags:
        nl.request(RTM_SETLINK, NLM_F_ACK, _ifinfo(index, family=socket.AF_BRIDGE) + _nested(IFLA_PROTINFO, flags))


def _vlan(nl: Netlink, kind: int, index: int, vid: int, flags: int) -> None:
    info = _attr(IFLA_BRIDGE_VLAN_INFO, struct.pack("=HH", flags, vid))
    nl.request(kind, NLM_F_ACK, _ifinfo(index, family=socket.AF_BRIDGE) + _nested(IFLA_AF_SPEC, info))


def set_port_vlans(nl: Netlink, index: int, *, pvid: int, tagged: tuple[int, ...], keep_default: bool) -> None:
    """Port VLAN membership: ``pvid`` (PVID, untagged; 0 = none) and ``tagged`` vids.

    Unless ``keep_default``, the default VLAN 1 a new port starts with is removed first.
    """
    if not keep_default:
        try:
            _vlan(nl, RTM_DELLINK, index, 1, 0)
        except LinkError as e:
            if e.errno not in (errno.ENOENT, errno.EINVAL):
                raise
    if pvid:
        _vlan(nl, RTM_SETLINK, index, pvid, BRIDGE_VLAN_INFO_PVID | BRIDGE_VLAN_INFO_UNTAGGED)
    for vid in tagged:
        if vid != pvid:
            _vlan(nl, RTM_SETLINK, index, vid, 0)


# --- addresses ----------------------------------------------------------------------------------


def _family(version: int) -> int:
    return socket.AF_INET if version == 4 else socket.AF_INET6


def addresses(nl: Netlink, index: int, family: int | None = None) -> list[tuple[IPInterface, int]]:
    """``(address/prefix, IFA flags)`` of a link; ``family`` limits it to AF_INET or AF_INET6."""
    body = _IFADDR.pack(family or socket.AF_UNSPEC, 0, 0, 0, index)
    out = []
    for msg in nl.request(RTM_GETADDR, NLM_F_DUMP, body):
        fam, plen, flags, _, idx = _IFADDR.unpack_from(msg, _NLMSG.size)
        if idx != index:
            continue
        a = _attrs(msg, _NLMSG.size + _IFADDR.size)
        raw = a.get(IFA_LOCAL) or a.get(IFA_ADDRESS)
        if raw is None:
            continue
        ip = ipaddress.ip_address(raw)
        out.append((ipaddress.ip_interface(f"{ip}/{plen}"), _u32_of(a.get(IFA_FLAGS)) or flags))
    return out


def _addr_body(index: int, addr: IPInterface, flags: int = 0) -> bytes:
    plen = addr.network.prefixlen
    body = _IFADDR.pack(_family(addr.version), plen, flags & 0xFF, RT_SCOPE_UNIVERSE, index)
    body += _attr(IFA_LOCAL, addr.ip.packed) + _attr(IFA_ADDRESS, addr.ip.packed)
    if flags:
        body += _u32(IFA_FLAGS, flags)
    return body


def add_address(nl: Netlink, index: int, addr: IPInterface, *, nodad: bool = False, exist_ok: bool = False) -> bool:
    """Add ``addr``; IPv4 prefixes shorter than /31 get their broadcast address as ``ip addr`` does.

    Returns False when ``exist_ok`` and the address was already there.
    """
    body = _addr_body(index, addr, IFA_F_NODAD if nodad else 0)
    if addr.version == 4 and addr.network.prefixlen < 31:
        body += _attr(IFA_BROADCAST, addr.network.broadcast_address.packed)
    try:
        nl.request(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)
    except LinkError as e:
        if exist_ok and e.errno == errno.EEXIST:
            return False
        raise
    return True


def del_address(nl: Netlink, index: int, addr: IPInterface) -> None:
    try:
        nl.request(RTM_DELADDR, NLM_F_ACK, _addr_body(index, addr))
    except LinkError as e:
        if e.errno != errno.EADDRNOTAVAIL:
            raise


# --- routes -------------------------------------------------------------------------------------


def add_route(
    nl: Netlink,
    index: int,
    dst: IPNetwork,
    gateway: str | None,
    *,
    priority: int = 0,
    table: int | None = None,
    scope: int | None = None,
) -> None:
    """Append a route (NLM_F_CREATE|NLM_F_APPEND, as the reference's ``RouteAddEcmp``)."""
    tbl = RT_TABLE_MAIN if table is None else table
    if scope is None:
        scope = RT_SCOPE_UNIVERSE if gateway else RT_SCOPE_LINK
    body = _RTMSG.pack(
        _family(dst.version), dst.prefixlen, 0, 0, tbl if tbl < 256 else 252, RTPROT_BOOT, scope, RTN_UNICAST, 0
    )
    if dst.prefixlen:
        body += _attr(RTA_DST, dst.network_address.packed)
    body += _u32(RTA_OIF, index)
    if gateway:
        body += _attr(RTA_GATEWAY, ipaddress.ip_address(gateway).packed)
    if priority:
        body += _u32(RTA_PRIORITY, priority)
    if tbl >= 256:
        body += _u32(RTA_TABLE, tbl)
    nl.request(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND, body)


def route_oif(nl: Netlink, dst: str) -> int | None:
    """The output interface the kernel picks for ``dst`` (``ip route get``)."""
    ip = ipaddress.ip_address(dst)
    body = _RTMSG.pack(_family(ip.version), ip.max_prefixlen, 0, 0, 0, 0, 0, 0, 0) + _attr(RTA_DST, ip.packed)
    try:
        msgs = nl.request(RTM_GETROUTE, 0, body)
    except LinkError as e:
        if e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return None
        raise
    if not msgs:
        return None
    a = _attrs(msgs[0], _NLMSG.size + _RTMSG.size)
    return _u32_of(a.get(RTA_OIF)) or None


def has_route(nl: Netlink, index: int, dst: IPNetwork, gateway: str | None) -> bool:
    """Whether a main-table route to ``dst`` (via ``gateway``, if given) leaves through ``index``."""
    family = _family(dst.version)
    body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
    for msg in nl.request(RTM_GETROUTE, NLM_F_DUMP, body):
        fam, dst_len = msg[_NLMSG.size], msg[_NLMSG.size + 1]
        if fam != family or dst_len != dst.prefixlen:
            continue
        a = _attrs(msg, _NLMSG.size + _RTMSG.size)
        raw = a.get(RTA_DST)
        if raw is not None and ipaddress.ip_network(f"{ipaddress.ip_address(raw)}/{dst_len}") != dst:
            continue
        gw = a.get(RTA_GATEWAY)
        if _u32_of(a.get(RTA_OIF)) != index or (
            gateway is not None and (gw is None or ipaddress.ip_address(gw) != ipaddress.ip_address(gateway))
        ):
            continue
        return True
    return False


# --- waiting ------------------------------------------------------------------------------------


def wait_oper_up(nl: Netlink, name: str, timeout: float = 2.5) -> str:
    """Poll until the link's operstate is UP; returns the last state seen.

    A fresh bridge port turns UP when its veth peer comes up, a workqueue hop later: usually
    within a millisecond, so the first sleeps are short.
    """
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while True:
        link = get_link(nl, name)
        state = link.operstate if link else "NOTFOUND"
        if state == "UP" or time.monotonic() >= deadline:
            return state
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def wait_dad(nl: Netlink, index: int, timeout: float = 5.0) -> None:
    """Wait until no IPv6 address of the link is tentative; DAD failure is an error."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        tentative = False
        for addr, flags in addresses(nl, index, socket.AF_INET6):
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


# --- deleting -----------------------------------------------------------------------------------

_RTMGRP_LINK = 0x1


def _deleted(data: bytes, name: str) -> bool:
    pos = 0
    while pos + _NLMSG.size <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, pos)
        if length < _NLMSG.size:
            return False
        msg = data[pos : pos + length]
        if kind == RTM_DELLINK and len(msg) >= _NLMSG.size + _IFINFO.size and msg[_NLMSG.size] == socket.AF_UNSPEC:
            if _cstr(_attrs(msg, _NLMSG.size + _IFINFO.size).get(IFLA_IFNAME, b"")) == name:
                return True
        pos += (length + 3) & ~3
    return False


def delete_link(name: str, timeout: float = 10.0) -> bool:
    """Delete link ``name`` in the calling thread's namespace; False if there was none.

    Returns once the kernel announces the deletion (RTM_DELLINK: the device is unlisted and its
    name free); the request's acknowledgement, which waits for the kernel's RCU barrier, is
    collected by a helper thread.
    """
    monitor = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    monitor.bind((0, _RTMGRP_LINK))
    request = Netlink()
    outcome: list[int] = []
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC)

    def send() -> None:
        try:
            request.request(RTM_DELLINK, NLM_F_ACK, _ifinfo() + _str(IFLA_IFNAME, name))
            outcome.append(0)
        except OSError as e:
            outcome.append(e.errno or errno.EIO)
        finally:
            request.close()
            try:
                os.write(wake_w, b"x")
            except OSError:
                pass  # the caller already saw the deletion and stopped listening
            os.close(wake_w)

    try:
        threading.Thread(target=send, name=f"dellink:{name}", daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkError(errno.ETIMEDOUT, f"timed out deleting link {name!r}")
            ready, _, _ = select.select([monitor, wake_r], [], [], left)
            if monitor in ready:
                try:
                    if _deleted(monitor.recv(1 << 16), name):
                        return True
                except OSError as e:
                    if e.errno != errno.ENOBUFS:  # overrun: the acknowledgement still tells
                        raise
            if wake_r in ready:
                code = outcome[0]
                if code == 0:
                    return True
                if code == errno.ENODEV:
                    return False
                raise _error(code, f"failed to delete link {name!r}")
    finally:
        monitor.close()
        os.close(wake_r)

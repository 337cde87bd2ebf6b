"""Several rtnetlink requests sent as one: each built with pyroute2's message classes (the bytes
its ``IPRoute`` API sends for the same call, as a test checks), all written with one ``send`` on
a netlink socket opened for them in the calling thread's namespace, and every answer read back.

A request through ``IPRoute`` costs ~0.15-0.3 ms of pyroute2's machinery (an asyncio loop turn,
request filters) on top of the kernel's few microseconds, and an ``IPRoute`` opened in a fresh
thread another ~0.4 ms; building the message costs less (see below). The kernel handles the
messages of one send in order, each on its own: a failed request does not stop the next ones,
so a caller sends together only requests whose later members are harmless after an earlier
failure (its undo removes what they did), and reads the answers in order. Acknowledgements
come without the request echoed back (``NETLINK_CAP_ACK``) and are read from their header and
error code; what a get or a dump returns is kept as bytes, decoded by pyroute2 when a caller
asks for :attr:`Answer.messages`. A caller that reads a few fields of a big answer reads them from the
bytes instead (:func:`attributes`): pyroute2 decodes an RTM_NEWLINK's ~40 attributes into ~45
objects (~0.17 ms) however few are read.

pyroute2 encodes a request in ~0.03-0.2 ms, and most of an ADD's requests are the same bytes as
the previous ADD's (``lo`` up, the bridge looked up by name, the container's ``eth0`` settings
and default route): a request is encoded by pyroute2 the first time its content is seen, and
its bytes reused, with their own sequence number, while it is among the last
:data:`_ENCODED_KEPT` distinct ones.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping
from logging import DEBUG
from typing import Any

import attrs
from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, nla
from pyroute2.netlink.rtnl import (
    RTM_DELLINK,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.marshal import MarshalRtnl
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from . import changes
from .errors import LinkError

__all__ = ["Answer", "Requests", "HEADER_SIZE", "IFF_UP", "attributes"]

IFF_UP = 0x1
# linux/netlink.h: NLM_F_CREATE | NLM_F_EXCL (ip addr add) and NLM_F_CREATE | NLM_F_APPEND (ip route append)
_CREATE_EXCL, _CREATE_APPEND = 0x400 | 0x200, 0x400 | 0x800
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253
_RECV = 1 << 16
# linux/netlink.h: an acknowledgement without the request echoed back in it
SOL_NETLINK, NETLINK_CAP_ACK = 270, 10
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr: length, type, flags, sequence, port id
#: Where a message's own header (struct ifinfomsg, rtmsg, ...) starts in its bytes.
HEADER_SIZE = _HEADER.size
_ERROR = struct.Struct("=i")  # struct nlmsgerr's error, right after the header (NLMSG_DONE's too)
_SEQUENCE = struct.Struct("=I")
_SEQUENCE_OFFSET = 8  # in struct nlmsghdr
#: How many distinct requests' bytes are kept (the least recently sent go first).
_ENCODED_KEPT = 64
_encoded: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
_encoded_lock = threading.Lock()


def _unlock_in_child() -> None:
    """A forked child's own lock: the fork may have caught another thread holding the parent's."""
    global _encoded_lock
    _encoded_lock = threading.Lock()


os.register_at_fork(after_in_child=_unlock_in_child)
#: The requests that change something, as the debug log names them (:mod:`.changes`).
_CHANGES = {RTM_NEWLINK: "link set", RTM_DELLINK: "link del", RTM_NEWADDR: "addr add", RTM_NEWROUTE: "route append"}


class _ifinfmsg_conf(ifinfmsg):  # type: ignore[misc]  # pyroute2's classes are untyped (Any)
    """pyroute2's link message whose IFLA_AF_SPEC → AF_INET → IFLA_INET_CONF is what the kernel's
    setter (``inet_set_link_af``, net/ipv4/devinet.c) takes: one u32 attribute per setting, its
    type the setting's ``IPV4_DEVCONF_*`` number. pyroute2 only knows the dump's form, a flat
    array of every setting (which the setter refuses: an attribute of type 0)."""

    nla_map = tuple(("IFLA_AF_SPEC", "af_spec_set") if e[0] == "IFLA_AF_SPEC" else e for e in ifinfmsg.nla_map)
    # pyroute2 compiles a class's nla_map on its first message and marks the class done; a
    # subclass would inherit ifinfmsg's mark (and tables) if ifinfmsg was used first.
    _nlmsg_base__compiled_nla = False

    class af_spec_set(nla):  # type: ignore[misc]
        nla_map = ((socket.AF_INET, "AF_INET", "inet"),)

        class inet(nla):  # type: ignore[misc]
            nla_map = (("IFLA_INET_UNSPEC", "none"), ("IFLA_INET_CONF", "conf"))

            class conf(nla):  # type: ignore[misc]
                # linux/ip.h: IPV4_DEVCONF_FORWARDING = 1, ...: the order of pyroute2's dump fields
                # (its first, "dummy", is the dump's attribute header)
                nla_map = tuple(
                    (number, f"IPV4_DEVCONF_{name.upper()}", "uint32")
                    for number, name in enumerate(ifinfmsg.af_spec_inet.inet.field_names)
                    if number
                )


_INET_CONF_NAMES = frozenset(ifinfmsg.af_spec_inet.inet.field_names[1:])


@attrs.frozen
class Answer:
    """The kernel's answer to one request: its error (``None``: done) and, for a get or a dump,
    the messages, each as the kernel's bytes (``raw``) or decoded by pyroute2 (:attr:`messages`)."""

    error: LinkError | None
    raw: tuple[bytes, ...] = ()

    @property
    def messages(self) -> tuple[Any, ...]:
        """The messages decoded by pyroute2 (anew on each use)."""
        marshal = MarshalRtnl()
        return tuple(msg for data in self.raw for msg in marshal.parse(data))

    def check(self) -> tuple[bytes, ...]:
        """The messages' bytes (:attr:`raw`), or the error raised."""
        if self.error is not None:
            raise self.error
        return self.raw


def _words(msg: Any, attributes: list[tuple[str, Any]]) -> list[str]:
    """A change request as ``key=value`` words, as pyroute2's API would have been called (the
    link kind first, attribute names without their ``IFLA_``/``IFA_``/``RTA_`` prefix)."""
    words: list[str] = []
    for name, value in attributes:
        if name == "IFLA_LINKINFO":
            kind = dict(value["attrs"]).get("IFLA_INFO_KIND")
            words.insert(0, f"kind={kind}")
        else:
            words.append(f"{name.split('_', 1)[1].lower()}={value}")
    named = {word.split("=", 1)[0] for word in words}
    return words + [f"{name}={msg[name]}" for name, *_ in msg.fields if msg[name] and name not in named | {"family"}]


class Requests:
    """Requests to send together (:meth:`send`); each method returns the position of its answer."""

    def __init__(self) -> None:
        self._data: list[bytes] = []
        self._dumps: set[int] = set()
        self._defaults_only: set[int] = set()
        self._logged: list[tuple[int, str, list[str]]] = []

    def _add(self, msg: Any, kind: int, flags: int, attributes: list[tuple[str, Any]]) -> int:
        sequence = len(self._data) + 1
        # The whole content: the class (how it encodes), header, fields and attributes, read
        # before pyroute2's encoding adds its own keys to the nested ones.
        # (A field not set reads 0, as pyroute2's ``msg[name]`` has it, without its dict of fields.)
        fields = tuple([dict.get(msg, name, 0) for name, *_ in msg.fields])
        key = (type(msg), kind, flags, fields, repr(attributes))
        msg["attrs"] = attributes
        with _encoded_lock:
            data = _encoded.get(key)
            if data is not None:
                _encoded.move_to_end(key)
        if data is None:
            msg["header"]["type"] = kind
            msg["header"]["flags"] = NLM_F_REQUEST | flags
            msg["header"]["sequence_number"] = 0
            msg.encode()
            data = bytes(msg.data)
            with _encoded_lock:
                _encoded[key] = data
                if len(_encoded) > _ENCODED_KEPT:
                    _encoded.popitem(last=False)
        numbered = bytearray(data)
        _SEQUENCE.pack_into(numbered, _SEQUENCE_OFFSET, sequence)
        self._data.append(bytes(numbered))
        if (flags & NLM_F_DUMP) == NLM_F_DUMP:
            self._dumps.add(len(self._data))
        if kind in _CHANGES and changes.log.isEnabledFor(DEBUG):
            verb = "link add" if kind == RTM_NEWLINK and flags & _CREATE_EXCL else _CHANGES[kind]
            self._logged.append((len(self._data) - 1, verb, _words(msg, attributes)))
        return len(self._data) - 1

    def link_get(self, index: int = 0, name: str | None = None) -> int:
        """``RTM_GETLINK`` by index or name: one message, or ENODEV."""
        msg = ifinfmsg()
        msg["index"] = index
        return self._add(msg, RTM_GETLINK, NLM_F_ACK, [("IFLA_IFNAME", name)] if name else [])

    def veth_add(self, host: dict[str, Any], peer: dict[str, Any], *, master: int | None = None, mtu: int = 0) -> int:
        """``ip link add type veth``: the host end (``ifname``, ``address``), UP and enslaved to
        ``master``, here; the peer (``ifname``, ``net_ns_fd``, ``address``) made in its namespace."""
        msg = ifinfmsg()
        msg["flags"] = msg["change"] = IFF_UP
        peer_attrs: list[tuple[str, Any]] = [("IFLA_IFNAME", peer["ifname"]), ("IFLA_NET_NS_FD", peer["net_ns_fd"])]
        if peer.get("address"):
            peer_attrs.append(("IFLA_ADDRESS", peer["address"]))
        attributes: list[tuple[str, Any]] = [("IFLA_IFNAME", host["ifname"]), ("IFLA_ADDRESS", host["address"])]
        if master:
            attributes.append(("IFLA_MASTER", master))
        if mtu > 0:
            attributes.append(("IFLA_MTU", mtu))
            peer_attrs.append(("IFLA_MTU", mtu))
        info = {"attrs": [("VETH_INFO_PEER", {"attrs": peer_attrs})]}
        attributes.append(("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "veth"), ("IFLA_INFO_DATA", info)]}))
        return self._add(msg, RTM_NEWLINK, NLM_F_ACK | _CREATE_EXCL, attributes)

    def link_del(self, name: str) -> int:
        """``ip link del`` by name (a veth's peer goes with it)."""
        return self._add(ifinfmsg(), RTM_DELLINK, NLM_F_ACK, [("IFLA_IFNAME", name)])

    def link_set(
        self, index: int, *, up: bool = False, address: str | None = None, inet_conf: Mapping[str, int] | None = None
    ) -> int:
        """``ip link set``: UP (when ``up``), the MAC (when ``address``), and the link's IPv4
        settings ``inet_conf`` (``/proc/sys/net/ipv4/conf/<link>/`` names: ``{"arp_notify": 1}``)."""
        msg = _ifinfmsg_conf() if inet_conf else ifinfmsg()
        msg["index"] = index
        msg["flags"] = msg["change"] = IFF_UP if up else 0
        attributes: list[tuple[str, Any]] = [("IFLA_ADDRESS", address)] if address else []
        if inet_conf:
            unknown = set(inet_conf) - _INET_CONF_NAMES
            if unknown:  # pyroute2 would leave them out without a word
                raise ValueError(f"unknown IPv4 link settings: {sorted(unknown)}")
            conf = [(f"IPV4_DEVCONF_{name.upper()}", value) for name, value in inet_conf.items()]
            inet = {"attrs": [("IFLA_INET_CONF", {"attrs": conf})]}
            attributes.append(("IFLA_AF_SPEC", {"attrs": [("AF_INET", inet)]}))
        return self._add(msg, RTM_NEWLINK, NLM_F_ACK, attributes)

    def addr_add(self, index: int, addr: Any, *, nodad: bool = False) -> int:
        """``ip addr add`` of an ``ipaddress`` interface; IPv4 prefixes shorter than /31 get their
        broadcast address, as ``ip addr`` gives them; ``nodad``: IFA_F_NODAD."""
        msg = ifaddrmsg()
        msg["family"] = socket.AF_INET if addr.version == 4 else socket.AF_INET6
        msg["prefixlen"] = addr.network.prefixlen
        msg["index"] = index
        attributes: list[tuple[str, Any]] = [("IFA_ADDRESS", str(addr.ip))]
        if addr.version == 4:
            if addr.network.prefixlen < 31:
                attributes.append(("IFA_BROADCAST", str(addr.network.broadcast_address)))
            attributes.append(("IFA_LOCAL", str(addr.ip)))
        if nodad:
            attributes.append(("IFA_FLAGS", 0x02))  # IFA_F_NODAD
        return self._add(msg, RTM_NEWADDR, NLM_F_ACK | _CREATE_EXCL, attributes)

    def addr_dump(self) -> int:
        """Every address of the namespace (pyroute2's own dump filters by link afterwards too)."""
        return self._add(ifaddrmsg(), RTM_GETADDR, NLM_F_DUMP, [])

    def route_append(
        self,
        index: int,
        dst: Any,
        gateway: str | None,
        *,
        priority: int = 0,
        table: int | None = None,
        scope: int | None = None,
    ) -> int:
        """A route appended (``ip route append``, as :func:`.routing.add_route` sends it) to the
        ``ipaddress`` network ``dst`` through link ``index``."""
        table = RT_TABLE_MAIN if table is None else table
        msg = rtmsg()
        msg["family"] = socket.AF_INET if dst.version == 4 else socket.AF_INET6
        msg["dst_len"] = dst.prefixlen
        msg["table"] = table if table < 256 else RT_TABLE_MAIN  # as pyroute2 sends it: RTA_TABLE is the real one
        msg["proto"] = RTPROT_BOOT
        msg["scope"] = (RT_SCOPE_UNIVERSE if gateway else RT_SCOPE_LINK) if scope is None else scope
        msg["type"] = RTN_UNICAST
        attributes: list[tuple[str, Any]] = []
        if dst.prefixlen:
            attributes.append(("RTA_DST", str(dst.network_address)))
        attributes += [("RTA_OIF", index), ("RTA_TABLE", table)]
        if gateway:
            attributes.append(("RTA_GATEWAY", gateway))
        if priority:
            attributes.append(("RTA_PRIORITY", priority))
        return self._add(msg, RTM_NEWROUTE, NLM_F_ACK | _CREATE_APPEND, attributes)

    def route_get(self, dst: Any) -> int:
        """``ip route get`` of an ``ipaddress`` address: the route the kernel picks, one message."""
        msg = rtmsg()
        msg["family"] = socket.AF_INET if dst.version == 4 else socket.AF_INET6
        msg["dst_len"] = dst.max_prefixlen
        msg["table"] = RT_TABLE_MAIN
        return self._add(msg, RTM_GETROUTE, NLM_F_ACK, [("RTA_DST", str(dst))])

    def route_dump(self, family: int, *, defaults_only: bool = False) -> int:
        """Every route of ``family`` in every table; ``defaults_only``: only unicast routes to
        ``0/0`` are decoded, the rest skipped by their header. A host with thousands of links
        has thousands of (link-local, local) routes: decoding them all through pyroute2 costs
        ~0.1 ms each, reading a header a few µs."""
        msg = rtmsg()
        msg["family"] = family
        position = self._add(msg, RTM_GETROUTE, NLM_F_DUMP, [])
        if defaults_only:
            self._defaults_only.add(position + 1)
        return position

    def send(self) -> list[Answer]:
        """Send everything with one ``send``; the answers in the order of the requests. A socket
        error (not a request's) is raised as :class:`LinkError`."""
        if not self._data:
            return []
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        try:
            sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            sock.bind((0, 0))
            sock.send(b"".join(self._data))
            answers = self._answers(sock)
        except OSError as e:
            if isinstance(e, LinkError):
                raise
            raise LinkError(e.errno or errno.EIO, e.strerror or str(e)) from None
        finally:
            sock.close()
        for position, verb, words in self._logged:
            error = answers[position].error
            changes.netlink_batched(verb, words, (error.errno or 0) if error is not None else 0)
        return answers

    def _answers(self, sock: socket.socket) -> list[Answer]:
        """Every request's answer. An acknowledgement (most answers) is read from its header and
        error code alone; the messages a get or a dump returns are kept as they came."""
        messages: dict[int, list[bytes]] = {}
        errors: dict[int, LinkError] = {}
        pending = set(range(1, len(self._data) + 1))
        while pending:
            data = sock.recv(_RECV)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _, seq, _ = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    break
                if seq in pending:
                    if kind == NLMSG_ERROR or kind == NLMSG_DONE:
                        code = -_ERROR.unpack_from(data, offset + _HEADER.size)[0] if length >= _HEADER.size + 4 else 0
                        if code:
                            errors[seq] = LinkError(code, os.strerror(code))
                        pending.discard(seq)
                    elif seq not in self._defaults_only or _is_default(data, offset):
                        messages.setdefault(seq, []).append(data[offset : offset + length])
                        if seq not in self._dumps:
                            pending.discard(seq)  # a get's one answer (its acknowledgement, next, is not awaited)
                offset += (length + 3) & ~3
        return [Answer(errors.get(seq), tuple(messages.get(seq, ()))) for seq in range(1, len(self._data) + 1)]


def _is_default(data: bytes, offset: int) -> bool:
    """Whether the route message at ``offset`` is a unicast route to ``0/0``: struct rtmsg
    (rtm_family, rtm_dst_len, rtm_src_len, rtm_tos, rtm_table, rtm_protocol, rtm_scope,
    rtm_type, ...) right after the netlink header."""
    start = offset + _HEADER.size
    return data[start + 1] == 0 and data[start + 7] == RTN_UNICAST


_ATTRIBUTE = struct.Struct("=HH")  # struct nlattr: length (with itself), type
# linux/netlink.h: the flags an attribute's type may carry (pyroute2 drops them too)
_NLA_TYPE_MASK = ~((1 << 15) | (1 << 14)) & 0xFFFF


def attributes(
    data: bytes | memoryview, start: int, wanted: Collection[int] | None = None, *, end: int | None = None
) -> dict[int, memoryview]:
    """The netlink attributes (struct nlattr, each padded to 4 bytes) from ``start`` to ``end``
    (default: the end of ``data``): each type's first one's payload, by type; only the types in
    ``wanted``, when given (the others are stepped over without a copy or view of them). The
    payload of a nested attribute holds its own attributes (``attributes(payload, 0)``)."""
    view = memoryview(data)
    end = len(data) if end is None else end
    found: dict[int, memoryview] = {}
    offset = start
    while offset + _ATTRIBUTE.size <= end:
        length, kind = _ATTRIBUTE.unpack_from(data, offset)
        if length < _ATTRIBUTE.size or offset + length > end:
            break
        kind &= _NLA_TYPE_MASK
        if (wanted is None or kind in wanted) and kind not in found:
            found[kind] = view[offset + _ATTRIBUTE.size : offset + length]
        offset += (length + 3) & ~3
    return found

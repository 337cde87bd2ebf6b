"""Read pycni's nftables skeleton from the kernel: tables, chains, rules, set names, generation.

libnftables reads every element of every set of a table for any ``list`` of rules (and for a
delete or replace), which makes a look at the rules O(containers). A netlink dump of rules (or
chains, or set definitions) never touches an element, so the skeleton checks use nfnetlink dumps
instead, over a plain ``AF_NETLINK`` socket with a decoder of just the attributes they need: a
rule's chain and the chain its ``jump`` goes to. The kernel filters the rule and set dumps by
table (``NFTA_RULE_TABLE``/``NFTA_SET_TABLE`` in the request), so other tables' rules are never
sent; chains, which the kernel dumps for the whole family, are filtered here before anything
but their table and name is read.

:meth:`Reader.generation` is the ruleset's generation id (``NFT_MSG_GETGEN``), which every
committed nftables transaction of the namespace, by anyone, increments: equal ids mean an
unchanged ruleset.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NetlinkError", "Reader", "Rule", "reading", "FAMILIES"]

#: nfgen_family (NFPROTO_*) of the families pycni has tables in.
FAMILIES = {"inet": 1, "bridge": 7}

_NETLINK_NETFILTER = 12
_SUBSYS = 10 << 8  # NFNL_SUBSYS_NFTABLES
_GETTABLE, _GETCHAIN, _GETRULE, _GETSET, _GETGEN = 1, 4, 7, 10, 16
_F_REQUEST, _F_DUMP, _F_DUMP_INTR = 0x1, 0x300, 0x10
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_HDR = struct.Struct("=IHHII")  # nlmsghdr
_GEN = struct.Struct("=BBH")  # nfgenmsg
_ATTR = struct.Struct("=HH")
_ATTR_TYPE = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
# Attribute numbers (linux/netfilter/nf_tables.h).
_TABLE_NAME = 1  # NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE
_CHAIN_NAME, _RULE_CHAIN, _SET_NAME = 3, 2, 2
_RULE_EXPRESSIONS, _GEN_ID = 4, 1
_EXPR_NAME, _EXPR_DATA = 1, 2
_IMMEDIATE_DATA, _DATA_VERDICT = 2, 2
_VERDICT_CODE, _VERDICT_CHAIN = 1, 2
_NFT_JUMP = -3
_DUMP_RETRIES = 10


class NetlinkError(OSError):
    """The kernel refused a dump request (``errno`` is its error)."""


@contextmanager
def reading(family: str) -> Iterator[Reader]:
    """A :class:`Reader` of ``family``'s tables in the calling thread's namespace."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_NETFILTER)
    except OSError as e:
        raise NetlinkError(e.errno, f"nfnetlink: {e.strerror}") from None
    try:
        yield Reader(sock, FAMILIES[family])
    finally:
        sock.close()


def _attrs(data: bytes, at: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of the netlink attributes in ``data[at:end]``, in order."""
    end = len(data) if end is None else end
    while at + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, at)
        if length < _ATTR.size:
            return
        yield kind & _ATTR_TYPE, data[at + _ATTR.size : at + length]
        at += (length + 3) & ~3


def _string(payload: bytes) -> str:
    return payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _attr(kind: int, value: bytes) -> bytes:
    return _ATTR.pack(_ATTR.size + len(value), kind) + value + b"\0" * (-len(value) % 4)


class Reader:
    """Requests over one nfnetlink socket: use :func:`reading`."""

    def __init__(self, sock: socket.socket, family: int) -> None:
        self._sock = sock
        self._family = family
        self._seq = 0

    def _request(self, kind: int, attrs: bytes = b"", *, dump: bool = True) -> list[tuple[int, bytes]]:
        """Each answer message as (nfgen family, its attributes' bytes); a dump that the
        ruleset changed under (``NLM_F_DUMP_INTR``) is asked again."""
        for _ in range(_DUMP_RETRIES):
            self._seq += 1
            body = _GEN.pack(self._family, 0, 0) + attrs
            flags = _F_REQUEST | (_F_DUMP if dump else 0)
            self._sock.send(_HDR.pack(_HDR.size + len(body), _SUBSYS | kind, flags, self._seq, 0) + body)
            answers, interrupted = self._answers(dump)
            if not interrupted:
                return answers
        raise NetlinkError(errno.EINTR, "nfnetlink dump: the ruleset kept changing")

    def _answers(self, dump: bool) -> tuple[list[tuple[int, bytes]], bool]:
        out: list[tuple[int, bytes]] = []
        interrupted = False
        while True:
            data = self._sock.recv(1 << 17)
            at = 0
            while at + _HDR.size <= len(data):
                length, kind, flags, seq, _ = _HDR.unpack_from(data, at)
                if length < _HDR.size:
                    break
                message = data[at + _HDR.size : at + length]
                at += (length + 3) & ~3
                if seq != self._seq:
                    continue
                if kind == _NLMSG_DONE:
                    return out, interrupted
                if kind == _NLMSG_ERROR:
                    code = -struct.unpack_from("=i", message)[0]
                    if code:
                        raise NetlinkError(code, f"nfnetlink dump: {os.strerror(code)}")
                    return out, interrupted  # an ack
                interrupted |= bool(flags & _F_DUMP_INTR)
                family = message[0] if message else 0
                out.append((family, message[_GEN.size :]))
                if not dump:
                    return out, interrupted

    def _named(self, kind: int, name_attr: int, table: str | None, request: bytes = b"") -> list[dict[int, bytes]]:
        """The answers' attributes (by type) that belong to ``table`` (any, with None) and have a name."""
        out = []
        wanted = None if table is None else table.encode()
        for family, message in self._request(kind, request):
            if family != self._family:
                continue
            found = dict(_attrs(message))
            if name_attr not in found:
                continue
            if wanted is not None and found.get(_TABLE_NAME, b"").split(b"\0", 1)[0] != wanted:
                continue
            out.append(found)
        return out

    def generation(self) -> int:
        """The namespace's nftables ruleset generation id."""
        answers = self._request(_GETGEN, dump=False)
        for _, message in answers:
            for kind, payload in _attrs(message):
                if kind == _GEN_ID:
                    value: int = struct.unpack(">I", payload[:4])[0]
                    return value
        raise NetlinkError(errno.EPROTO, "nfnetlink: no generation id in the answer")

    def tables(self) -> set[str]:
        """Names of the tables of the family."""
        return {_string(a[_TABLE_NAME]) for a in self._named(_GETTABLE, _TABLE_NAME, None)}

    def chains(self, table: str) -> set[str]:
        """Names of the chains of ``table``."""
        return {_string(a[_CHAIN_NAME]) for a in self._named(_GETCHAIN, _CHAIN_NAME, table)}

    def sets(self, table: str) -> set[str]:
        """Names of the sets and maps of ``table`` (no element is read)."""
        request = _attr(_TABLE_NAME, table.encode() + b"\0")
        try:
            found = self._named(_GETSET, _SET_NAME, table, request)
        except NetlinkError as e:
            if e.errno != errno.ENOENT:  # the kernel's answer for a table that does not exist
                raise
            return set()
        return {_string(a[_SET_NAME]) for a in found}

    def rules(self, table: str) -> list[Rule]:
        """Every rule of ``table``, in chain order."""
        request = _attr(_TABLE_NAME, table.encode() + b"\0")
        found = self._named(_GETRULE, _RULE_CHAIN, table, request)
        return [Rule(_string(a[_RULE_CHAIN]), _jump(a.get(_RULE_EXPRESSIONS, b""))) for a in found]


class Rule:
    """A rule as the skeleton checks see it: its chain, and the chain its ``jump`` goes to."""

    __slots__ = ("chain", "jump")

    def __init__(self, chain: str, jump: str | None) -> None:
        self.chain = chain
        self.jump = jump

    def __repr__(self) -> str:
        return f"Rule({self.chain!r}, jump={self.jump!r})"


def _jump(expressions: bytes) -> str | None:
    """The chain an ``immediate`` expression of the rule jumps to."""
    for _, element in _attrs(expressions):  # NFTA_LIST_ELEM
        expr = dict(_attrs(element))
        if _string(expr.get(_EXPR_NAME, b"")) != "immediate":
            continue
        data = dict(_attrs(expr.get(_EXPR_DATA, b"")))
        value = dict(_attrs(data.get(_IMMEDIATE_DATA, b"")))
        verdict = dict(_attrs(value.get(_DATA_VERDICT, b"")))
        code = verdict.get(_VERDICT_CODE)
        if code is not None and struct.unpack(">i", code[:4])[0] == _NFT_JUMP and _VERDICT_CHAIN in verdict:
            return _string(verdict[_VERDICT_CHAIN])
    return None

"""Read pycni's nftables skeleton from the kernel: tables, chains, rules, set names, generation.

libnftables reads every element of every set of a table for any ``list`` of rules (and for a
delete or replace), which makes a look at the rules O(containers). A netlink dump of rules (or
chains, or set definitions) never touches an element, so the skeleton checks use pyroute2's
nfnetlink dumps instead and read only what they need: a rule's chain and the chain its ``jump``
goes to. The rule and set requests name the table (``NFTA_RULE_TABLE``/``NFTA_SET_TABLE``), so
the kernel sends no other table's rules or sets; chains, which the kernel dumps for the whole
family, are filtered by table here.

:meth:`Reader.generation` is the ruleset's generation id (``NFT_MSG_GETGEN``), which every
committed nftables transaction of the namespace, by anyone, increments: equal ids mean an
unchanged ruleset. A dump is not a snapshot, and pyroute2 does not report ``NLM_F_DUMP_INTR`` (it
swallows the ``NLMSG_DONE`` that carries it for a table this small), so a reader that needs one
state compares the ids read before and after its dumps.

:func:`watching` subscribes to the namespace's nftables change notifications
(``NFNLGRP_NFTABLES``): every committed transaction, by anyone, as the objects it added and
removed followed by its new generation id (``NFT_MSG_NEWGEN``, with the committing process).
"""

from __future__ import annotations

import atexit
import errno
import os
import select
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["NetlinkError", "Reader", "Rule", "reading", "FAMILIES", "Probe", "Batch", "Watcher", "watching"]

#: nfgen_family (NFPROTO_*) of the families pycni has tables in, and iptables-nft's.
FAMILIES = {"inet": 1, "ip": 2, "bridge": 7, "ip6": 10}


class NetlinkError(OSError):
    """The kernel refused a request (``errno`` is its error)."""


@contextmanager
def reading(family: str) -> Iterator[Reader]:
    """A :class:`Reader` of ``family``'s tables in the calling thread's namespace.

    Opening the socket costs more than a cached read (~0.25 ms against ~0.1 ms for the
    generation), so a thread that keeps its ``IPRoute`` (:func:`.links.iproute`: the main
    thread, ``pycni serve``'s workers) keeps one socket per family for its current namespace
    too; a block nested in another gets its own, and one that raised is not kept."""
    from pyroute2.netlink.nfnetlink import nftsocket  # pyroute2 only where the skeleton is read

    from .links import keeps_sockets, namespace_key

    kept = keeps_sockets() and not _kept.lent
    key = namespace_key() if kept else None
    if kept and _kept.key != key:
        _close_kept_readers()
        _kept.key = key
    sock = _kept.socks.get(family) if kept else None
    if sock is None:
        try:
            sock = nftsocket.NFTSocket(nfgen_family=FAMILIES[family])
        except OSError as e:
            raise NetlinkError(e.errno, f"nfnetlink: {e.strerror}") from None
    _kept.lent += 1
    ok = False
    try:
        yield Reader(sock, nftsocket)
        ok = True
    finally:
        _kept.lent -= 1
        if kept and ok:
            _kept.socks[family] = sock
        else:
            if kept:
                _kept.socks.pop(family, None)
            sock.close()


class _KeptReaders(threading.local):
    key: tuple[int, int, int] | None = None
    lent = 0

    def __init__(self) -> None:
        self.socks: dict[str, Any] = {}


_kept = _KeptReaders()


@atexit.register
def _close_kept_readers() -> None:
    socks, _kept.socks = _kept.socks, {}
    if _kept.key is not None and _kept.key[0] == os.getpid():  # a forked child leaves the parent's alone
        for sock in socks.values():
            sock.close()


class Reader:
    """Requests over one nfnetlink socket: use :func:`reading`."""

    def __init__(self, sock: Any, nftsocket: Any) -> None:
        self._sock = sock
        self._nft = nftsocket  # pyroute2's message classes, imported with the socket

    def _get(self, msg: Any, msg_type: int, *, dump: bool = True) -> list[Any]:
        from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
        from pyroute2.netlink.exceptions import NetlinkError as PyrouteError

        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else 0)
        try:
            return list(self._sock.request_get(msg, msg_type, msg_flags=flags))
        except PyrouteError as e:
            raise NetlinkError(e.code, f"nfnetlink: {e}") from None

    def generation(self) -> int:
        """The namespace's nftables ruleset generation id."""
        for msg in self._get(self._nft.nft_gen_msg(), self._nft.NFT_MSG_GETGEN, dump=False):
            value = msg.get_attr("NFTA_GEN_ID")
            if value is not None:
                return int(value)
        raise NetlinkError(errno.EPROTO, "nfnetlink: no generation id in the answer")

    def has_table(self, name: str) -> bool:
        """Whether the family has table ``name`` (one lookup, no dump)."""
        request = self._nft.nft_table_msg()
        request["attrs"] = [("NFTA_TABLE_NAME", name)]
        try:
            return bool(self._get(request, self._nft.NFT_MSG_GETTABLE, dump=False))
        except NetlinkError as e:
            if e.errno != errno.ENOENT:
                raise
            return False

    def tables(self) -> set[str]:
        """Names of the tables of the family."""
        msgs = self._get(self._nft.nft_table_msg(), self._nft.NFT_MSG_GETTABLE)
        return {m.get_attr("NFTA_TABLE_NAME") for m in msgs} - {None}

    def chains(self, table: str) -> set[str]:
        """Names of the chains of ``table``."""
        msgs = self._get(self._nft.nft_chain_msg(), self._nft.NFT_MSG_GETCHAIN)
        return {m.get_attr("NFTA_CHAIN_NAME") for m in msgs if m.get_attr("NFTA_CHAIN_TABLE") == table} - {None}

    def sets(self, table: str) -> set[str]:
        """Names of the sets and maps of ``table`` (no element is read)."""
        request = self._nft.nft_set_msg()
        request["attrs"] = [("NFTA_SET_TABLE", table)]
        try:
            msgs = self._get(request, self._nft.NFT_MSG_GETSET)
        except NetlinkError as e:
            if e.errno != errno.ENOENT:  # the kernel's answer for a table that does not exist
                raise
            return set()
        return {m.get_attr("NFTA_SET_NAME") for m in msgs} - {None}

    def rules(self, table: str) -> list[Rule]:
        """Every rule of ``table``, in chain order."""
        request = self._nft.nft_rule_msg()
        request["attrs"] = [("NFTA_RULE_TABLE", table)]
        msgs = self._get(request, self._nft.NFT_MSG_GETRULE)
        return [Rule(m.get_attr("NFTA_RULE_CHAIN"), _jump(m.get_attr("NFTA_RULE_EXPRESSIONS"))) for m in msgs]


class Probe:
    """Two small questions on a socket of its own, each one ``send`` of the request pyroute2's
    message classes encode and one ``recv``: the namespace's ruleset generation id
    (``NFT_MSG_GETGEN``) and whether a table exists (``NFT_MSG_GETTABLE`` of one name). Of the
    generation's answer only ``NFTA_GEN_ID`` is read, walking its attributes with
    :mod:`struct` (pyroute2's decoder costs ~0.05 ms of the ~0.055 a read would take; this read
    is on every nftables transaction's path); errors are decoded by pyroute2. The socket
    belongs to the namespace the calling thread was in when it was made."""

    def __init__(self) -> None:
        from pyroute2.netlink import NLM_F_REQUEST, nlmsgerr
        from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_NFTABLES, nftsocket

        self._nft, self._error, self._tables = nftsocket, nlmsgerr, dict[tuple[str, str], bytes]()
        self._subsystem: int = NFNL_SUBSYS_NFTABLES << 8
        self._flags = NLM_F_REQUEST
        self._request = self._encode(nftsocket.nft_gen_msg(), nftsocket.NFT_MSG_GETGEN)
        try:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
        except OSError as e:
            raise NetlinkError(e.errno, f"nfnetlink: {e.strerror}") from None

    def _encode(self, request: Any, message: int) -> bytes:
        request["header"]["type"] = self._subsystem | message
        request["header"]["flags"] = self._flags
        request["header"]["sequence_number"] = 1
        request.encode()
        return bytes(request.data)

    def _ask(self, request: bytes) -> tuple[bytes, int]:
        """The answer to ``request`` and its message type; :class:`NetlinkError` for a refusal."""
        try:
            self._sock.send(request)
            data = self._sock.recv(_RECV)
        except OSError as e:
            raise NetlinkError(e.errno, f"nfnetlink: {e.strerror}") from None
        length, kind = _NLMSGHDR.unpack_from(data)
        if kind == _NLMSG_ERROR:
            refusal = self._error(data)
            refusal.decode()
            code = -int(refusal["error"])
            raise NetlinkError(code, f"nfnetlink: {os.strerror(code)}")
        return data[:length], kind

    def has_table(self, family: str, name: str) -> bool:
        """Whether ``table <family> <name>`` exists (one lookup: no table, chain or set is listed)."""
        request = self._tables.get((family, name))
        if request is None:
            message = self._nft.nft_table_msg()
            message["nfgen_family"] = FAMILIES[family]
            message["attrs"] = [("NFTA_TABLE_NAME", name)]
            request = self._tables[(family, name)] = self._encode(message, self._nft.NFT_MSG_GETTABLE)
        try:
            self._ask(request)
        except NetlinkError as e:
            if e.errno != errno.ENOENT:
                raise
            return False
        return True

    def generation(self) -> int:
        """The generation id now: every committed transaction of the namespace increments it."""
        data, _ = self._ask(self._request)
        offset = _NLMSGHDR_LEN + _NFGENMSG_LEN
        while offset + _NLA_LEN <= len(data):
            size, attr = _NLA.unpack_from(data, offset)
            if attr & _NLA_TYPE_MASK == _NFTA_GEN_ID and size >= _NLA_LEN + 4:
                return int(_BE32.unpack_from(data, offset + _NLA_LEN)[0])
            offset += (max(size, _NLA_LEN) + 3) & ~3
        raise NetlinkError(errno.EPROTO, "nfnetlink: no generation id in the answer")

    def close(self) -> None:
        self._sock.close()


# linux/netlink.h, linux/netfilter/nfnetlink.h and nf_tables.h: what Probe reads.
_NETLINK_NETFILTER = 12
_NLMSG_ERROR = 2
_RECV = 1024
_NLMSGHDR = struct.Struct("=IH")  # nlmsg_len, nlmsg_type (host order)
_NLMSGHDR_LEN = 16
_NFGENMSG_LEN = 4
_NLA = struct.Struct("=HH")  # nla_len, nla_type (host order)
_NLA_LEN = 4
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_NFTA_GEN_ID = 1
_BE32 = struct.Struct(">I")


class Rule:
    """A rule as the skeleton checks see it: its chain, and the chain its ``jump`` goes to."""

    __slots__ = ("chain", "jump")

    def __init__(self, chain: str, jump: str | None) -> None:
        self.chain = chain
        self.jump = jump

    def __repr__(self) -> str:
        return f"Rule({self.chain!r}, jump={self.jump!r})"


def _jump(expressions: Any) -> str | None:
    for expr in expressions or ():
        if expr.get_attr("NFTA_EXPR_NAME") != "immediate":
            continue
        data = expr.get_attr("NFTA_EXPR_DATA")
        value = data.get_attr("NFTA_IMMEDIATE_DATA") if data is not None else None
        verdict = value.get_attr("NFTA_DATA_VERDICT") if value is not None else None
        if verdict is not None and verdict.get_attr("NFTA_VERDICT_CODE") == "NFT_JUMP":
            chain: str = verdict.get_attr("NFTA_VERDICT_CHAIN")  # pyroute2 is untyped
            return chain
    return None


# nf_tables.h: the message types whose notifications remove something, and the attribute that
# names the table in each (and the chain, for chains and rules); NFT_MSG_NEWGEN ends a
# transaction's notifications.
_REMOVALS = {
    2: ("table", "NFTA_TABLE_NAME"),
    5: ("chain", "NFTA_CHAIN_TABLE"),
    8: ("rule", "NFTA_RULE_TABLE"),
    11: ("set", "NFTA_SET_TABLE"),
    14: ("element", "NFTA_SET_ELEM_LIST_TABLE"),
}
_CHAIN_OF = {5: "NFTA_CHAIN_NAME", 8: "NFTA_RULE_CHAIN"}
_NEWTABLE = 0
_NEWGEN = 15
_NFNLGRP_NFTABLES = 7
_FAMILY_NAMES = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}


class Batch:
    """One committed transaction as its notifications tell it: its generation id, the pid that
    committed it (``None``: the kernel did not say), and what it removed, as ``(kind, family,
    table)`` (kind: table, chain, rule, set, element), the chains it removed or removed rules of,
    as ``(family, table, chain)``, and the tables it created, as ``(family, table)``. ``lost``
    means notifications were dropped (the socket's buffer overflowed): anything may have changed."""

    __slots__ = ("generation", "pid", "removed", "chains", "created", "lost")

    def __init__(self) -> None:
        self.generation = 0
        self.pid: int | None = None
        self.removed: set[tuple[str, str, str]] = set()
        self.chains: set[tuple[str, str, str]] = set()
        self.created: set[tuple[str, str]] = set()
        self.lost = False

    def removes(self, table: str, kinds: tuple[str, ...] = ("table", "chain", "rule", "set", "element")) -> bool:
        """Whether it removed one of ``kinds`` of a table named ``table`` (any family)."""
        return any(kind in kinds and name == table for kind, _, name in self.removed)

    def __repr__(self) -> str:
        return (
            f"Batch({self.generation}, pid={self.pid}, removed={sorted(self.removed)}, "
            f"chains={sorted(self.chains)}, created={sorted(self.created)}, lost={self.lost})"
        )


@contextmanager
def watching() -> Iterator[Watcher]:
    """A :class:`Watcher` of the calling thread's namespace (the socket stays bound to it)."""
    from pyroute2.netlink.nfnetlink import nftsocket

    try:
        sock = nftsocket.NFTSocket(nfgen_family=0)
        try:
            sock.bind(groups=1 << (_NFNLGRP_NFTABLES - 1))
        except BaseException:
            sock.close()
            raise
    except OSError as e:
        raise NetlinkError(e.errno, f"nfnetlink: {e.strerror}") from None
    try:
        yield Watcher(sock)
    finally:
        sock.close()


class Watcher:
    """nftables change notifications over one pyroute2 nfnetlink socket: use :func:`watching`,
    and read it from the thread that made it (pyroute2's sockets belong to one thread)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._open = Batch()

    def _queued(self) -> bool:
        # pyroute2 reads every datagram waiting on the socket whenever it reads, and hands
        # them out one per get(): those already read are in its queue, not on the socket.
        queue = getattr(getattr(getattr(self._sock, "asyncore", None), "msg_queue", None), "root", None)
        return queue is not None and not queue.empty()

    def batches(self, timeout: float) -> list[Batch]:
        """The transactions committed since the last call, waiting up to ``timeout`` seconds
        for the first notification (an empty list: none came)."""
        done: list[Batch] = []
        wait = timeout
        while self._queued() or select.select([self._sock.fileno()], [], [], wait)[0]:
            wait = 0.0
            try:
                messages = self._sock.get()
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise NetlinkError(e.errno or errno.EIO, f"nfnetlink: {e}") from None
                self._open.lost = True
                continue
            for msg in messages:
                self._take(msg, done)
        return done

    def _take(self, msg: Any, done: list[Batch]) -> None:
        header = msg.get("header", {})
        if header.get("error") is not None:
            code = getattr(header["error"], "code", errno.EIO)
            if code == errno.ENOBUFS:
                self._open.lost = True
                return
            raise NetlinkError(code, f"nfnetlink: {header['error']}")
        kind = header.get("type", 0) & 0xFF
        if kind == _NEWGEN:
            batch, self._open = self._open, Batch()
            batch.generation = int(msg.get_attr("NFTA_GEN_ID") or 0)
            pid = msg.get_attr("NFTA_GEN_PROC_PID")
            batch.pid = int(pid) if pid is not None else None
            done.append(batch)
            return
        removal = _REMOVALS.get(kind)
        if removal is None and kind != _NEWTABLE:
            return
        family = _FAMILY_NAMES.get(msg.get("nfgen_family", 0), str(msg.get("nfgen_family")))
        if removal is None:
            self._open.created.add((family, str(msg.get_attr("NFTA_TABLE_NAME"))))
            return
        table = str(msg.get_attr(removal[1]))
        self._open.removed.add((removal[0], family, table))
        chain = _CHAIN_OF.get(kind)
        if chain is not None:
            self._open.chains.add((family, table, str(msg.get_attr(chain))))

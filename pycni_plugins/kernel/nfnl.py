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
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["NetlinkError", "Reader", "Rule", "reading", "FAMILIES"]

#: nfgen_family (NFPROTO_*) of the families pycni has tables in.
FAMILIES = {"inet": 1, "bridge": 7}


class NetlinkError(OSError):
    """The kernel refused a request (``errno`` is its error)."""


@contextmanager
def reading(family: str) -> Iterator[Reader]:
    """A :class:`Reader` of ``family``'s tables in the calling thread's namespace."""
    from pyroute2.netlink.nfnetlink import nftsocket  # pyroute2 only where the skeleton is read

    try:
        sock = nftsocket.NFTSocket(nfgen_family=FAMILIES[family])
    except OSError as e:
        raise NetlinkError(e.errno, f"nfnetlink: {e.strerror}") from None
    try:
        yield Reader(sock, nftsocket)
    finally:
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

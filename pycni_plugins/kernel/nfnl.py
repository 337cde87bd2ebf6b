"""Read pycni's nftables skeleton from the kernel: tables, chains, rules, set names.

libnftables reads every element of every set of a table for any ``list`` of rules (and for a
delete or replace), which makes a look at the rules O(containers). A netlink dump of rules (or
chains, or set definitions) never touches an element, so the skeleton checks use pyroute2's
nfnetlink dumps instead and read only what they need: a rule's chain and the chain its ``jump``
goes to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["NetlinkError", "Reader", "Rule", "reading", "FAMILIES"]

#: nfgen_family (NFPROTO_*) of the families pycni has tables in.
FAMILIES = {"inet": 1, "bridge": 7}


class NetlinkError(OSError):
    """The kernel refused a dump request (``errno`` is its error)."""


@contextmanager
def reading(family: str) -> Iterator[Reader]:
    """A :class:`Reader` of ``family``'s tables in the calling thread's namespace."""
    from pyroute2.nftables.main import NFTables

    try:
        nft = NFTables(nfgen_family=FAMILIES[family])
    except OSError as e:
        raise NetlinkError(e.errno, f"nfnetlink: {e.strerror}") from None
    try:
        yield Reader(nft)
    finally:
        nft.close()


class Reader:
    """Dumps over one nfnetlink socket (opening one costs more than a dump): use :func:`reading`."""

    def __init__(self, nft: Any) -> None:
        self._nft = nft

    def _dump(self, what: Callable[[Any], Any], table_attr: str, name_attr: str, table: str | None) -> list[Any]:
        from pyroute2.netlink.exceptions import NetlinkError as PyrouteError

        try:
            msgs = list(what(self._nft))
        except PyrouteError as e:
            raise NetlinkError(e.code, f"nfnetlink dump: {e}") from None
        keep = (m for m in msgs if table is None or m.get_attr(table_attr) == table)
        return [m for m in keep if m.get_attr(name_attr) is not None]

    def tables(self) -> set[str]:
        """Names of the tables of the family."""
        msgs = self._dump(lambda n: n.get_tables(), "NFTA_TABLE_NAME", "NFTA_TABLE_NAME", None)
        return {m.get_attr("NFTA_TABLE_NAME") for m in msgs}

    def chains(self, table: str) -> set[str]:
        """Names of the chains of ``table``."""
        msgs = self._dump(lambda n: n.get_chains(), "NFTA_CHAIN_TABLE", "NFTA_CHAIN_NAME", table)
        return {m.get_attr("NFTA_CHAIN_NAME") for m in msgs}

    def sets(self, table: str) -> set[str]:
        """Names of the sets and maps of ``table`` (no element is read)."""
        msgs = self._dump(lambda n: n.get_sets(), "NFTA_SET_TABLE", "NFTA_SET_NAME", table)
        return {m.get_attr("NFTA_SET_NAME") for m in msgs}

    def rules(self, table: str) -> list[Rule]:
        """Every rule of ``table``, in chain order."""
        msgs = self._dump(lambda n: n.get_rules(), "NFTA_RULE_TABLE", "NFTA_RULE_CHAIN", table)
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

"""Conntrack entries through pyroute2 (ctnetlink), in the calling thread's network namespace."""

from __future__ import annotations

import errno
import socket

from pyroute2 import Conntrack
from pyroute2.conntrack import NFCTAttrTuple

from .links import LinkError, call

__all__ = ["flush_udp_dport"]


def flush_udp_dport(version: int, port: int) -> int:
    """Delete the IPv4 (``version`` 4) or IPv6 entries of UDP flows to destination ``port``.

    A UDP flow that reached the host before the port was published keeps its un-NATed entry,
    so its packets keep missing the DNAT for as long as they keep coming. The dump is filtered
    by the kernel (CTA_FILTER, Linux 5.8+), but it still walks the whole conntrack hash, which
    is shared by all namespaces (~10 ms with 262144 buckets). Returns how many were deleted.
    """
    family = socket.AF_INET if version == 4 else socket.AF_INET6
    wanted = NFCTAttrTuple(family=family, proto=socket.IPPROTO_UDP, dport=port)
    deleted = 0
    with Conntrack(nfgen_family=family) as ct:
        for entry in call(lambda: list(ct.dump_entries(tuple_orig=wanted))):
            try:
                call(ct.delete, entry)
                deleted += 1
            except LinkError as e:
                if e.errno != errno.ENOENT:  # gone meanwhile (expired, or flushed by a peer)
                    raise
    return deleted

"""Traffic control in the calling thread's namespace: tbf, the ingress qdisc, a u32 + mirred redirect.

Token-bucket parameters are computed here exactly as the reference bandwidth plugin computes
them (vishvananda/netlink's tick arithmetic on ``/proc/net/psched``), so a qdisc either plugin
made compares equal. pyroute2's ``tc("add", "tbf", ...)`` derives the buffer itself with another
floating-point order, which is off by one tick for many rates, so tbf qdiscs are sent as a
plain RTM_NEWQDISC with pyroute2's message classes over a netlink socket of our own; the
ingress qdisc and the filter go through pyroute2's ``tc``.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from logging import DEBUG
from typing import Any

import attrs

from . import changes
from .links import IPRoute, LinkError, call

__all__ = ["TBF", "tbf_params", "add_tbf", "get_tbf", "add_ingress_redirect", "ingress_redirect", "delete_qdisc"]

TIME_UNITS_PER_SEC = 1_000_000
LATENCY_USEC = 25_000.0  # the reference's latencyInMillis = 25
ROOT, INGRESS = 0xFFFFFFFF, 0xFFFFFFF1
TBF_HANDLE, INGRESS_HANDLE = 0x10000, 0xFFFF0000
ETH_P_ALL = 0x0003
_U32 = 2**32
_NLMSG_ERROR = 2


@attrs.frozen
class TBF:
    """A tbf qdisc's parameters as the kernel holds them: bytes/s, bytes, ticks."""

    rate: int
    limit: int
    buffer: int


def _tick_in_usec() -> float:
    with open("/proc/net/psched") as f:
        t2us, us2t, clock_res = (int(v, 16) for v in f.read().split()[:3])
    if clock_res == 1_000_000_000:
        t2us = us2t
    return t2us / us2t * (clock_res / TIME_UNITS_PER_SEC)


def tbf_params(rate_bits: int, burst_bits: int) -> TBF:
    """The tbf for ``rate_bits`` bit/s and a ``burst_bits`` bucket; ValueError if the kernel's
    32-bit fields cannot hold it."""
    rate, burst = rate_bits // 8, burst_bits // 8
    if rate <= 0 or burst <= 0:
        raise ValueError("rate and burst must be at least 8 bits")
    if rate >= _U32:
        raise ValueError(f"rate {rate_bits} bit/s is above {(_U32 - 1) * 8} bit/s")
    usec = int(burst * TIME_UNITS_PER_SEC / rate)
    buffer = int(usec * _tick_in_usec())
    if usec >= _U32 or buffer >= _U32:
        raise ValueError(f"burst {burst_bits} bits lasts too long at {rate_bits} bit/s")
    limit = int(rate * LATENCY_USEC / TIME_UNITS_PER_SEC) + burst
    if limit >= _U32:
        raise ValueError(f"burst {burst_bits} bits is too large")
    return TBF(rate, limit, buffer)


def add_tbf(index: int, tbf: TBF) -> None:
    """``tc qdisc add dev <index> root handle 1: tbf`` with exactly these parameters."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    msg = tcmsg()
    msg["index"], msg["handle"], msg["parent"] = index, TBF_HANDLE, ROOT
    parms = {"rate": tbf.rate, "limit": tbf.limit, "buffer": tbf.buffer, "mtu": 0}
    msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", {"attrs": [["TCA_TBF_PARMS", parms]]}]]
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    msg["header"]["sequence_number"] = 1
    msg.encode()
    _send(msg.data)
    if changes.log.isEnabledFor(DEBUG):
        changes.tbf(index, tbf.rate, tbf.limit, tbf.buffer)


def _send(data: bytes) -> None:
    """One request on a fresh rtnetlink socket (of the calling thread's namespace); its ack."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as s:
        s.bind((0, 0))
        s.send(data)
        while True:
            reply = s.recv(65536)
            offset = 0
            while offset + 16 <= len(reply):
                length, kind = struct.unpack_from("=LH", reply, offset)
                if kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", reply, offset + 16)
                    if code:
                        raise LinkError(-code, os.strerror(-code))
                    return
                offset += max(length, 16)


def _tbf_of(msg: Any) -> TBF | None:
    if msg.get_attr("TCA_KIND") != "tbf":
        return None
    options = msg.get_attr("TCA_OPTIONS")
    parms = options.get_attr("TCA_TBF_PARMS") if options is not None else None
    if parms is None:
        return None
    return TBF(parms["rate"], parms["limit"], parms["buffer"])


def get_tbf(ipr: IPRoute, index: int) -> TBF | None:
    """The root tbf qdisc (handle 1:) of a link, if there is one."""
    for msg in _qdiscs(ipr, index):
        if msg["parent"] == ROOT and msg["handle"] == TBF_HANDLE:
            return _tbf_of(msg)
    return None


def _qdiscs(ipr: IPRoute, index: int) -> list[Any]:
    return [m for m in call(ipr.get_qdiscs, index) if m["index"] == index]


def add_ingress_redirect(ipr: IPRoute, index: int, target: int) -> None:
    """The ingress qdisc (ffff:) on ``index`` and a match-all u32 filter (prio 1, classid 1:1)
    whose mirred action redirects every packet to the egress of ``target``; nothing is left if
    the filter cannot be added."""
    call(ipr.tc, "add", "ingress", index, INGRESS_HANDLE)
    try:
        call(
            ipr.tc,
            "add-filter",
            "u32",
            index,
            parent=INGRESS_HANDLE,
            prio=1,
            protocol=ETH_P_ALL,
            target=0x10001,
            keys=["0x0/0x0+0"],
            action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": target},
        )
    except LinkError:
        delete_qdisc(ipr, index, ingress=True)  # ours: made just above
        raise


def ingress_redirect(ipr: IPRoute, index: int) -> int | None:
    """The ifindex the ingress qdisc's mirred filter of ``index`` redirects to (None: none)."""
    if not any(m["handle"] == INGRESS_HANDLE for m in _qdiscs(ipr, index)):
        return None
    filters = list(call(ipr.get_filters, index, parent=INGRESS_HANDLE))
    for f in filters:
        options = f.get_attr("TCA_OPTIONS")
        actions = options.get_attr("TCA_U32_ACT") if options is not None else None
        for act in actions.get("attrs", []) if actions is not None else []:
            body = act[1]
            if body.get_attr("TCA_ACT_KIND") != "mirred":
                continue
            parms = body.get_attr("TCA_ACT_OPTIONS").get_attr("TCA_MIRRED_PARMS")
            if parms is not None:
                ifindex: int = parms["ifindex"]  # pyroute2 is untyped
                return ifindex
    return None


def delete_qdisc(ipr: IPRoute, index: int, *, ingress: bool) -> None:
    """Delete the root tbf (or the ingress qdisc, filters included); a missing one is fine."""
    handle, parent = (INGRESS_HANDLE, INGRESS) if ingress else (TBF_HANDLE, ROOT)
    try:
        call(ipr.tc, "del", index=index, handle=handle, parent=parent)
    except LinkError as e:
        if e.errno not in (errno.ENOENT, errno.EINVAL, errno.ENODEV):
            raise

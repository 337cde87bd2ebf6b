"""The allocator: the reference's ``backend/allocator`` order and errors over any :class:`~.store.Store`.

One IP per range set. A requested IP (``IP=`` in CNI_ARGS, ``args.cni.ips``, ``runtimeConfig.ips``)
is taken from the set that contains it; otherwise the next free address after the set's
``last_reserved_ip``, round-robin through its ranges, never a range's gateway.
"""

from __future__ import annotations

from collections.abc import Iterator

from pycni.errors import CNIError
from pycni.types import IPAddress

from ._errors import fail
from .config import HostLocalConfig, IPRange, RangeSet, parse_ip
from .store import Store, owner_key

__all__ = ["allocate"]


def _range_for(range_set: RangeSet, ip: IPAddress) -> IPRange | None:
    return next((r for r in range_set if r.contains(ip)), None)


def _set_str(range_set: RangeSet) -> str:
    return ",".join(map(str, range_set))


def _candidates(range_set: RangeSet, last: IPAddress | None) -> Iterator[tuple[int, IPRange]]:
    """The reference's round-robin order: after ``last`` (which comes last), else from the first start.

    Ranges are walked in order and cyclically; each range's gateway is skipped.
    """
    if last is None or (current := _range_for(range_set, last)) is None:
        segments = [(r, int(r.start), int(r.end)) for r in range_set]
    else:
        i = range_set.index(current)
        segments = [
            (current, int(last) + 1, int(current.end)),
            *((r, int(r.start), int(r.end)) for r in range_set[i + 1 :] + range_set[:i]),
            (current, int(current.start), int(last)),
        ]
    for r, low, high in segments:
        gateway = int(r.gateway) if r.gateway.version == r.start.version else -1
        for value in range(low, high + 1):
            if value != gateway:
                yield value, r


def _reserve_requested(store: Store, range_set: RangeSet, idx: int, ip: IPAddress, owner: bytes) -> IPRange:
    r = _range_for(range_set, ip)
    if r is None:  # unreachable from ADD (the IP was picked because the set contains it)
        raise fail(f"{ip} not in range set {_set_str(range_set)}")
    if ip == r.gateway:
        raise fail(f"requested ip {ip} is subnet's gateway")
    if not store.reserve(str(ip), owner, idx):
        raise fail(f"requested IP address {ip} is not available in range set {_set_str(range_set)}")
    return r


def _reserve_next(store: Store, range_set: RangeSet, idx: int, owner: bytes) -> tuple[IPAddress, IPRange]:
    hinted: list[tuple[IPAddress, IPRange]] = []
    for value, r in _candidates(range_set, store.last_reserved(idx)):
        ip = type(r.start)(value)
        name = str(ip)
        if store.known_taken(name):
            hinted.append((ip, r))
        elif store.reserve(name, owner, idx):
            return ip, r
    for ip, r in hinted:  # the cache is only a hint: "no addresses" is O_EXCL's verdict alone
        if store.reserve(str(ip), owner, idx):
            return ip, r
    raise fail(f"no IP addresses available in range set: {_set_str(range_set)}")


def allocate(store: Store, conf: HostLocalConfig, container_id: str, ifname: str) -> list[tuple[IPAddress, IPRange]]:
    """One IP per range set, all-or-nothing; the caller holds the store lock."""
    requested = dict.fromkeys(conf.requested_ips)
    owner, _ = owner_key(container_id, ifname)
    owned: list[IPAddress] | None = None  # this attachment's existing leases, read once
    allocated: list[tuple[IPAddress, IPRange]] = []
    try:
        for idx, range_set in enumerate(conf.range_sets):
            want = next((ip for ip in requested if _range_for(range_set, ip)), None)
            try:
                if want is not None:
                    del requested[want]
                    allocated.append((want, _reserve_requested(store, range_set, idx, want, owner)))
                    continue
                if owned is None:
                    current, legacy = store.find(container_id, ifname)
                    owned = [ip for name in sorted(current + legacy) if (ip := parse_ip(name)) is not None]
                dup = next((ip for ip in owned if _range_for(range_set, ip)), None)
                if dup is not None:
                    raise fail(f"{dup} has been allocated to {container_id}, duplicate allocation is not allowed")
                allocated.append(_reserve_next(store, range_set, idx, owner))
            except CNIError as e:
                raise fail(f"failed to allocate for range {idx}: {e.msg}") from None
        if requested:
            raise fail("failed to allocate all requested IPs: " + " ".join(map(str, requested)))
    except CNIError:
        # Exactly what this call reserved: a release by ID (what Go does) would also free the
        # leases an earlier ADD of the same attachment holds.
        for ip, _ in allocated:
            store.unreserve(str(ip))
        raise
    return allocated

"""The lease store the allocator and the plugin work through (the reference's ``backend.Store``).

:class:`~.disk.DiskStore` keeps the reference's on-disk format; :class:`~.fake_store.FakeStore`
keeps the same leases in memory for tests. Both share the rules below, so they cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from pycni.types import IPAddress

from .config import parse_ip

__all__ = ["LAST_RESERVED", "LOCK", "Store", "is_state_file", "owner_key", "release_order", "stale_leases"]

#: ``last_reserved_ip.<range set index>`` holds the last IP handed out from that range set.
LAST_RESERVED = "last_reserved_ip."
#: The empty file every writer (Go or pycni) holds an exclusive ``flock`` on.
LOCK = "lock"


class Store(Protocol):
    """One network's leases. A lease is named by the canonical IP and holds ``<containerID>\\r\\n<ifname>``
    (or, written by old plugins, the bare container ID: a *legacy* lease)."""

    def locked(self) -> AbstractContextManager[Store]:
        """Hold the network's lock; every other method is called inside it."""
        ...

    def reserve(self, ip: str, owner: bytes, range_id: int) -> bool:
        """Take ``ip`` for ``owner`` and record it as range set ``range_id``'s last; False if taken."""
        ...

    def unreserve(self, ip: str) -> None:
        """Drop a lease this operation just reserved (rollback); a missing one is no error."""
        ...

    def last_reserved(self, range_id: int) -> IPAddress | None: ...

    def find(self, container_id: str, ifname: str) -> tuple[list[str], list[str]]:
        """Sorted names of the attachment's leases, and of its container's legacy leases."""
        ...

    def known_taken(self, name: str) -> bool:
        """A hint (after ``find`` under the same lock) that ``name`` is leased; ``reserve`` still decides."""
        ...

    def release(self, container_id: str, ifname: str, passes: int) -> None:
        """Release as ``passes`` consecutive Go ``ReleaseByID`` calls would (see :func:`release_order`)."""
        ...

    def collect(self, valid: set[tuple[str, str]], *, dry_run: bool) -> list[tuple[str, str]]:
        """GC: drop the leases of attachments not in ``valid``; ``(ip, owner)`` of each (see :func:`stale_leases`)."""
        ...


def is_state_file(name: str) -> bool:
    """The lock and ``last_reserved_ip.*`` files: in the network directory, never leases."""
    return name == LOCK or name.startswith(LAST_RESERVED)


def owner_key(container_id: str, ifname: str) -> tuple[bytes, bytes]:
    """What a lease of the attachment holds, and what a legacy lease of its container holds."""
    owner = container_id.strip().encode()
    return owner + b"\r\n" + ifname.encode(), owner


def release_order(current: list[str], legacy: list[str], passes: int) -> list[str]:
    """The leases ``passes`` (>= 1) Go ``ReleaseByID`` calls delete: each deletes the attachment's
    leases, or, when there are none, the legacy bare-id ones, so a second pass also removes legacy."""
    return current + legacy if current and passes > 1 else current or legacy


def stale_leases(leases: Iterable[tuple[str, bytes]], valid: set[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """``(ip, "containerID/ifname")`` of each lease whose attachment is not in ``valid`` (a legacy
    lease: whose container has no valid attachment). Only files named by an IP are leases."""
    ids = {cid for cid, _ in valid}
    for name, data in leases:
        if parse_ip(name) is None:
            continue
        text = data.decode("utf-8", "surrogateescape")
        cid, sep, ifname = text.partition("\r\n")
        if (cid.strip(), ifname.strip()) in valid if sep else cid.strip() in ids:
            continue
        yield name, f"{cid.strip()}/{ifname.strip()}" if sep else f"{cid.strip()} (legacy lease)"

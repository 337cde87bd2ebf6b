"""An in-memory :class:`~.store.Store` for tests (the reference's ``backend/testing`` fake store).

Leases and ``last_reserved_ip`` live in dicts; the release and GC rules are the disk store's own
(:mod:`.store`), so an allocator test against it says what the plugin does on disk.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from pycni.types import IPAddress

from .config import parse_ip
from .store import owner_key, release_order, stale_leases

__all__ = ["FakeStore"]


class FakeStore:
    """``leases`` maps an IP's name to what its file would hold; ``last`` a range set index to an IP.

    ``hints`` are names :meth:`known_taken` reports as leased (default: the real leases), to test
    that the allocator treats the lease cache as a hint only.
    """

    def __init__(
        self,
        leases: Mapping[str, bytes] | None = None,
        last: Mapping[int, str] | None = None,
        *,
        hints: Iterable[str] | None = None,
    ) -> None:
        self.leases: dict[str, bytes] = dict(leases or {})
        self.last: dict[int, str] = dict(last or {})
        self.hints = None if hints is None else set(hints)
        self._lock = threading.Lock()

    @contextmanager
    def locked(self) -> Iterator[FakeStore]:
        with self._lock:
            yield self

    def reserve(self, ip: str, owner: bytes, range_id: int) -> bool:
        if ip in self.leases:
            return False
        self.leases[ip] = owner
        self.last[range_id] = ip
        return True

    def unreserve(self, ip: str) -> None:
        self.leases.pop(ip, None)

    def last_reserved(self, range_id: int) -> IPAddress | None:
        name = self.last.get(range_id)
        return None if name is None else parse_ip(name)

    def find(self, container_id: str, ifname: str) -> tuple[list[str], list[str]]:
        key, owner = owner_key(container_id, ifname)
        current = sorted(name for name, data in self.leases.items() if data == key)
        return current, sorted(name for name, data in self.leases.items() if data == owner)

    def known_taken(self, name: str) -> bool:
        return name in (self.leases if self.hints is None else self.hints)

    def release(self, container_id: str, ifname: str, passes: int) -> None:
        for name in release_order(*self.find(container_id, ifname), passes):
            del self.leases[name]

    def collect(self, valid: set[tuple[str, str]], *, dry_run: bool) -> list[tuple[str, str]]:
        doomed = list(stale_leases(self.leases.items(), valid))
        if not dry_run:
            for name, _ in doomed:
                del self.leases[name]
        return doomed

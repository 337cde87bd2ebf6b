"""What an attachment is, on both sides of the plugin boundary.

- :class:`Attachment` (network, container ID, interface): the unit that owns kernel state and a
  cache entry: the kernel records are keyed by :attr:`Attachment.key`, the results cache by
  ``<network>-<containerID>-<ifname>`` (:func:`.validate.validate_attachment_key`).
- :class:`GCAttachment` (container ID, interface): libcni's ``types.GCAttachment``, an entry of
  GC's ``cni.dev/valid-attachments``: the runtime emits it, a plugin decodes it. It has no
  network because GC runs per network: :meth:`GCAttachment.on` gives the attachment in one.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import attrs

from ..errors import CNIError, ErrorCode

__all__ = ["Attachment", "GCAttachment"]


@attrs.frozen
class Attachment:
    """One (network, container ID, interface) attachment."""

    network: str
    container_id: str
    ifname: str

    @property
    def key(self) -> str:
        """A short file-name- and nft-comment-safe digest of the three."""
        return _key(self.network, self.container_id, self.ifname)


@functools.lru_cache(maxsize=1024)  # one operation asks for its attachment's key a dozen times
def _key(network: str, container_id: str, ifname: str) -> str:
    return hashlib.sha256("\0".join((network, container_id, ifname)).encode()).hexdigest()[:20]


@attrs.frozen
class GCAttachment:
    """A still-valid attachment for GC: ``(containerID, ifname)``."""

    container_id: str
    ifname: str

    def on(self, network: str) -> Attachment:
        return Attachment(network, self.container_id, self.ifname)

    def to_json(self) -> dict[str, str]:
        return {"containerID": self.container_id, "ifname": self.ifname}

    @classmethod
    def from_json(cls, item: Any) -> GCAttachment:
        """A plugin's decoding: ``containerID`` a string; an ``ifname`` that is not one is ""
        (code 999 otherwise, as a plugin reports a config it cannot use)."""
        if not isinstance(item, Mapping) or not isinstance(item.get("containerID"), str):
            raise CNIError(f"invalid cni.dev/valid-attachments entry: {item!r}", code=ErrorCode.INTERNAL)
        ifname = item.get("ifname", "")
        return cls(item["containerID"], ifname if isinstance(ifname, str) else "")

"""The veth pairs bridge and ptp make, and the per-attachment records that say which is whose.

One rule for both (issue 10, items 1 and 5): a failed ADD undoes only what it created;
rollback and DEL remove only what this attachment's record says it created; an interface it
did not create is never deleted. So:

* the record (``<kind>/<attachment key>`` under pycni's state dir: ``{"attachment", "host",
  ...}``) names the host veth before the veth is created; a failed ADD leaves one naming none
  (``"host": null``), so its DEL (a runtime's rollback included) deletes no interface;
* with a record, DEL deletes the recorded host veth while it still is that veth (the kernel
  takes the container end with it, wherever the namespace is) and never a container interface
  by name;
* only a DEL with no record at all (an attachment made by the reference plugin, a lost state
  dir, a repeated DEL) deletes ``CNI_IFNAME`` in the container by name, as the reference does,
  and not when it is the peer of a host veth any bridge or ptp record names;
* an ADD whose attachment's recorded veth is still there (same container ID and ifname, any
  netns) is refused by the plugin before it makes anything (:meth:`VethRecords.live`).
"""

from __future__ import annotations

from typing import Any

import attrs

from pycni import netns

from .._common import fail, netns_gone
from . import links
from .nft import Attachment
from .state import Records

__all__ = ["KINDS", "VethRecords", "delete_container_link"]

#: Every plugin that records its veths: a record-less DEL of one keeps the others' veths too.
KINDS = ("bridge", "ptp")


class VethRecords(Records):
    """One plugin's veth records (see the module docstring); a bridge plugin's also name the
    bridge (``"bridge"``), whose port the veth must be, or of none when the bridge is gone."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"{kind!r} is not one of {KINDS}")
        super().__init__(kind)

    def nothing_created(self, att: Attachment, **extra: Any) -> None:
        """Record that this attachment's ADD made no veth: its DEL deletes no interface."""
        self.store(att.key, {"attachment": attrs.asdict(att), **extra, "host": None})

    def live(self, att: Attachment) -> dict[str, Any] | None:
        """The attachment's record while the veth it names is still there."""
        record = self.load(att.key)
        return record if host_veth(record) is not None else None

    def delete(self, att: Attachment, netns_path: str, ifname: str) -> None:
        """DEL's link part: the recorded host veth, or, with no record, ``ifname`` in the
        container unless another attachment's record names its peer."""
        record = self.load(att.key)
        if isinstance(record, dict):
            try:
                delete_host_veth(record)
            except links.LinkError as e:
                raise fail(f'failed to delete "{record.get("host")}": {e.strerror}') from e
        elif netns_path:
            delete_container_link(netns_path, ifname)

    def collect(self, network: str, keep: set[str], dry: bool, removed: list[str], errors: list[str]) -> None:
        """GC's link part: the veths and records of this network's attachments not in ``keep``
        (attachment keys); a veth no record names is never touched."""
        for name in self.names():
            record = self.load(name)
            if not isinstance(record, dict) or name in keep:
                continue
            att = record.get("attachment") or {}
            if att.get("network") != network:
                continue
            who = f"{att.get('container_id')}/{att.get('ifname')}"
            host = host_veth(record)
            if host is not None:
                on = f" on bridge {record.get('bridge')}" if "bridge" in record else ""
                removed.append(f"host veth {host} of {who}{on}")
                if not dry:
                    try:
                        links.delete_link(host)
                    except links.LinkError as e:
                        errors.append(f"failed to delete {host} of {who}: {e.strerror}")
                        continue
            removed.append(f"pycni state record {self.sub}/{name} of {who}")
            if not dry:
                self.remove(name)


def host_veth(record: Any) -> str | None:
    """The record's host veth if it is still there: a veth of that name, a port of the recorded
    bridge or of none (the bridge was deleted; ptp's are of none), nothing else."""
    host = record.get("host") if isinstance(record, dict) else None
    if not isinstance(host, str):
        return None
    with links.iproute() as ipr:
        link = links.get_link(ipr, host)
    if link is None or link.kind != "veth":
        return None
    bridge = record.get("bridge")
    return host if link.master == 0 or (isinstance(bridge, str) and link.master == links.ifindex(bridge)) else None


def delete_host_veth(record: Any) -> None:
    host = host_veth(record)
    if host is not None:
        links.delete_link(host)


def _get_link(name: str) -> links.Link | None:
    with links.iproute() as ipr:
        return links.get_link(ipr, name)


def _recorded_peer(ctr: links.Link) -> bool:
    """Whether container veth ``ctr`` is the peer of a host veth some bridge or ptp record names
    (O(records): only for a DEL that has no record of its own)."""
    if ctr.kind != "veth" or not ctr.peer_index:
        return False
    with links.iproute() as ipr:
        host = links.get_link(ipr, index=ctr.peer_index)
    if host is None or host.kind != "veth" or host.peer_index != ctr.index:
        return False
    for kind in KINDS:
        records = Records(kind)
        for name in records.names():
            record = records.load(name)
            if isinstance(record, dict) and record.get("host") == host.name:
                return True
    return False


def delete_container_link(netns_path: str, ifname: str) -> None:
    """A record-less DEL's link part (see the module docstring); a namespace that is gone has
    nothing left to delete."""
    try:
        ctr = netns.run_in(netns_path, _get_link, ifname)
        if ctr is not None and not _recorded_peer(ctr):
            netns.run_in(netns_path, links.delete_link, ifname)
    except netns.NetnsError as e:
        if not netns_gone(e):
            raise fail(str(e)) from e
    except links.LinkError as e:
        raise fail(f'failed to delete "{ifname}": {e.strerror}') from e

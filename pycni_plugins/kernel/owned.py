"""The per-attachment records that say which link is whose: bridge's and ptp's veths, the
macvlan, ipvlan and vlan links, the devices host-device moves.

One rule for all (issue 10, items 1 and 5): a failed ADD undoes only what it created;
rollback and DEL remove only what this attachment's record says it created; an interface it
did not create is never deleted (or, for host-device, moved back). For veths (bridge, ptp):

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
  netns) is refused by the plugin before it makes anything (:meth:`LinkRecords.live`).

For container links (macvlan, ipvlan, vlan, host-device) the record (``{"attachment", "link",
...}``) names the link by its container namespace (nsfs inode, and the path it was reached by),
ifindex and MAC:

* it is written before the link is made, naming none (``"link": null``), and names the link
  once it is there (host-device names the device before the move, the kernel keeps its MAC);
  a failed ADD's undo removes what it made and leaves the record naming none;
* with a record, DEL removes (moves back) only the recorded link while it still is that link
  (same namespace, ifindex and MAC), never ``CNI_IFNAME`` by name;
* a DEL with no record (an attachment made by the reference plugin, a lost state dir, a
  repeated DEL) takes ``CNI_IFNAME`` in the container, as the reference does, unless any
  record of any kind names it;
* GC (:meth:`LinkRecords.collect`) takes, for each record of the network's attachments not in
  ``cni.dev/valid-attachments``, what that attachment's DEL would: the recorded link while the
  recorded path still opens the recorded namespace and it still holds that link (ifindex and
  MAC), then the record. A namespace that is gone leaves nothing to take (the kernel destroyed
  a virtual link with it and gave a physical device to the initial namespace); a record
  written before the path was recorded can only be removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs

from pycni import netns
from pycni.errors import CNIError
from pycni.sdk import Attachment

from . import links
from .errors import fail, netns_gone
from .state import Records

__all__ = ["KINDS", "VETH_KINDS", "LINK_KINDS", "Release", "LinkRecords", "delete_container_link"]

#: The plugins that record a host veth (``"host"``) and those that record a container link
#: (``"link"``): a record-less DEL of any keeps the links all the others' records name.
VETH_KINDS = ("bridge", "ptp")
LINK_KINDS = ("macvlan", "ipvlan", "vlan", "host-device")
KINDS = VETH_KINDS + LINK_KINDS
#: What GC does with a stale attachment's container link: ``release(netns_fd, link, record)``.
Release = Callable[[int, links.Link, dict[str, Any]], None]


class LinkRecords(Records):
    """One plugin's link records (see the module docstring); a bridge plugin's also name the
    bridge (``"bridge"``), whose port the veth must be, or of none when the bridge is gone."""

    def __init__(self, kind: str, root: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"{kind!r} is not one of {KINDS}")
        super().__init__(kind, root)
        self.field = "host" if kind in VETH_KINDS else "link"

    def nothing_created(self, att: Attachment, **extra: Any) -> None:
        """Record that this attachment's ADD made no link: its DEL deletes no interface."""
        self.store(att.key, {"attachment": attrs.asdict(att), **extra, self.field: None})

    def begin(self, att: Attachment, netns_path: str, ifname: str) -> None:
        """The start of a container link's ADD: refused while the attachment's recorded link is
        there (same container ID and ifname, same netns); otherwise from here on a failure
        leaves a record naming no link, so its DEL (a rollback included) takes none."""
        if isinstance(self.load(att.key), dict) and self.container_link(att, netns_path, ifname) is not None:
            raise fail(
                f"attachment {att.container_id}/{att.ifname} of network {att.network} already exists "
                f'("{ifname}" in {netns_path}): DEL it first'
            )
        self.nothing_created(att)

    def made(self, att: Attachment, ns: int, path: str, link: links.Link, **extra: Any) -> None:
        """Record container link ``link`` of namespace ``ns`` (an open fd; reached by ``path``,
        which GC opens again) as this attachment's."""
        named = {"netns": _ns_id(ns), "path": path, "index": link.index, "mac": link.mac}
        self.store(att.key, {"attachment": attrs.asdict(att), **extra, "link": named})

    def container_link(self, att: Attachment, netns_path: str, ifname: str) -> links.Link | None:
        """The container link DEL may take: the recorded one while it still is that link, or,
        with no record, ``ifname`` unless some record names it; None when the namespace is gone."""
        record = self.load(att.key)
        try:
            if isinstance(record, dict):
                named = record.get("link")
                ns = _ns_id(netns_path)
                if not isinstance(named, dict) or ns is None or named.get("netns") != ns:
                    return None
                link = netns.run_in(netns_path, _get_index, named.get("index"))
                return link if link is not None and link.mac == named.get("mac") else None
            ctr = netns.run_in(netns_path, _get_link, ifname)
            return ctr if ctr is not None and not _claimed(netns_path, ctr, self.root) else None
        except netns.NetnsError as e:
            if netns_gone(e):
                return None
            raise fail(str(e)) from e

    def begin_veth(self, att: Attachment, undo: list[Callable[[], Any]], **extra: Any) -> None:
        """The start of a veth plugin's ADD: refused while another ADD of the attachment is alive
        (the veth its record names is there) — anything done here would take its record,
        elements and lease over, and undoing it would free them; otherwise from here on a
        failure (``undo``) leaves a record naming no veth, so its DEL deletes no interface."""
        previous = self.load(att.key)
        if isinstance(previous, dict) and host_veth(previous) is not None:
            bridge = f' on bridge "{previous.get("bridge")}"' if "bridge" in extra else ""
            raise fail(
                f"attachment {att.container_id}/{att.ifname} of network {att.network} already exists "
                f'(host veth "{previous["host"]}"{bridge}): DEL it first'
            )
        undo.append(lambda: self.nothing_created(att, **extra))

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
            delete_container_link(netns_path, ifname, self.root)

    def collect(
        self,
        network: str,
        keep: set[str],
        dry: bool,
        removed: list[str],
        errors: list[str],
        release: Release | None = None,
    ) -> None:
        """GC's link part: the links and records of this network's attachments not in ``keep``
        (attachment keys). A veth record's host veth is deleted; a container link record's link,
        while it is still there (see the module docstring), goes to ``release`` (the plugin's
        DEL of it). A link no record names is never touched; a record whose link could not be
        taken stays (a later GC tries again)."""
        for name in self.names():
            record = self.load(name)
            if not isinstance(record, dict) or name in keep:
                continue
            att = record.get("attachment") or {}
            if att.get("network") != network:
                continue
            who = f"{att.get('container_id')}/{att.get('ifname')}"
            try:
                if self.field == "host":
                    self._collect_veth(record, who, dry, removed)
                elif release is not None:
                    self._collect_link(record, who, dry, removed, release)
            except (CNIError, links.LinkError) as e:
                reason = e.msg if isinstance(e, CNIError) else e.strerror
                errors.append(f"failed to collect the {self.sub} link of {who}: {reason}")
                continue
            removed.append(f"pycni state record {self.sub}/{name} of {who}")
            if not dry:
                self.remove(name)

    @staticmethod
    def _collect_veth(record: dict[str, Any], who: str, dry: bool, removed: list[str]) -> None:
        host = host_veth(record)
        if host is not None:
            on = f" on bridge {record.get('bridge')}" if "bridge" in record else ""
            removed.append(f"host veth {host} of {who}{on}")
            if not dry:
                links.delete_link(host)

    def _collect_link(self, record: dict[str, Any], who: str, dry: bool, removed: list[str], release: Release) -> None:
        named = record.get("link")
        path = named.get("path") if isinstance(named, dict) else None
        if not isinstance(named, dict) or not isinstance(path, str) or not path:
            return
        try:
            fd = netns.open_netns(path)
        except netns.NetnsError as e:
            if netns_gone(e):
                return
            raise
        try:
            if os.fstat(fd).st_ino != named.get("netns"):
                return  # the path names another namespace now
            link = netns.run_in(fd, _get_index, named.get("index"))
            if link is None or link.mac != named.get("mac"):
                return
            removed.append(f"{self.sub} link {link.name} of {who} in {path}")
            if not dry:
                release(fd, link, record)
        finally:
            os.close(fd)


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


def _ns_id(ns: int | str) -> int | None:
    """A namespace's identity for a record: its nsfs inode (None: the path is gone)."""
    try:
        return os.fstat(ns).st_ino if isinstance(ns, int) else os.stat(ns).st_ino
    except OSError:
        return None


def _get_link(name: str) -> links.Link | None:
    with links.iproute() as ipr:
        return links.get_link(ipr, name)


def _get_index(index: Any) -> links.Link | None:
    if not isinstance(index, int):
        return None
    with links.iproute() as ipr:
        return links.get_link(ipr, index=index)


def _records(root: str) -> list[dict[str, Any]]:
    out = []
    for kind in KINDS:
        records = Records(kind, root)
        for name in records.names():
            record = records.load(name)
            if isinstance(record, dict):
                out.append(record)
    return out


def _recorded_peer(ctr: links.Link, root: str) -> bool:
    """Whether container veth ``ctr`` is the peer of a host veth some bridge or ptp record names."""
    if ctr.kind != "veth" or not ctr.peer_index:
        return False
    with links.iproute() as ipr:
        host = links.get_link(ipr, index=ctr.peer_index)
    if host is None or host.kind != "veth" or host.peer_index != ctr.index:
        return False
    return any(record.get("host") == host.name for record in _records(root))


def _claimed(netns_path: str, ctr: links.Link, root: str) -> bool:
    """Whether some record under state dir ``root`` names container link ``ctr`` (O(records):
    only for a DEL that has no record of its own)."""
    ns = _ns_id(netns_path)
    for record in _records(root):
        named = record.get("link")
        if isinstance(named, dict) and (named.get("netns"), named.get("index"), named.get("mac")) == (
            ns,
            ctr.index,
            ctr.mac,
        ):
            return True
    return _recorded_peer(ctr, root)  # its host end is in the calling thread's namespace


def delete_container_link(netns_path: str, ifname: str, state_dir: str) -> None:
    """A record-less DEL's link part (see the module docstring); a namespace that is gone has
    nothing left to delete."""
    try:
        ctr = netns.run_in(netns_path, _get_link, ifname)
        if ctr is not None and not _claimed(netns_path, ctr, state_dir):
            netns.run_in(netns_path, links.delete_link, ifname)
    except netns.NetnsError as e:
        if not netns_gone(e):
            raise fail(str(e)) from e
    except links.LinkError as e:
        raise fail(f'failed to delete "{ifname}": {e.strerror}') from e

"""The per-attachment records that say which link is whose: bridge's and ptp's veths, the
macvlan, ipvlan and vlan links, the devices host-device moves.

One rule for all: a failed ADD undoes only what it created; rollback and DEL remove only what
this attachment's record says it created; an interface it did not create is never deleted (or,
for host-device, moved back). For veths (bridge, ptp; :class:`VethRecord`):

* the record (``<kind>/<attachment key>`` under pycni's state dir) names the host veth before
  the veth is created; a failed ADD leaves one naming none (``"host": null``), so its DEL (a
  runtime's rollback included) deletes no interface;
* with a record, DEL deletes the recorded host veth while it still is that veth (the kernel
  takes the container end with it, wherever the namespace is) and never a container interface
  by name;
* only a DEL with no record at all (an attachment made by the reference plugin, a lost state
  dir, a repeated DEL) deletes ``CNI_IFNAME`` in the container by name, as the reference does,
  and not when it is the peer of a host veth any bridge or ptp record names;
* an ADD whose attachment's recorded veth is still there (same container ID and ifname, any
  netns) is refused before it makes anything (:meth:`VethRecords.begin`).

For container links (macvlan, ipvlan, vlan, host-device; :class:`LinkRecord`) the record names
the link by its container namespace (nsfs inode, and the path it was reached by), ifindex and
MAC:

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

Records are read leniently (a field of the wrong type reads as absent): a file that is not a
JSON object is no record; what the classes write is what earlier versions wrote.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import attrs

from pycni import netns
from pycni.errors import CNIError
from pycni.sdk import Attachment

from . import links
from .errors import fail, failing, netns_gone
from .state import Records

__all__ = [
    "KINDS",
    "VETH_KINDS",
    "LINK_KINDS",
    "Release",
    "VethRecord",
    "NamedLink",
    "MovedDevice",
    "LinkRecord",
    "VethRecords",
    "LinkRecords",
    "delete_container_link",
]

#: The plugins that record a host veth and those that record a container link: a record-less
#: DEL of any keeps the links all the others' records name.
VETH_KINDS = ("bridge", "ptp")
LINK_KINDS = ("macvlan", "ipvlan", "vlan", "host-device")
KINDS = VETH_KINDS + LINK_KINDS


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _attachment(data: Any) -> Attachment:
    """A field that is not a string reads as "": no network is named so, GC passes it by."""
    data = data if isinstance(data, dict) else {}
    return Attachment(*(_str(data.get(f)) or "" for f in ("network", "container_id", "ifname")))


@attrs.frozen
class VethRecord:
    """A bridge or ptp attachment's record: the host veth it made (None: none yet, or a failed
    ADD undid it) and, for bridge, the bridge the veth is a port of and the MAC the bridge had
    (so that a bridge someone deleted comes back with it)."""

    attachment: Attachment
    host: str | None = None
    bridge: str | None = None
    bridge_mac: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attachment": attrs.asdict(self.attachment)}
        if self.bridge is not None:
            out["bridge"] = self.bridge
        if self.bridge_mac is not None:
            out["bridge_mac"] = self.bridge_mac
        out["host"] = self.host
        return out

    @classmethod
    def from_json(cls, data: Any) -> VethRecord | None:
        if not isinstance(data, dict):
            return None
        get = data.get
        return cls(_attachment(get("attachment")), _str(get("host")), _str(get("bridge")), _str(get("bridge_mac")))


@attrs.frozen
class NamedLink:
    """A container link as its record names it."""

    netns: int  # the namespace's nsfs inode
    index: int
    mac: str
    path: str = ""  # the path the namespace was reached by ("" in records older than GC)

    def to_json(self) -> dict[str, Any]:
        return {"netns": self.netns, "path": self.path, "index": self.index, "mac": self.mac}

    @classmethod
    def from_json(cls, data: Any) -> NamedLink | None:
        if not isinstance(data, dict):
            return None
        ns, index, mac = _int(data.get("netns")), _int(data.get("index")), _str(data.get("mac"))
        if ns is None or index is None or mac is None:
            return None
        return cls(ns, index, mac, _str(data.get("path")) or "")


@attrs.frozen
class MovedDevice:
    """What host-device gives back with a device: its host name (None: the alias the move set),
    its host addresses and whether it was up."""

    device: str | None
    addresses: tuple[str, ...] = ()
    up: bool = False


@attrs.frozen
class LinkRecord:
    """A container link plugin's attachment record: the link (None: none yet, or a failed ADD
    undid it) and, for host-device, what giving the device back restores."""

    attachment: Attachment
    link: NamedLink | None = None
    moved: MovedDevice | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attachment": attrs.asdict(self.attachment)}
        if self.moved is not None:
            out.update(device=self.moved.device, addresses=list(self.moved.addresses), up=self.moved.up)
        out["link"] = None if self.link is None else self.link.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any) -> LinkRecord | None:
        if not isinstance(data, dict):
            return None
        moved = None
        if "device" in data:
            addresses = data.get("addresses")
            listed = tuple(a for a in addresses if isinstance(a, str)) if isinstance(addresses, list) else ()
            moved = MovedDevice(_str(data["device"]), listed, bool(data.get("up")))
        return cls(_attachment(data.get("attachment")), NamedLink.from_json(data.get("link")), moved)


class _Record(Protocol):
    @property
    def attachment(self) -> Attachment: ...
    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=_Record)
#: What GC does with a stale attachment's container link: ``release(netns_fd, link, record)``.
Release = Callable[[int, links.Link, LinkRecord], None]


class _Owned(Records, Generic[R], abc.ABC):
    """One plugin's records of type ``R``, keyed by attachment key."""

    kinds: tuple[str, ...] = ()

    def __init__(self, kind: str, root: str) -> None:
        if kind not in self.kinds:
            raise ValueError(f"{kind!r} is not one of {self.kinds}")
        super().__init__(kind, root)

    @abc.abstractmethod
    def _decode(self, data: Any) -> R | None: ...

    def record(self, key: str) -> R | None:
        return self._decode(self.load(key))

    def records(self) -> list[R]:
        return [r for r in map(self.record, self.names()) if r is not None]

    def put(self, record: R) -> None:
        self.store(record.attachment.key, record.to_json())

    def _collect(
        self,
        network: str,
        keep: set[str],
        dry: bool,
        removed: list[str],
        errors: list[str],
        take: Callable[[R, str], None],
    ) -> None:
        """GC's link part: for each record of this network's attachments not in ``keep``
        (attachment keys), ``take(record, who)`` its link, then drop the record. A link no record
        names is never touched; a record whose link could not be taken stays (a later GC tries
        again)."""
        for name in self.names():
            record = self.record(name)
            if record is None or name in keep or record.attachment.network != network:
                continue
            who = f"{record.attachment.container_id}/{record.attachment.ifname}"
            try:
                take(record, who)
            except (CNIError, links.LinkError) as e:
                reason = e.msg if isinstance(e, CNIError) else e.strerror
                errors.append(f"failed to collect the {self.sub} link of {who}: {reason}")
                continue
            removed.append(f"pycni state record {self.sub}/{name} of {who}")
            if not dry:
                self.remove(name)


class VethRecords(_Owned[VethRecord]):
    """bridge's or ptp's records (see the module docstring)."""

    kinds = VETH_KINDS

    def _decode(self, data: Any) -> VethRecord | None:
        return VethRecord.from_json(data)

    def begin(self, record: VethRecord, undo: list[Callable[[], Any]]) -> None:
        """The start of an ADD (``record``: the attachment's, naming no veth): refused while
        another ADD of the attachment is alive (the veth its record names is there) — anything
        done here would take its record, elements and lease over, and undoing it would free
        them; otherwise from here on a failure (``undo``) leaves ``record``, so its DEL deletes
        no interface."""
        att = record.attachment
        previous = self.record(att.key)
        if previous is not None and host_veth(previous) is not None:
            bridge = f' on bridge "{previous.bridge}"' if record.bridge is not None else ""
            raise fail(
                f"attachment {att.container_id}/{att.ifname} of network {att.network} already exists "
                f'(host veth "{previous.host}"{bridge}): DEL it first'
            )
        undo.append(lambda: self.put(record))

    def delete(self, att: Attachment, netns_path: str, ifname: str) -> None:
        """DEL's link part: the recorded host veth, or, with no record, ``ifname`` in the
        container unless another attachment's record names its peer."""
        record = self.record(att.key)
        if record is not None:
            with failing(f'failed to delete "{record.host}"'):
                host = host_veth(record)
                if host is not None:
                    links.delete_link(host)
        elif netns_path:
            delete_container_link(netns_path, ifname, self.root)

    def collect(self, network: str, keep: set[str], dry: bool, removed: list[str], errors: list[str]) -> None:
        """GC's link part (:meth:`_Owned._collect`): a stale record's host veth is deleted."""

        def take(record: VethRecord, who: str) -> None:
            host = host_veth(record)
            if host is not None:
                on = f" on bridge {record.bridge}" if record.bridge is not None else ""
                removed.append(f"host veth {host} of {who}{on}")
                if not dry:
                    links.delete_link(host)

        self._collect(network, keep, dry, removed, errors, take)


class LinkRecords(_Owned[LinkRecord]):
    """The records of macvlan, ipvlan, vlan or host-device (see the module docstring)."""

    kinds = LINK_KINDS

    def _decode(self, data: Any) -> LinkRecord | None:
        return LinkRecord.from_json(data)

    def nothing_created(self, att: Attachment) -> None:
        """Record that this attachment's ADD made no link: its DEL takes none."""
        self.put(LinkRecord(att))

    def begin(self, att: Attachment, netns_path: str, ifname: str) -> None:
        """The start of an ADD: refused while the attachment's recorded link is there (same
        container ID and ifname, same netns); otherwise from here on a failure leaves a record
        naming no link, so its DEL (a rollback included) takes none."""
        if self.record(att.key) is not None and self.container_link(att, netns_path, ifname) is not None:
            raise fail(
                f"attachment {att.container_id}/{att.ifname} of network {att.network} already exists "
                f'("{ifname}" in {netns_path}): DEL it first'
            )
        self.nothing_created(att)

    def made(self, att: Attachment, ns: int, path: str, link: links.Link, moved: MovedDevice | None = None) -> None:
        """Record container link ``link`` of namespace ``ns`` (an open fd; reached by ``path``,
        which GC opens again) as this attachment's."""
        self.put(LinkRecord(att, NamedLink(os.fstat(ns).st_ino, link.index, link.mac, path), moved))

    def container_link(self, att: Attachment, netns_path: str, ifname: str) -> links.Link | None:
        """The container link DEL may take: the recorded one while it still is that link, or,
        with no record, ``ifname`` unless some record names it; None when the namespace is gone."""
        record = self.record(att.key)
        try:
            if record is not None:
                named = record.link
                if named is None or named.netns != _ns_id(netns_path):
                    return None
                link = netns.run_in(netns_path, _get_index, named.index)
                return link if link is not None and link.mac == named.mac else None
            ctr = netns.run_in(netns_path, _get_link, ifname)
            return ctr if ctr is not None and not _claimed(netns_path, ctr, self.root) else None
        except netns.NetnsError as e:
            if netns_gone(e):
                return None
            raise fail(str(e)) from e

    def collect(
        self, network: str, keep: set[str], dry: bool, removed: list[str], errors: list[str], release: Release
    ) -> None:
        """GC's link part (:meth:`_Owned._collect`): a stale record's link, while it is still
        there (see the module docstring), goes to ``release`` (the plugin's DEL of it)."""

        def take(record: LinkRecord, who: str) -> None:
            named = record.link
            if named is None or not named.path:
                return
            try:
                fd = netns.open_netns(named.path)
            except netns.NetnsError as e:
                if netns_gone(e):
                    return
                raise
            try:
                if os.fstat(fd).st_ino != named.netns:
                    return  # the path names another namespace now
                link = netns.run_in(fd, _get_index, named.index)
                if link is None or link.mac != named.mac:
                    return
                removed.append(f"{self.sub} link {link.name} of {who} in {named.path}")
                if not dry:
                    release(fd, link, record)
            finally:
                os.close(fd)

        self._collect(network, keep, dry, removed, errors, take)


def host_veth(record: VethRecord) -> str | None:
    """The record's host veth if it is still there: a veth of that name, a port of the recorded
    bridge or of none (the bridge was deleted; ptp's are of none), nothing else."""
    if record.host is None:
        return None
    link = links.fetch_link(record.host)
    if link is None or link.kind != "veth":
        return None
    bridge = record.bridge
    return record.host if link.master == 0 or (bridge is not None and link.master == links.ifindex(bridge)) else None


def _ns_id(path: str) -> int | None:
    """A namespace's identity for a record: its nsfs inode (None: the path is gone)."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _get_link(name: str) -> links.Link | None:
    with links.iproute() as ipr:
        return links.get_link(ipr, name)


def _get_index(index: int) -> links.Link | None:
    with links.iproute() as ipr:
        return links.get_link(ipr, index=index)


def _recorded_peer(ctr: links.Link, root: str) -> bool:
    """Whether container veth ``ctr`` is the peer of a host veth some bridge or ptp record names."""
    if ctr.kind != "veth" or not ctr.peer_index:
        return False
    with links.iproute() as ipr:
        host = links.get_link(ipr, index=ctr.peer_index)
    if host is None or host.kind != "veth" or host.peer_index != ctr.index:
        return False
    return any(r.host == host.name for kind in VETH_KINDS for r in VethRecords(kind, root).records())


def _claimed(netns_path: str, ctr: links.Link, root: str) -> bool:
    """Whether some record under state dir ``root`` names container link ``ctr`` (O(records):
    only for a DEL that has no record of its own)."""
    ns = _ns_id(netns_path)
    for kind in LINK_KINDS:
        for record in LinkRecords(kind, root).records():
            named = record.link
            if named is not None and (named.netns, named.index, named.mac) == (ns, ctr.index, ctr.mac):
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

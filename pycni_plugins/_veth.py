"""What bridge and ptp share: a veth pair per attachment, its host end recorded.

ADD (:func:`add`) runs with the container's namespace open and one netlink socket; each step
registers its undo, and a failed ADD runs them in reverse, so it leaves only what a DEL would
clean: the attachment's record naming no veth (:class:`.kernel.owned.VethRecord`). The veth
(:meth:`VethAdd.create`) is recorded before it is made, and masquerading
(:meth:`VethAdd.masquerade`) goes through pycni's nftables table. DEL (:func:`delete`) removes
the recorded host veth, the attachment's nftables elements, its addresses (IPAM DEL), then its
record; GC (:func:`gc`) does the same for the network's attachments not in
``cni.dev/valid-attachments``, then runs the IPAM plugin's GC.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from pycni.sdk import Attachment, GCReport, PluginRequest, delegate
from pycni.types import Interface, IPConfig, Result

from ._common import attachment, dry_run, emit, fail, finish_gc, open_container, prev_result, valid_attachments
from .kernel import ifconfig, layout, links, nft, owned, sysctl

__all__ = [
    "VethAdd",
    "add",
    "check_masquerade",
    "enable_forwarding",
    "check_start",
    "check_container",
    "delete",
    "gc",
    "status",
]

VETH_RETRIES = 10


@attrs.frozen
class VethAdd:
    """One ADD in progress: the container's namespace (``fd``), the netlink socket, the undo
    steps, the plugin's records and the attachment's as it stands before the veth exists."""

    request: PluginRequest
    ipr: Any
    fd: int
    undo: list[Callable[[], Any]]
    records: owned.VethRecords
    record: owned.VethRecord

    def create(
        self,
        container_mac: str,
        mtu: int,
        master: int | None = None,
        *,
        bridge_mac: str | None = None,
        after_record: Callable[[], None] | None = None,
    ) -> tuple[str, str]:
        """A veth whose container end is ``CNI_IFNAME`` in the container, its host end a random
        name (another one on a clash) with a random MAC; returns the host end's name and MAC.
        The record names each name before it is tried (``after_record`` runs after the first),
        so that a crash right after leaves no veth nobody can map."""
        request = self.request
        host_mac = links.random_mac()
        for attempt in range(VETH_RETRIES):
            host_name = links.random_veth_name()
            self.records.put(attrs.evolve(self.record, host=host_name, bridge_mac=bridge_mac))
            if attempt == 0 and after_record is not None:
                after_record()
            try:
                links.add_veth(
                    host_name,
                    host_mac,
                    peer_name=request.ifname,
                    peer_netns_fd=self.fd,
                    peer_mac=container_mac,
                    mtu=mtu,
                    master=master,
                )
                break
            except links.LinkError as e:
                if e.errno != errno.EEXIST:
                    raise fail(f"failed to make veth pair: {e.strerror}") from e
                if links.ifindex(host_name) is None:
                    raise fail(
                        f'container veth name ("{request.ifname}") peer provided ("{host_name}") already exists'
                    ) from e
        else:
            raise fail(f"failed to find a free veth name after {VETH_RETRIES} attempts")
        self.undo.append(lambda: links.delete_link(host_name))
        return host_name, host_mac

    def masquerade(self, ips: Sequence[IPConfig]) -> None:
        """Masquerade traffic from the container's addresses (undone if the ADD fails)."""
        att = self.record.attachment
        state_dir = self.request.state_dir
        self.undo.append(lambda: nft.release("masq", att, state_dir=state_dir))
        try:
            nft.apply(
                "masq", att, [layout.masq_element(ip.address) for ip in ips], _masq_sections(ips), state_dir=state_dir
            )
        except nft.NftError as e:
            raise fail(f"failed to setup IP masquerade: {e.msg}", e.details) from e


def add(
    request: PluginRequest, kind: str, record: owned.VethRecord, body: Callable[[VethAdd], Result]
) -> dict[str, Any]:
    """An ADD of plugin ``kind``: ``body`` runs with a :class:`VethAdd` once the attachment is
    known not to be alive (:meth:`.kernel.owned.VethRecords.begin`; ``record`` names no veth);
    if anything fails, the undo steps registered run in reverse (each failure suppressed)."""
    fd = open_container(request)
    undo: list[Callable[[], Any]] = []
    records = owned.VethRecords(kind, request.state_dir)
    try:
        with links.iproute() as ipr:
            records.begin(record, undo)
            result = body(VethAdd(request, ipr, fd, undo, records, record))
    except BaseException as e:
        for step in reversed(undo):
            with contextlib.suppress(Exception):
                step()
        if isinstance(e, links.LinkError):
            raise fail(str(e)) from e
        raise
    finally:
        os.close(fd)
    return emit(result, request)


def _masq_sections(ips: Iterable[IPConfig]) -> list[nft.Section]:
    return [layout.MASQ, *{layout.masq_subnet(ip.address.network) for ip in ips}]


def check_masquerade(request: PluginRequest, ips: Sequence[IPConfig]) -> None:
    """CHECK of :meth:`VethAdd.masquerade`: the elements and the rules they need."""
    problem = nft.check(attachment(request), [layout.masq_element(ip.address) for ip in ips], _masq_sections(ips))
    if problem:
        raise fail(f"ipMasq: {problem}", nft.hinted(request.network_name, about=problem))


def enable_forwarding(versions: Iterable[int], failure: str) -> None:
    """Forwarding on for each IP version in ``versions``; ``failure`` starts the error."""
    for version in sorted(set(versions)):
        name = "net/ipv4/ip_forward" if version == 4 else "net/ipv6/conf/all/forwarding"
        try:
            sysctl.ensure(name, 1)
        except OSError as e:
            raise fail(f"{failure}: {e.strerror}") from e


def check_start(request: PluginRequest, ipam_type: str, missing_prev: str) -> Result:
    """CHECK's first steps, as the reference's: the namespace opens, IPAM CHECK passes; returns
    the prevResult (an error ``missing_prev`` without one)."""
    os.close(open_container(request))
    delegate(request, ipam_type, "CHECK")
    prev = prev_result(request)
    if prev is None:
        raise fail(missing_prev)
    return prev


def check_container(
    iface: Interface, ifname: str, prev: Result, missing: str, kind: str, prefix: str = ""
) -> links.Link:
    """CHECK inside the container (run there): the prevResult's interface ``iface`` is a veth
    with its MAC, and ``ifname`` has the prevResult's addresses and routes. The texts are each
    reference's: ``missing`` when there is no such link, ``kind`` the type it must be,
    ``prefix`` starts the MAC one."""
    with links.iproute() as ipr:
        link = links.get_link(ipr, iface.name)
        if link is None:
            raise fail(missing)
        if link.kind != "veth":
            raise fail(f"Error: Container interface {link.name} not of type {kind}")
        if iface.mac and iface.mac.lower() != link.mac:
            raise fail(f"{prefix}Interface {link.name} Mac {iface.mac} doesn't match container Mac: {link.mac}")
        ifconfig.check_on_link(ipr, link.index, ifname, prev)
        return link


def _nothing() -> None:
    pass


def delete(
    request: PluginRequest,
    kind: str,
    ipam_type: str,
    owners: Iterable[str],
    *,
    after_link: Callable[[], None] = _nothing,
    after_nft: Callable[[], None] = _nothing,
    after_ipam: Callable[[], None] = _nothing,
) -> None:
    """DEL of plugin ``kind``: only what the attachment's record says it made (a failed ADD's
    record names no veth, and an eth0 it did not make is kept), then the elements of nftables
    ``owners``, then IPAM DEL, then the record. The ``after_*`` hooks run between the steps."""
    att = attachment(request)
    records = owned.VethRecords(kind, request.state_dir)
    records.delete(att, request.netns, request.ifname)
    after_link()
    # nftables state first: it comes from the attachment's records, needs neither the netns nor
    # the link, and must not stay behind when IPAM DEL fails.
    for owner in owners:
        nft.release(owner, att, state_dir=request.state_dir)
    after_nft()
    if ipam_type:
        delegate(request, ipam_type, "DEL")
        after_ipam()
    records.remove(att.key)


def gc(
    request: PluginRequest, kind: str, ipam_type: str, collect_nft: Callable[[set[tuple[str, str]], bool], list[str]]
) -> GCReport:
    """GC of plugin ``kind``, for the attachments of the network not in
    ``cni.dev/valid-attachments``: their host veths and records
    (:meth:`.kernel.owned.VethRecords.collect`), their nftables elements
    (``collect_nft(valid, dry_run)``), then the IPAM plugin's GC. Every step runs; their
    failures are raised together, with what was removed as details. ``pycni.dev/dry-run`` only
    reports."""
    valid = valid_attachments(request)
    dry = dry_run(request)
    network = request.network_name
    removed: list[str] = []
    errors: list[str] = []
    keep = {Attachment(network, cid, ifname).key for cid, ifname in valid}
    owned.VethRecords(kind, request.state_dir).collect(network, keep, dry, removed, errors)
    try:
        removed += collect_nft(valid, dry)
    except nft.NftError as e:
        errors.append(f"failed to collect nftables elements: {e.msg}")
    return finish_gc(request, ipam_type, removed, errors)


def status(request: PluginRequest, ipam_type: str) -> None:
    """STATUS is the IPAM plugin's."""
    if ipam_type:
        delegate(request, ipam_type, "STATUS")

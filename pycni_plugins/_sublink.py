"""What the plugins that hand the container a whole interface share: macvlan, ipvlan and vlan
(a link made on a master), host-device (configuring, CHECK and GC of a moved device) and vrf
(the drivers a kernel may lack).

A sub-link is created with a temporary name directly in the container's namespace (or, with
``linkInContainer``, in it from a master that lives there), renamed to ``CNI_IFNAME`` there and
deleted again if anything later fails; addresses come from the IPAM plugin (all on interface
0) and are applied as the reference's ``ConfigureIface`` does. DEL runs the IPAM plugin's DEL,
then deletes the link its attachment's record names (:mod:`.kernel.owned`: never another
attachment's ``CNI_IFNAME``; without a record, ``CNI_IFNAME`` as the reference does); a
namespace that is gone means nothing is left to delete. GC (spec 1.1; v1.9.1 has none) does
the same for every attachment of the network not in ``cni.dev/valid-attachments`` (its
recorded link, if its namespace still holds it, and its record), then runs the IPAM plugin's GC.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Mapping
from typing import Any

import attrs

from pycni import netns
from pycni.errors import CNIError
from pycni.sdk import Attachment, GCReport, PluginRequest, delegate
from pycni.types import DNS, Interface, IPConfig, Result

from ._common import (
    Fields,
    attachment,
    dry_run,
    emit,
    fail,
    failing,
    finish_gc,
    in_netns,
    ipam_result,
    netns_gone,
    open_container,
    prev_result,
    valid_attachments,
)
from .kernel import ifconfig, links, owned, sysctl

__all__ = [
    "Master",
    "lookup_master",
    "begin",
    "add",
    "configure",
    "delete",
    "gc",
    "check",
    "config_dns",
    "DRIVERS",
]

#: kind -> the kernel option whose absence makes RTM_NEWLINK fail with EOPNOTSUPP
DRIVERS = {"macvlan": "CONFIG_MACVLAN", "ipvlan": "CONFIG_IPVLAN", "vlan": "CONFIG_VLAN_8021Q", "vrf": "CONFIG_NET_VRF"}


@attrs.frozen
class Master:
    link: links.Link
    in_container: bool


def _find(name: str) -> links.Link | None:
    with links.iproute() as ipr:
        return links.get_link(ipr, name)


def _default_route_link() -> links.Link | None:
    with links.iproute() as ipr:
        return ifconfig.default_route_link(ipr)


def lookup_master(request: PluginRequest, name: str, in_container: bool) -> Master:
    """The master by name or, when ``name`` is empty, the link of the default route, in the
    host namespace or (``linkInContainer``) the container's."""
    where: str | None = request.netns if in_container else None
    if not name:
        link = in_netns(where, _default_route_link) if where else _default_route_link()
        if link is None:
            raise fail("no default route interface found")
        return Master(link, in_container)
    link = in_netns(where, _find, name) if where else _find(name)
    if link is None:
        place = "the container namespace" if in_container else "the host namespace"
        raise fail(f'failed to lookup master "{name}": Link not found in {place}')
    return Master(link, in_container)


def config_dns(config: Mapping[str, Any]) -> DNS | None:
    value = config.get("dns")
    return DNS.from_json(value) if isinstance(value, Mapping) else None


def _kernel_error(kind: str, master: links.Link, e: links.LinkError) -> CNIError:
    if e.errno == errno.EOPNOTSUPP:
        return fail(
            f"failed to create {kind}: this kernel has no {kind} driver ({DRIVERS[kind]} is not set): "
            f"{os.strerror(e.errno)}"
        )
    if e.errno == errno.EINVAL:
        return fail(f'failed to create {kind}: master "{master.name}" (kind {master.kind or "none"}) cannot carry one')
    if e.errno == errno.EBUSY:
        return fail(f'failed to create {kind}: master "{master.name}" is busy (it carries another kind of link)')
    return fail(f"failed to create {kind}: {e.strerror}")


def _add(name: str, kind: str, spec: dict[str, Any]) -> None:
    with links.iproute() as ipr:
        links.add_link(ipr, name, kind, **spec)


def _rename(tmp: str, ifname: str) -> links.Link:
    with links.iproute() as ipr:
        index = links.ifindex(tmp)
        if index is None:
            raise links.LinkError(errno.ENODEV, f"{tmp}: Link not found")
        links.set_link(ipr, index, ifname=ifname)
        link = links.get_link(ipr, index=index)
        assert link is not None
        return link


def begin(request: PluginRequest, kind: str) -> None:
    """An ADD's first step (:meth:`owned.LinkRecords.begin`), before any look-up that can fail."""
    owned.LinkRecords(kind, request.state_dir).begin(attachment(request), request.netns, request.ifname)


def _create(request: PluginRequest, kind: str, master: Master, fd: int, spec: Mapping[str, Any]) -> Interface:
    """Create the ``kind`` link on ``master`` in the container as ``CNI_IFNAME``; ``spec`` holds
    the RTM_NEWLINK attributes (mtu, address, kind data). After :func:`begin`: the attachment's
    record names the link once it is there."""
    tmp = links.random_veth_name()
    full = {"link": master.link.index, **spec}
    try:
        if master.in_container:
            netns.run_in(fd, _add, tmp, kind, full)
        else:
            _add(tmp, kind, {**full, "net_ns_fd": fd})
    except links.LinkError as e:
        raise _kernel_error(kind, master.link, e) from e
    try:
        link = netns.run_in(fd, _rename, tmp, request.ifname)
    except links.LinkError as e:
        with contextlib.suppress(Exception):
            netns.run_in(fd, links.delete_link, tmp)
        raise fail(f'failed to rename {kind} to "{request.ifname}": {e.strerror}') from e
    owned.LinkRecords(kind, request.state_dir).made(attachment(request), fd, request.netns, link)
    return Interface(request.ifname, link.mac, sandbox=request.netns)


def _configure(ifname: str, result: Result, notify: bool) -> None:
    if notify:
        for name in (f"net/ipv4/conf/{ifname}/arp_notify", f"net/ipv6/conf/{ifname}/ndisc_notify"):
            with contextlib.suppress(OSError):
                sysctl.write(name, 1)
    ifconfig.configure_iface(ifname, result)


def _up(ifname: str) -> None:
    index = links.ifindex(ifname)
    if index is None:
        raise fail(f'failed to find interface name "{ifname}": Link not found')
    with links.iproute() as ipr, failing(f'failed to set "{ifname}" UP'):
        links.set_up(ipr, index)


def configure(
    request: PluginRequest,
    fd: int,
    iface: Interface,
    ipam_type: str,
    dns: DNS | None,
    *,
    use_prev: bool = False,
    notify: bool = True,
) -> Result:
    """IPAM ADD (or, with ``use_prev`` and no IPAM, the prevResult's IPs), addresses and routes
    on the interface (after ``arp_notify``/``ndisc_notify``, with ``notify``); without IPAM the
    interface is only set UP. IPAM DEL runs if this fails."""
    result = Result("1.1.0", interfaces=[iface])
    source: Result | None = None
    release = False
    if not ipam_type and use_prev:
        prev = prev_result(request)
        if prev is not None and prev.ips:
            source = prev
    try:
        if source is None and ipam_type:
            raw = delegate(request, ipam_type, "ADD")
            release = True
            source = ipam_result(raw, request)
            if not source.ips:
                raise fail("IPAM plugin returned missing IP config")
        if source is None:
            netns.run_in(fd, _up, request.ifname)
        else:
            ips = tuple(IPConfig(ip.address, ip.gateway, 0) for ip in source.ips)
            result = attrs.evolve(result, ips=ips, routes=source.routes)
            netns.run_in(fd, _configure, request.ifname, result, notify)
        result = attrs.evolve(result, dns=dns) if dns is not None else result
        # A result the config's version cannot hold (0.1.0/0.2.0 without addresses) fails the
        # ADD here, so that the caller's undo runs, not after the link is handed over.
        emit(result, request)
    except BaseException:
        if release:
            with contextlib.suppress(Exception):
                delegate(request, ipam_type, "DEL")
        raise
    return result


def add(
    request: PluginRequest,
    kind: str,
    master: Master,
    spec: Mapping[str, Any],
    mtu: int,
    ipam_type: str,
    dns: DNS | None,
    **how: bool,
) -> Result:
    """ADD's kernel part: the link (:func:`_create`, ``spec`` plus ``mtu`` if set) in the
    container's namespace, then :func:`configure` (``how``: its options); the link is deleted
    again if configuring it fails."""
    fd = open_container(request)
    try:
        iface = _create(request, kind, master, fd, {**spec, "mtu": mtu} if mtu else spec)
        try:
            return configure(request, fd, iface, ipam_type, dns, **how)
        except BaseException:
            _undo(request, kind)
            raise
    finally:
        os.close(fd)


def _delete_index(index: int, mac: str) -> None:
    with links.iproute() as ipr:
        link = links.get_link(ipr, index=index)
    if link is not None and link.mac == mac:
        links.delete_link(link.name)


def _delete_owned(request: PluginRequest, kind: str) -> None:
    if not request.netns:
        return
    link = owned.LinkRecords(kind, request.state_dir).container_link(attachment(request), request.netns, request.ifname)
    if link is None:
        return
    try:
        with failing(f'failed to delete "{link.name}"'):
            netns.run_in(request.netns, _delete_index, link.index, link.mac)
    except netns.NetnsError as e:
        if not netns_gone(e):
            raise fail(str(e)) from e


def _undo(request: PluginRequest, kind: str) -> None:
    """A failed ADD's undo after :func:`create`: the link it made; its record then names none."""
    _delete_owned(request, kind)
    owned.LinkRecords(kind, request.state_dir).nothing_created(attachment(request))


def delete(request: PluginRequest, kind: str, ipam_type: str) -> None:
    if ipam_type:
        delegate(request, ipam_type, "DEL")
    _delete_owned(request, kind)
    owned.LinkRecords(kind, request.state_dir).remove(attachment(request).key)


def _release(fd: int, link: links.Link, record: owned.LinkRecord) -> None:
    netns.run_in(fd, _delete_index, link.index, link.mac)


def gc(request: PluginRequest, kind: str, release: owned.Release = _release) -> GCReport:
    """GC (see the module docstring); ``release`` takes a stale attachment's link (default:
    delete it). ``pycni.dev/dry-run`` only reports."""
    f = Fields(request.config, "failed to load netconf")
    ipam_type = f.string("type", source=f.mapping("ipam"))
    network = request.network_name
    keep = {Attachment(network, cid, ifname).key for cid, ifname in valid_attachments(request)}
    removed: list[str] = []
    errors: list[str] = []
    owned.LinkRecords(kind, request.state_dir).collect(network, keep, dry_run(request), removed, errors, release)
    return finish_gc(request, ipam_type, removed, errors)


def _read(ifname: str) -> links.LinkInfo | None:
    with links.iproute() as ipr:
        return links.link_info(ipr, ifname)


def check(
    request: PluginRequest,
    kind: str | None,
    ipam_type: str,
    verify: Any = None,
    *,
    before_container: Any = None,
    missing_prev: str = "required prevResult missing",
    capitalised: bool = False,
    prefix: str = "",
    device: bool = True,
) -> None:
    """The reference's CHECK: IPAM CHECK, then (unless not ``device``) the prevResult's container
    interface (its ``kind`` unless None, ``verify(link, kind_data)`` for the kind's own
    attributes, its MAC), addresses and routes. ``before_container`` (the master's look-up) runs
    once the prevResult is known. ``capitalised``: the plugin's texts start upper-case (1.1.1's
    style, which some plugins keep in v1.9.1); ``prefix`` starts the interface-not-found and MAC
    texts (vlan's ``vlan: ``)."""
    os.close(open_container(request))
    if ipam_type:
        delegate(request, ipam_type, "CHECK")
    prev = prev_result(request)
    if prev is None:
        raise fail(missing_prev)
    if not device:
        return
    cap = str.capitalize if capitalised else str
    iface = next((i for i in prev.interfaces if i.name == request.ifname and i.sandbox == request.netns), None)
    if iface is None:
        raise fail(cap("sandbox") + f" in prevResult  doesn't match configured netns: {request.netns}")
    if before_container is not None:
        before_container()
    in_netns(request.netns, _check_container, kind, iface, prev, verify, cap, prefix)


def _check_container(kind: str | None, iface: Interface, prev: Result, verify: Any, cap: Any, prefix: str) -> None:
    info = _read(iface.name)
    if info is None:
        raise fail(prefix + cap("container") + f" Interface name in prevResult: {iface.name} not found")
    link = info.link
    if kind is not None and link.kind != kind:
        raise fail(cap("error") + f": Container interface {link.name} not of type {kind}")
    if verify is not None:
        verify(link, info.data)
    if iface.mac and iface.mac.lower() != link.mac:
        raise fail(prefix + cap("interface") + f" {iface.name} Mac {iface.mac} doesn't match container Mac: {link.mac}")
    ifconfig.check_ips(iface.name, prev.ips)
    ifconfig.check_routes(prev.routes)

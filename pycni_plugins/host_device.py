"""host-device: move an existing host link into the container, and back on DEL.

The device is chosen by ``device`` (name), ``hwaddr`` (MAC), ``kernelpath`` (``/sys/devices/...``),
``pciBusID`` or the ``deviceID`` runtimeConfig (a PCI or auxiliary-bus device); a PCI device
bound to a userspace (DPDK) driver is not moved. Config keys, result shape (one interface,
``ips[*].interface == 0``, ``dns`` from the config) and error texts follow
containernetworking/plugins v1.9.1, which differs from Debian's 1.1.1 in: the ``deviceID``
runtimeConfig and auxiliary devices; the device's alias (its host name, which DEL renames it
back to) is cleared again on DEL (1.1.1 leaves it set); STATUS asks the IPAM plugin. Where pycni
differs, on purpose:

* the move, the rename to ``CNI_IFNAME`` and the alias are one RTM_SETLINK (the kernel renames
  as it moves), so the host never sees a renamed device and no temporary namespace is made
  (v1.9.1 makes one to dodge udev racing a rename in the host);
* the device's host addresses and up state are recorded before the move (the kernel drops
  addresses when a device changes namespace) and put back on DEL; the reference loses the
  addresses and leaves the device down. A device moved by another implementation (no record)
  is returned as the reference does: renamed back from its alias, down;
* DEL moves back only the device its attachment's record names, while it still is that device
  (:mod:`.kernel.owned`: namespace, ifindex, MAC); a failed ADD leaves a record naming none,
  so its rollback never takes another attachment's ``CNI_IFNAME``; with no record, DEL moves
  ``CNI_IFNAME`` back (the reference's behaviour) unless another attachment's record names it;
* a device any default route of the host namespace can leave through is refused (code 7)
  before anything changes, moving it would cut the host off: IPv4 and IPv6, every table a
  routing rule reaches, every nexthop of a multipath route (the reference checks none);
* a DEL whose container namespace is gone, or that finds no ``CNI_IFNAME`` there (a repeated
  DEL), succeeds (the kernel already took the device back, or destroyed a virtual one), as
  pycni's other plugins do; the reference fails;
* GC (upstream has none: its GC succeeds, the devices of dead attachments stay where they were
  moved) moves the devices of the network's attachments not in ``cni.dev/valid-attachments``
  back to the host as DEL does, while their recorded namespace still holds them, drops their
  records and goes to the IPAM plugin.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from typing import Any

import attrs

from pycni import netns
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import GCReport, Plugin, PluginRequest, delegate
from pycni.types import Interface, IPConfig, Result

from . import _sublink
from ._common import Fields, attachment, emit, fail, failing, ipam_result, netns_gone, open_container
from .kernel import addressing, ifconfig, links, owned

__all__ = ["HostDeviceConfig", "HostDevicePlugin", "load_config"]

#: Where the PCI and auxiliary-bus devices are listed (module attributes: tests point them elsewhere).
SYS_BUS_PCI = "/sys/bus/pci/devices"
SYS_BUS_AUXILIARY = "/sys/bus/auxiliary/devices"
USERSPACE_DRIVERS = ("vfio-pci", "uio_pci_generic", "igb_uio")
_MAC = re.compile(r"[0-9a-fA-F]{2}([:-])[0-9a-fA-F]{2}(\1[0-9a-fA-F]{2}){4}")


def _moved(request: PluginRequest) -> owned.LinkRecords:
    """Per attachment: a :class:`~.kernel.owned.LinkRecord` with the device's host name, addresses
    and up state (``moved``), under the request's state dir."""
    return owned.LinkRecords("host-device", request.state_dir)


class HostDeviceConfig:
    def __init__(self, request: PluginRequest) -> None:
        f = Fields(request.config, "failed to load netconf")
        self.device = f.string("device")
        self.hwaddr = f.string("hwaddr")
        self.kernel_path = f.string("kernelpath")
        self.pci_addr = f.string("pciBusID")
        self.aux_device = ""
        self.ipam_type = f.string("type", source=f.mapping("ipam"))
        self.dns = _sublink.config_dns(request.config)
        device_id = f.string("deviceID", source=f.mapping("runtimeConfig"))
        if device_id:
            if _safe_component(device_id) and os.path.exists(os.path.join(SYS_BUS_PCI, device_id)):
                self.pci_addr = device_id
            elif _safe_component(device_id) and os.path.exists(os.path.join(SYS_BUS_AUXILIARY, device_id)):
                self.pci_addr, self.aux_device = "", device_id
            else:
                raise fail(f"runtime config DeviceID {device_id} not found or unsupported")
        if not (self.device or self.hwaddr or self.kernel_path or self.pci_addr or self.aux_device):
            raise fail('specify either "device", "hwaddr", "kernelpath" or "pciBusID"')
        if self.pci_addr and not _safe_component(self.pci_addr):
            raise fail(f"error with host device: invalid PCI address {self.pci_addr!r}")
        if self.hwaddr and not self.device and not _MAC.fullmatch(self.hwaddr):
            raise fail(f'failed to find host device: failed to parse MAC address "{self.hwaddr}"')
        if self.kernel_path and not (self.device or self.hwaddr):
            path = self.kernel_path
            if not path.startswith("/sys/devices/") or ".." in path.split("/"):
                raise fail(
                    f'failed to find host device: kernel device path "{path}" must be absolute and begin '
                    "with /sys/devices/"
                )
        self.dpdk = self.pci_addr != "" and _dpdk_driver(self.pci_addr)


def load_config(request: PluginRequest) -> HostDeviceConfig:
    return HostDeviceConfig(request)


def _safe_component(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and "\x00" not in name


def _dpdk_driver(pci_addr: str) -> bool:
    try:
        driver = os.path.basename(os.path.realpath(os.path.join(SYS_BUS_PCI, pci_addr, "driver"), strict=True))
    except OSError as e:
        raise fail(f"error with host device: {e.strerror}: {e.filename}") from e
    return driver in USERSPACE_DRIVERS


def _first_net_entry(path: str) -> str:
    try:
        entries = sorted(os.listdir(path))
    except OSError as e:
        raise fail(f'failed to find host device: failed to read directory {path}: "{e.strerror}"') from e
    if not entries:
        raise fail(f"failed to find host device: failed to find network device in path {path}")
    return entries[0]


def _device_name(conf: HostDeviceConfig, ipr: links.IPRoute) -> links.Link:
    """The host link the config names, as the reference looks it up (first criterion set wins)."""
    if conf.device:
        name = conf.device
    elif conf.hwaddr:
        mac = conf.hwaddr.replace("-", ":").lower()
        found = next((link for link in links.dump_links(ipr) if link.mac == mac), None)
        if found is None:
            raise fail("failed to find host device: failed to find physical interface")
        return found
    elif conf.kernel_path:
        name = _first_net_entry(os.path.join(conf.kernel_path, "net"))
    elif conf.pci_addr:
        net_dir = os.path.join(SYS_BUS_PCI, conf.pci_addr, "net")
        if not os.path.lexists(net_dir):
            base = os.path.join(SYS_BUS_PCI, conf.pci_addr)
            virtio = sorted(e for e in _listdir(base) if e.startswith("virtio"))
            candidates = [os.path.join(base, v, "net") for v in virtio if os.path.isdir(os.path.join(base, v, "net"))]
            if not candidates:
                raise fail(f"failed to find host device: no net directory under pci device {conf.pci_addr}")
            net_dir = candidates[0]
        name = _first_net_entry(net_dir)
    else:
        name = _first_net_entry(os.path.join(SYS_BUS_AUXILIARY, conf.aux_device, "net"))
    link = links.get_link(ipr, name)
    if link is None:
        raise fail("failed to find host device: Link not found")
    return link


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _select(conf: HostDeviceConfig) -> tuple[links.Link, list[str]]:
    """The device and its host addresses; refused when it carries the default route or is ``lo``."""
    with links.iproute() as ipr:
        link = _device_name(conf, ipr)
        if link.index == links.LOOPBACK_INDEX:
            raise CNIError(
                f'refusing to move "{link.name}": it is the loopback device', code=ErrorCode.INVALID_NETWORK_CONFIG
            )
        if link.index in ifconfig.default_route_indexes(ipr):
            raise CNIError(
                f'refusing to move "{link.name}": it carries the host namespace\'s default route',
                code=ErrorCode.INVALID_NETWORK_CONFIG,
            )
        addrs = [
            str(a) for a, _ in addressing.addresses(ipr, link.index) if not (a.version == 6 and a.ip.is_link_local)
        ]
        return link, addrs


def _move_in(index: int, fd: int, ifname: str, host_name: str) -> None:
    with links.iproute() as ipr:
        links.set_link(ipr, index, net_ns_fd=fd, ifname=ifname, ifalias=host_name)


def _up_in_container(ifname: str) -> links.Link:
    with links.iproute() as ipr:
        link = links.get_link(ipr, ifname)
        if link is None:
            raise fail(f'failed to find "{ifname}" in container NS: Link not found')
        links.set_up(ipr, link.index)
        return link


def _alias(index: int) -> str | None:
    with links.iproute() as ipr:
        info = links.link_info(ipr, index=index)
    return info.alias if info is not None else None


def _move_out(ifname: str, index: int, host_fd: int, host_name: str | None) -> str:
    """Move link ``index`` (``ifname``) back to the host as ``host_name`` (default: its alias);
    returns the name."""
    alias = _alias(index)
    if alias is None:
        raise fail(f'failed to find "{ifname}" in containerNS: Link not found')
    name = host_name or alias
    if not name:
        raise fail(f'failed to find original ifname for "{ifname}" (alias is not set)')
    with links.iproute() as ipr, failing(f'failed to move "{name}" to hostNS'):
        links.set_link(ipr, index, net_ns_fd=host_fd, ifname=name)
    return name


def _restore_host(name: str, addresses: list[str], up: bool) -> None:
    """In the host: clear the alias, put the recorded addresses back, bring it up if it was."""
    with links.iproute() as ipr:
        link = links.get_link(ipr, name)
        if link is None:
            raise fail(f'failed to find "{name}" in hostNS after moving it back')
        with failing(f'failed to unset alias of "{name}"'):
            links.set_link(ipr, link.index, ifalias="")
        if up:
            links.set_up(ipr, link.index)
        for addr in addresses:
            with contextlib.suppress(links.LinkError):  # EEXIST on a repeated DEL
                addressing.add_address(ipr, link.index, ipaddress.ip_interface(addr), exist_ok=True)


def _move_back(fd: int, link: links.Link, record: owned.LinkRecord | None) -> None:
    """Give container link ``link`` (of namespace ``fd``) back to the calling thread's namespace
    under its recorded host name, with its recorded addresses and up state (see
    :func:`_move_out`, :func:`_restore_host`)."""
    moved = (record.moved if record is not None else None) or owned.MovedDevice(None)
    host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        name = netns.run_in(fd, _move_out, link.name, link.index, host_fd, moved.device)
    finally:
        os.close(host_fd)
    _restore_host(name, list(moved.addresses), moved.up)


class HostDevicePlugin(Plugin):
    type = "host-device"

    def validate(self, request: PluginRequest) -> None:
        load_config(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf = load_config(request)
        fd = open_container(request)
        try:
            result = self._add(request, conf, fd)
        finally:
            os.close(fd)
        return emit(result, request)

    def _add(self, request: PluginRequest, conf: HostDeviceConfig, fd: int) -> Result:
        iface = Interface(request.ifname, sandbox=request.netns)
        if conf.dpdk:
            if not conf.ipam_type:
                return Result("1.1.0", interfaces=[iface])
            # The device stays with its userspace driver: the addresses are only reported.
            ipam = ipam_result(delegate(request, conf.ipam_type, "ADD"), request)
            if not ipam.ips:
                delegate(request, conf.ipam_type, "DEL")
                raise fail("IPAM plugin returned missing IP config")
            ips = [IPConfig(ip.address, ip.gateway, 0) for ip in ipam.ips]
            result = Result("1.1.0", interfaces=[iface], ips=ips, routes=ipam.routes)
            return attrs.evolve(result, dns=conf.dns) if conf.dns is not None else result
        att = attachment(request)
        _moved(request).begin(att, request.netns, request.ifname)
        device, addrs = _select(conf)
        moved = owned.MovedDevice(device.name, tuple(addrs), device.up)
        # Named before the move (the kernel keeps its MAC, and its ifindex unless taken there),
        # so a crash right after the move still gives it back; a failed move names none.
        _moved(request).made(att, fd, request.netns, device, moved)
        try:
            _move_in(device.index, fd, request.ifname, device.name)
        except links.LinkError as e:
            # The kernel moves before it renames: a refused name (EEXIST) leaves the device in
            # the container under its host name, which the record already names.
            with contextlib.suppress(Exception):
                self._give_back(request, fd)
            _moved(request).nothing_created(att)
            raise fail(f'failed to move link failed to move "{device.name}" to container NS: {e.strerror}') from e
        try:
            link = netns.run_in(fd, _up_in_container, request.ifname)
            _moved(request).made(att, fd, request.netns, link, moved)
            iface = Interface(request.ifname, link.mac, sandbox=request.netns)
            return _sublink.configure(request, fd, iface, conf.ipam_type, conf.dns, notify=False)
        except BaseException:
            with contextlib.suppress(Exception):
                self._give_back(request, fd)
            _moved(request).nothing_created(att)
            raise

    def _give_back(self, request: PluginRequest, fd: int) -> None:
        """Move the device DEL may take (see :meth:`owned.LinkRecords.container_link`) back."""
        att = attachment(request)
        record = _moved(request).record(att.key)
        link = _moved(request).container_link(att, request.netns, request.ifname)
        if link is not None:
            _move_back(fd, link, record)
        _moved(request).remove(att.key)

    def delete(self, request: PluginRequest) -> None:
        conf = load_config(request)
        if not request.netns:
            return
        try:
            fd = netns.open_netns(request.netns)
        except netns.NetnsError as e:
            if netns_gone(e):
                _moved(request).remove(attachment(request).key)
                return
            raise fail(f'failed to open netns "{request.netns}": {e.strerror}') from e
        try:
            if conf.ipam_type:
                delegate(request, conf.ipam_type, "DEL")
            if conf.dpdk:
                return
            self._give_back(request, fd)
        finally:
            os.close(fd)

    def check(self, request: PluginRequest) -> None:
        conf = load_config(request)
        _sublink.check(
            request,
            None,
            conf.ipam_type,
            missing_prev="Required prevResult missing",
            capitalised=True,
            device=not conf.dpdk,
        )

    def gc(self, request: PluginRequest) -> GCReport:
        """Give back the devices of this network's attachments not in ``cni.dev/valid-attachments``
        that are still in their recorded namespace (as DEL does), drop their records, then the
        IPAM plugin's GC."""
        return _sublink.gc(request, "host-device", _move_back)

    def status(self, request: PluginRequest) -> None:
        f = Fields(request.config, "failed to load netconf")
        ipam_type = f.string("type", source=f.mapping("ipam"))
        if ipam_type:
            delegate(request, ipam_type, "STATUS")

"""ptp: a veth pair per container, routed point to point from the host (no bridge).

Config keys (``ipMasq``, ``mtu``, ``dns``, ``ipam``), result shape (``[host veth, container]``,
``ips[*].interface == 1``), CHECK/DEL/STATUS behaviour and error texts follow
containernetworking/plugins v1.9.1. The container gets its addresses with the subnet route
replaced by ``<gw>/32 dev <if> scope link src <ip>`` and ``<subnet> via <gw> src <ip>``; the
host veth gets every gateway as a /32 (/128) address and a ``<ip>/32 dev <veth> scope host``
route; forwarding is turned on for each family in use. Debian's 1.1.1 differs only in what
the latest release fixed: it creates both veth ends with ``txqueuelen 0`` and does not set
``keep_addr_on_down`` for IPv6 (pycni follows v1.9.1), and it has no STATUS.

Where pycni differs, on purpose:

* ``ipMasq`` uses pycni's nftables table, as bridge does, whatever ``ipMasqBackend`` says; DEL
  releases the masquerade elements from the attachment's record even when the namespace or the
  link is already gone (upstream then leaks its iptables chain);
* the namespace is opened, and an IPAM result without a gateway for an address refused (ptp
  routes everything through it; upstream fails later with a netlink error), before anything is
  created; a failing ADD removes the veth it made, its masquerade elements and, through IPAM
  DEL, its addresses (upstream leaves the veth);
* both veth ends get an explicit random MAC, and the host's IPv6 gateway addresses are added
  without DAD (usable at once; the host end owns them);
* the host veth is recorded (``ptp/<attachment key>`` under pycni's state dir) before it is
  created: DEL deletes it even when the container's netns path is gone; GC (spec 1.1, none
  upstream) removes the masquerade elements, veths and records of attachments not in
  ``cni.dev/valid-attachments`` and passes GC on to the IPAM plugin;
* an ADD or its undo, and a DEL, remove only what the attachment's record says it made, as
  bridge does (:mod:`.kernel.owned`): a failed ADD leaves a record naming no veth, so its DEL
  (a runtime's rollback included) deletes no interface, and with a record DEL never deletes a
  container interface by name (upstream deletes ``CNI_IFNAME``, whoever made it). An ADD for
  an attachment whose recorded veth is still there (any netns) is refused before IPAM runs,
  and the IPAM DEL of the undo is registered only once the IPAM ADD succeeded;
* a second address of a family with the same gateway reuses the host's gateway address
  (upstream fails with "file exists").
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Mapping
from typing import Any

import attrs

from pycni import netns
from pycni.errors import CNIError
from pycni.sdk import GCReport, Plugin, PluginRequest, builtin_plugin, delegate
from pycni.types import DNS, Interface, IPConfig, Result

from . import _veth
from ._common import Fields, attachment, fail, failing, in_netns, ipam_result
from .kernel import addressing, ifconfig, links, nft, owned, routing

__all__ = ["PtpConfig", "PtpPlugin", "load_config"]


@attrs.frozen
class PtpConfig:
    ip_masq: bool = False
    mtu: int = 0
    ipam_type: str = ""
    dns: DNS | None = None


def load_config(request: PluginRequest) -> PtpConfig:
    f = Fields(request.config, "failed to load netconf")
    ip_masq = f.flag("ipMasq")
    f.string("ipMasqBackend")  # type-checked as upstream; masquerade is always nftables here
    mtu = f.integer("mtu")
    if mtu < 0:
        raise f.error(f"invalid MTU {mtu}")
    ipam_type = f.string("type", source=f.mapping("ipam"))
    dns_obj = request.config.get("dns")
    try:
        dns = DNS.from_json(dns_obj) if isinstance(dns_obj, Mapping) else None
    except CNIError as e:
        raise f.error(e.msg) from None
    return PtpConfig(ip_masq, mtu, ipam_type, dns if dns and dns.to_json() else None)


def _host_prefix(version: int) -> int:
    return 32 if version == 4 else 128


# --- container side (runs in a thread inside the container's namespace) -------------------------


def _configure_container(ifname: str, result: Result) -> None:
    """upstream's ``ipam.ConfigureIface``, then each subnet route replaced by the gateway's."""
    ifconfig.configure_iface(ifname, result)
    index = links.ifindex(ifname)
    if index is None:
        raise fail(f'failed to lookup "{ifname}": Link not found')
    with links.iproute() as ipr:
        for ip in result.ips:
            net = ip.address.network
            gw_net = ipaddress.ip_network(f"{ip.gateway}/{_host_prefix(net.version)}")
            src = str(ip.address.ip)
            with failing(f"failed to delete route {net} dev {ifname}"):
                routing.del_route(ipr, index, net)
            with failing(f"failed to add route {net} via {ip.gateway} dev {ifname}"):
                routing.add_route(ipr, index, gw_net, None, scope=routing.RT_SCOPE_LINK, src=src)
                routing.add_route(ipr, index, net, str(ip.gateway), src=src)


# --- the plugin -------------------------------------------------------------------------------


class PtpPlugin(Plugin):
    type = "ptp"

    def validate(self, request: PluginRequest) -> None:
        conf = load_config(request)
        ipam = builtin_plugin(conf.ipam_type) if conf.ipam_type else None
        if ipam is not None:  # an exec'd IPAM plugin runs first in ADD, before anything is made
            ipam.validate(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf = load_config(request)
        record = owned.VethRecord(attachment(request))
        return _veth.add(request, self.type, record, lambda a: self._add(request, conf, a))

    def _add(self, request: PluginRequest, conf: PtpConfig, a: _veth.VethAdd) -> Result:
        raw = delegate(request, conf.ipam_type, "ADD")
        # Only now: a refused IPAM ADD leased nothing, and its DEL would free another ADD's lease.
        a.undo.append(lambda: delegate(request, conf.ipam_type, "DEL"))
        ipam = ipam_result(raw, request)
        if not ipam.ips:
            raise fail("IPAM plugin returned missing IP config")
        for ip in ipam.ips:
            if ip.gateway is None or ip.gateway.version != ip.address.version:
                raise fail(f"IPAM result has no gateway for {ip.address}: ptp routes through it")
        _veth.enable_forwarding((ip.address.version for ip in ipam.ips), "Could not enable IP forwarding")
        container_mac = links.random_mac()
        host_name, host_mac = a.create(container_mac, conf.mtu)
        ips = tuple(IPConfig(ip.address, ip.gateway, 1) for ip in ipam.ips)
        interfaces = [Interface(host_name, host_mac), Interface(request.ifname, container_mac, sandbox=request.netns)]
        result = Result("1.1.0", interfaces, ips, ipam.routes, conf.dns if conf.dns is not None else ipam.dns)
        netns.run_in(a.fd, _configure_container, request.ifname, result)
        index = links.ifindex(host_name)
        if index is None:
            raise fail(f'failed to lookup "{host_name}": Link not found')
        for ip in ips:
            prefix = _host_prefix(ip.address.version)
            gw_addr = ipaddress.ip_interface(f"{ip.gateway}/{prefix}")
            with failing(f"failed to add IP addr {gw_addr} to veth"):
                addressing.add_address(a.ipr, index, gw_addr, nodad=gw_addr.version == 6, exist_ok=True)
            host_route = ipaddress.ip_network(f"{ip.address.ip}/{prefix}")
            try:
                routing.add_route(a.ipr, index, host_route, None, scope=routing.RT_SCOPE_HOST)
            except links.LinkError as e:
                if e.errno != errno.EEXIST:
                    raise fail(f"failed to add route on host: {e.strerror}") from e
        if conf.ip_masq:
            a.masquerade(ips)
        return result

    def delete(self, request: PluginRequest) -> None:
        _veth.delete(request, self.type, load_config(request).ipam_type, ("masq",))

    def check(self, request: PluginRequest) -> None:
        conf = load_config(request)
        prev = _veth.check_start(request, conf.ipam_type, "ptp: Required prevResult missing")
        ctr = next((i for i in prev.interfaces if i.name == request.ifname and i.sandbox == request.netns), None)
        if ctr is None:
            raise fail(f"Sandbox in prevResult  doesn't match configured netns: {request.netns}")
        missing = f"ptp: Container Interface name in prevResult: {ctr.name} not found"
        in_netns(request.netns, _veth.check_container, ctr, request.ifname, prev, missing, "veth/p2p", "ptp: ")
        if conf.ip_masq:
            index = prev.interfaces.index(ctr)
            _veth.check_masquerade(request, [ip for ip in prev.ips if ip.interface is None or ip.interface == index])

    def gc(self, request: PluginRequest) -> GCReport:
        conf = load_config(request)

        def collect_nft(valid: set[tuple[str, str]], dry: bool) -> list[str]:
            return nft.collect(request.network_name, valid, ("masq",), state_dir=request.state_dir, dry_run=dry)

        return _veth.gc(request, self.type, conf.ipam_type, collect_nft)

    def status(self, request: PluginRequest) -> None:
        _veth.status(request, load_config(request).ipam_type)

"""vlan: an 802.1Q link on a host master, handed to the container (the reference's semantics).

Config keys (``master``, ``vlanId``, ``mtu``, ``linkInContainer``, ``ipam`` -- required --,
``dns``), result shape (one interface, ``ips[*].interface == 0``, ``dns`` from the config) and
error texts follow containernetworking/plugins v1.9.1, which differs from Debian's 1.1.1 in:
``linkInContainer``; IPv6 sets ``keep_addr_on_down=1``; STATUS asks the IPAM plugin; the
"master field is required" text lost its final full stop. Where pycni differs, on purpose:

* a kernel without 802.1Q (``CONFIG_VLAN_8021Q``, as on the machine this was written on) fails
  ADD with a message naming it instead of a bare "operation not supported";
* DEL and CHECK do not need the master to exist (the reference's DEL looks it up, so a DEL after
  the master went away could never succeed); DEL runs IPAM DEL only when ``ipam`` names a type;
* CHECK's VLAN-id and MTU mismatch texts name what they compare (the reference's read "Tuning
  link ... configured promisc is ...", a copy-paste from tuning);
* GC (upstream has none) deletes the recorded links and records of the network's attachments
  not in ``cni.dev/valid-attachments`` (:func:`._sublink.gc`) and goes to the IPAM plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from pycni.sdk import GCReport, Plugin, PluginRequest, delegate
from pycni.types import DNS

from . import _sublink
from ._common import Fields, emit, fail
from .kernel import links

__all__ = ["VlanConfig", "VlanPlugin", "load_config"]


@attrs.frozen
class VlanConfig:
    master: str
    vlan_id: int = 0
    mtu: int = 0
    link_in_container: bool = False
    ipam_type: str = ""
    dns: DNS | None = None


def load_config(request: PluginRequest) -> VlanConfig:
    f = Fields(request.config, "failed to load netconf")
    master = f.string("master")
    if not master:
        raise fail('"master" field is required. It specifies the host interface name to create the VLAN for')
    vlan_id = f.integer("vlanId")
    if not 0 <= vlan_id <= 4094:
        raise fail(f"invalid VLAN ID {vlan_id} (must be between 0 and 4095 inclusive)")
    mtu = f.integer("mtu")
    if mtu < 0:
        raise fail(f"invalid MTU {mtu}, must be [0, master MTU]")
    return VlanConfig(
        master=master,
        vlan_id=vlan_id,
        mtu=mtu,
        link_in_container=f.flag("linkInContainer"),
        ipam_type=f.string("type", source=f.mapping("ipam")),
        dns=_sublink.config_dns(request.config),
    )


def _verify(conf: VlanConfig) -> Any:
    def verify(link: links.Link, data: Mapping[str, Any]) -> None:
        have = data.get("IFLA_VLAN_ID")
        if have != conf.vlan_id:
            raise fail(f"Error: vlan link {link.name} configured VLAN ID is {conf.vlan_id}, current value is {have}")
        if conf.mtu and conf.mtu != link.mtu:
            raise fail(f"Error: vlan link {link.name} configured MTU is {conf.mtu}, current value is {link.mtu}")

    return verify


class VlanPlugin(Plugin):
    type = "vlan"

    def validate(self, request: PluginRequest) -> None:
        conf = load_config(request)
        if not conf.ipam_type:
            raise fail("failed to execute IPAM delegate: no plugin name provided")

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf = load_config(request)
        _sublink.begin(request, "vlan")
        master = _sublink.lookup_master(request, conf.master, conf.link_in_container)
        if conf.mtu > master.link.mtu:
            raise fail(f"invalid MTU {conf.mtu}, must be [0, master MTU({master.link.mtu})]")
        if not conf.ipam_type:
            raise fail("failed to execute IPAM delegate: no plugin name provided")
        spec = {"vlan_id": conf.vlan_id}
        result = _sublink.add(request, "vlan", master, spec, conf.mtu, conf.ipam_type, conf.dns, notify=False)
        return emit(result, request)

    def delete(self, request: PluginRequest) -> None:
        _sublink.delete(request, "vlan", load_config(request).ipam_type)

    def check(self, request: PluginRequest) -> None:
        conf = load_config(request)
        if not conf.ipam_type:
            raise fail("no plugin name provided")  # the reference's IPAM CHECK delegation, as ADD's
        _sublink.check(
            request,
            "vlan",
            conf.ipam_type,
            _verify(conf),
            before_container=lambda: _sublink.lookup_master(request, conf.master, conf.link_in_container),
            missing_prev="vlan: Required prevResult missing",
            capitalised=True,
            prefix="vlan: ",
        )

    def gc(self, request: PluginRequest) -> GCReport:
        return _sublink.gc(request, "vlan")

    def status(self, request: PluginRequest) -> None:
        ipam_type = load_config(request).ipam_type
        if ipam_type:
            delegate(request, ipam_type, "STATUS")

"""macvlan: a macvlan link on a host master, handed to the container (the reference's semantics).

Config keys, CNI_ARGS (``MAC``), the ``mac`` runtimeConfig, result shape (one interface,
``ips[*].interface == 0``, ``dns`` from the config only) and error texts follow
containernetworking/plugins v1.9.1, which differs from Debian's 1.1.1 in: ``linkInContainer``
(the master, and the default-route lookup, in the container's namespace) and ``bcqueuelen``
are new; ``ndisc_notify=1`` is set next to ``arp_notify``; IPv6 sets ``keep_addr_on_down=1``;
DEL only parses the config (1.1.1 needed the master to exist); STATUS asks the IPAM plugin;
CHECK's texts start lower-case. Where pycni differs, on purpose:

* a missing master reads ``failed to lookup master "X": Link not found in the host namespace``
  (the reference says only ``Link not found``); a master that cannot carry a macvlan (``lo``, a
  non-Ethernet device) and a kernel without the driver are named as such;
* the config is validated (mode, MAC, MTU, bcqueuelen) before anything changes;
* without ``master``, a multipath default route gives its first nexthop's device (the
  reference skips such a route and finds no master); ipvlan's lookup is the same;
* GC (upstream has none: its GC succeeds and changes nothing) deletes the recorded links of the
  network's attachments not in ``cni.dev/valid-attachments`` and their records, as their DEL
  would (:func:`._sublink.gc`), and goes to the IPAM plugin.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from pycni.sdk import GCReport, Plugin, PluginRequest, delegate
from pycni.types import DNS

from . import _sublink
from ._common import Fields, emit, fail
from .kernel import links

__all__ = ["MacvlanConfig", "MacvlanPlugin", "load_config"]

MODES = {"": 4, "bridge": 4, "private": 1, "vepa": 2, "passthru": 8}
_MODE_NAMES = {4: "bridge", 1: "private", 2: "vepa", 8: "passthru"}
_MAC = re.compile(r"[0-9a-fA-F]{2}([:-])[0-9a-fA-F]{2}(\1[0-9a-fA-F]{2}){4}")


@attrs.frozen
class MacvlanConfig:
    master: str = ""
    mode: str = ""
    mtu: int = 0
    mac: str = ""
    link_in_container: bool = False
    bc_queue_len: int = 0
    ipam_type: str = ""
    dns: DNS | None = None


def parse_mac(mac: str) -> str:
    if not _MAC.fullmatch(mac):
        raise fail(f"invalid args {mac} for MAC addr: address {mac}: invalid MAC address")
    return mac.replace("-", ":").lower()


def load_config(request: PluginRequest) -> MacvlanConfig:
    """The config as ADD reads it, validated without looking at the kernel."""
    f = Fields(request.config, "failed to load netconf")
    mode = f.string("mode")
    if mode not in MODES:
        raise fail(f'unknown macvlan mode: "{mode}"')
    bcq = f.integer("bcqueuelen", bounds=None)  # a uint32, checked with the reference's message
    if not 0 <= bcq < 2**32:
        raise f.error(f"json: cannot unmarshal number {bcq} into Go struct field NetConf.bcqueuelen of type uint32")
    mac = f.string("mac")
    mac = request.load_args("MAC").get("MAC") or mac
    mac = f.string("mac", source=f.mapping("runtimeConfig")) or mac
    mtu = f.integer("mtu")
    if mtu < 0:
        raise fail(f"invalid MTU {mtu}, must be [0, master MTU]")
    return MacvlanConfig(
        master=f.string("master"),
        mode=mode,
        mtu=mtu,
        mac=parse_mac(mac) if mac else "",
        link_in_container=f.flag("linkInContainer"),
        bc_queue_len=bcq,
        ipam_type=f.string("type", source=f.mapping("ipam")),
        dns=_sublink.config_dns(request.config),
    )


def _master(request: PluginRequest, conf: MacvlanConfig) -> _sublink.Master:
    master = _sublink.lookup_master(request, conf.master, conf.link_in_container)
    if conf.mtu > master.link.mtu:
        raise fail(f"invalid MTU {conf.mtu}, must be [0, master MTU({master.link.mtu})]")
    return master


def _verify(mode: str) -> Any:
    want = MODES[mode]

    def verify(link: links.Link, data: Mapping[str, Any]) -> None:
        have = data.get("IFLA_MACVLAN_MODE")
        have_num = next((k for k, v in _MODE_NAMES.items() if v == have), None)
        if have_num != want:
            raise fail(f"container macvlan mode {have} does not match expected value: {_MODE_NAMES[want]}")

    return verify


class MacvlanPlugin(Plugin):
    type = "macvlan"

    def validate(self, request: PluginRequest) -> None:
        load_config(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf = load_config(request)
        _sublink.begin(request, "macvlan")
        master = _master(request, conf)
        spec: dict[str, Any] = {"macvlan_mode": _MODE_NAMES[MODES[conf.mode]]}
        if conf.mac:
            spec["address"] = conf.mac
        if conf.bc_queue_len:
            spec["macvlan_bc_queue_len"] = conf.bc_queue_len
        result = _sublink.add(request, "macvlan", master, spec, conf.mtu, conf.ipam_type, conf.dns)
        return emit(result, request)

    def delete(self, request: PluginRequest) -> None:
        f = Fields(request.config, "failed to load netConf")
        _sublink.delete(request, "macvlan", f.string("type", source=f.mapping("ipam")))

    def check(self, request: PluginRequest) -> None:
        conf = load_config(request)
        _sublink.check(
            request, "macvlan", conf.ipam_type, _verify(conf.mode), before_container=lambda: _master(request, conf)
        )

    def gc(self, request: PluginRequest) -> GCReport:
        return _sublink.gc(request, "macvlan")

    def status(self, request: PluginRequest) -> None:
        f = Fields(request.config, "failed to load netconf")
        ipam_type = f.string("type", source=f.mapping("ipam"))
        if ipam_type:
            delegate(request, ipam_type, "STATUS")

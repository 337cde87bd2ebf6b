"""ipvlan: an ipvlan link on a host master, handed to the container (the reference's semantics).

Config keys (``master``, ``mode`` l2/l3/l3s, ``mtu``, ``linkInContainer``, ``ipam``, ``dns``),
chaining (no ``master``: the single interface of the prevResult; no ``ipam``: the prevResult's
IPs), result shape (one interface, ``ips[*].interface == 0``, ``dns`` from the config) and error
texts follow containernetworking/plugins v1.9.1, which differs from Debian's 1.1.1 in:
``linkInContainer``; ``arp_notify``/``ndisc_notify`` set on the interface; IPv6 sets
``keep_addr_on_down=1``; STATUS asks the IPAM plugin. Where pycni differs, on purpose:

* a kernel without the ipvlan driver (``CONFIG_IPVLAN``, as on the machine this was written on)
  fails ADD with a message naming it instead of a bare "operation not supported"; a missing
  master is named with the namespace it was looked for in;
* ``mode`` and the chaining rules are checked before anything changes;
* DEL does not resolve the master (1.1.1 and v1.9.1 look up the default route when ``master``
  is empty and fail without one, so such a DEL could never succeed);
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
from ._common import Fields, emit, fail, prev_result
from .kernel import links

__all__ = ["IpvlanConfig", "IpvlanPlugin", "load_config"]

MODES = {"": 0, "l2": 0, "l3": 1, "l3s": 2}
_MODE_NAMES = {0: "l2", 1: "l3", 2: "l3s"}


@attrs.frozen
class IpvlanConfig:
    master: str = ""
    mode: str = ""
    mtu: int = 0
    link_in_container: bool = False
    ipam_type: str = ""
    dns: DNS | None = None
    chained: bool = False


def load_config(request: PluginRequest, *, resolve_chain: bool = True) -> IpvlanConfig:
    """The config, validated without looking at the kernel; with ``resolve_chain`` a missing
    ``master`` is taken from a prevResult with a single named interface."""
    f = Fields(request.config, "failed to load netconf")
    mode = f.string("mode")
    if mode not in MODES:
        raise fail(f'unknown ipvlan mode: "{mode}"')
    master = f.string("master")
    prev = prev_result(request) if request.prev_result is not None else None
    if not master and prev is not None and resolve_chain:
        if len(prev.interfaces) == 1 and prev.interfaces[0].name:
            master = prev.interfaces[0].name
        else:
            raise fail("chained master failure. PrevResult lacks a single named interface")
    ipam_type = f.string("type", source=f.mapping("ipam"))
    chained = not ipam_type and prev is not None and bool(prev.ips)
    return IpvlanConfig(
        master=master,
        mode=mode,
        mtu=f.integer("mtu"),
        link_in_container=f.flag("linkInContainer"),
        ipam_type=ipam_type,
        dns=_sublink.config_dns(request.config),
        chained=chained,
    )


def _verify(mode: str) -> Any:
    want = MODES[mode]

    def verify(link: links.Link, data: Mapping[str, Any]) -> None:
        have = data.get("IFLA_IPVLAN_MODE")
        if have != want:
            have_name = _MODE_NAMES.get(have, have) if isinstance(have, int) else have
            raise fail(f"Container IPVlan mode {have_name} does not match expected value: {_MODE_NAMES[want]}")

    return verify


def _check_master(request: PluginRequest, conf: IpvlanConfig) -> None:
    """CHECK looks the configured master up as written: an empty one is not resolved."""
    if not conf.master:
        raise fail('failed to lookup master "": Link not found')
    _sublink.lookup_master(request, conf.master, conf.link_in_container)


class IpvlanPlugin(Plugin):
    type = "ipvlan"

    def validate(self, request: PluginRequest) -> None:
        conf = load_config(request)
        if not conf.ipam_type and not conf.chained:
            raise fail("no plugin name provided")

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf = load_config(request)
        _sublink.begin(request, "ipvlan")
        if not conf.ipam_type and not conf.chained:
            raise fail("no plugin name provided")  # what the reference's IPAM delegation says
        master = _sublink.lookup_master(request, conf.master, conf.link_in_container)
        spec = {"ipvlan_mode": MODES[conf.mode]}
        result = _sublink.add(request, "ipvlan", master, spec, conf.mtu, conf.ipam_type, conf.dns, use_prev=True)
        return emit(result, request)

    def delete(self, request: PluginRequest) -> None:
        conf = load_config(request, resolve_chain=False)
        _sublink.delete(request, "ipvlan", conf.ipam_type)

    def check(self, request: PluginRequest) -> None:
        conf = load_config(request, resolve_chain=False)
        _sublink.check(
            request,
            "ipvlan",
            conf.ipam_type,
            _verify(conf.mode),
            before_container=lambda: _check_master(request, conf),
            missing_prev="Required prevResult missing",
            capitalised=True,
        )

    def gc(self, request: PluginRequest) -> GCReport:
        return _sublink.gc(request, "ipvlan")

    def status(self, request: PluginRequest) -> None:
        ipam_type = load_config(request, resolve_chain=False).ipam_type
        if ipam_type:
            delegate(request, ipam_type, "STATUS")

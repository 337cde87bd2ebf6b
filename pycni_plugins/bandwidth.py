"""bandwidth: token-bucket shaping of a container's traffic on its host veth (a chained plugin).

Config keys, the ``bandwidth`` capability, result, CHECK and DEL and error texts follow
containernetworking/plugins v1.9.1: ``ingressRate``/``ingressBurst`` and
``egressRate``/``egressBurst`` in bits (top level; ``runtimeConfig.bandwidth`` only when the
config has none of them); traffic into the container is shaped by a tbf (handle 1:) on the host
veth, traffic out of it by an ingress qdisc on the host veth whose u32 filter redirects every
packet (mirred) to an ifb device with the tbf, whose MTU is the veth's; the ifb joins the
result's interfaces. The host veth is the peer of ``CNI_IFNAME`` found among the prevResult's
host interfaces. Versions from 0.3.0 on. The parameters are upstream's: rate/8 bytes/s, burst/8 bytes of bucket
(``buffer`` in scheduler ticks), ``limit`` for 25 ms of latency.

Debian's 1.1.1 and v1.9.1 behave the same here; upstream had "shaped/unshaped subnets" only in
v1.5.x (reverted in v1.6.0), so the latest release and pycni have none.

Where pycni differs, on purpose:

* the container interface's veth peer must be in the namespace the plugin runs in (its
  IFLA_LINK_NETNSID names that namespace): an ifindex names a link only in its own namespace,
  and upstream shapes whatever host link has the index of a peer that lives elsewhere;
* rates below 8 bit/s, bursts below 8 bits, rates of 2**32 bytes/s (34 Gbit/s) and more, and
  bursts whose bucket does not fit the kernel's 32-bit tick and byte fields are refused before
  anything changes (upstream sends truncated values, or a 64-bit rate);
* the ifb is named per attachment (``bwp`` + 12 hex digits of :attr:`~pycni.sdk.Attachment.key`),
  not per container (upstream: ``bwp`` + sha512 of network name and container ID), so a
  container's second shaped interface on one network gets its own instead of failing with
  "File exists", and the DEL of one never deletes the other's; DEL, CHECK and GC use the ifb
  the attachment's record names (a per-container name an older pycni recorded included);
* a failing ADD removes the ifb and qdiscs it made; DEL also removes the tbf and ingress
  qdiscs it put on the host veth (recorded under pycni's state dir as ``bandwidth/<attachment
  key>``), not only the ifb; GC (none upstream) removes the ifbs of this network's attachments
  not in ``cni.dev/valid-attachments``;
* CHECK also verifies that the ingress filter redirects to the ifb, and fails when the tbf it
  looks for is missing (upstream stops at the first qdisc that is not a tbf and passes).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from pycni import netns
from pycni import version as _version
from pycni._json import go_kind
from pycni.sdk import Attachment, GCReport, Plugin, PluginRequest
from pycni.types import Interface, Result

from ._common import attachment, dry_run, emit, fail, failing, gc_report, prev_result, valid_attachments
from .kernel import links, tc
from .kernel.state import Records

__all__ = ["Bandwidth", "BandwidthPlugin", "load_config", "ifb_name"]

_U64 = 2**64
_KEYS = ("ingressRate", "ingressBurst", "egressRate", "egressBurst")


def _records(request: PluginRequest) -> Records:
    """Per attachment: ``{"attachment", "host", "ifb", "ingress", "egress"}``, under the request's state dir."""
    return Records("bandwidth", request.state_dir)


@attrs.frozen
class Bandwidth:
    ingress_rate: int = 0
    ingress_burst: int = 0
    egress_rate: int = 0
    egress_burst: int = 0

    @property
    def ingress(self) -> bool:
        return self.ingress_rate > 0 and self.ingress_burst > 0

    @property
    def egress(self) -> bool:
        return self.egress_rate > 0 and self.egress_burst > 0


def _entry(source: Mapping[str, Any], where: str) -> Bandwidth:
    values = []
    for key in _KEYS:
        value = source.get(key, 0)
        if value is None:
            value = 0
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64:
            shown = f"number {value}" if isinstance(value, int) and not isinstance(value, bool) else go_kind(value)
            raise fail(
                f"failed to parse network configuration: json: cannot unmarshal {shown} "
                f"into Go struct field {where}.{key} of type uint64"
            )
        values.append(value)
    return Bandwidth(*values)


def _validate_pair(rate: int, burst: int) -> None:
    if burst == 0 and rate != 0:
        raise fail("if rate is set, burst must also be set")
    if rate == 0 and burst != 0:
        raise fail("if burst is set, rate must also be set")
    if burst // 8 >= 2**32 - 1:
        raise fail("burst cannot be more than 4GB")


def load_config(request: PluginRequest) -> Bandwidth | None:
    """The bandwidth to apply (``None``: none configured), validated as upstream and by
    :func:`~.kernel.tc.tbf_params`."""
    if any(key in request.config for key in _KEYS):
        bw = _entry(request.config, "PluginConf")
    else:
        runtime = request.runtime_config.get("bandwidth")
        if runtime is None:
            return None
        if not isinstance(runtime, Mapping):
            raise fail(
                f"failed to parse network configuration: json: cannot unmarshal {go_kind(runtime)} "
                "into Go struct field .runtimeConfig.bandwidth of type main.BandwidthEntry"
            )
        bw = _entry(runtime, ".runtimeConfig.bandwidth")
    _validate_pair(bw.ingress_rate, bw.ingress_burst)
    _validate_pair(bw.egress_rate, bw.egress_burst)
    for on, rate, burst, what in (
        (bw.ingress, bw.ingress_rate, bw.ingress_burst, "ingress"),
        (bw.egress, bw.egress_rate, bw.egress_burst, "egress"),
    ):
        if on:
            try:
                tc.tbf_params(rate, burst)
            except ValueError as e:
                raise fail(f"invalid {what} bandwidth: {e}") from None
    return bw


def ifb_name(att: Attachment) -> str:
    """The ifb an ADD of attachment ``att`` makes: one per attachment, so two interfaces of one
    container on one network never share one (as upstream's per-container name makes them)."""
    return ("bwp" + att.key)[:15]


def _recorded_ifb(record: Mapping[str, Any]) -> str | None:
    """The ifb a record says its ADD made (whichever scheme named it); none without egress."""
    ifb = record.get("ifb")
    return ifb if isinstance(ifb, str) and record.get("egress") else None


def _ifb_of(record: Any, att: Attachment) -> str | None:
    """Attachment ``att``'s ifb: the one its record names, or with no record the one
    :func:`ifb_name` gives it (no other attachment's)."""
    return _recorded_ifb(record) if isinstance(record, dict) else ifb_name(att)


def _peer_index(ifname: str, host_ns: int) -> int:
    """The index of ``ifname``'s veth peer, which must be in namespace ``host_ns``: an index
    names a link only in the namespace the peer is in (IFLA_LINK_NETNSID), and the host's
    link of that index is then someone else's."""
    with links.iproute() as ipr:
        link = links.get_link(ipr, ifname)
        if link is None:
            raise fail(f"container interface {ifname} has no veth peer: Link not found")
        if link.kind != "veth" or link.peer_index <= 0:
            raise fail(f"container interface {ifname} has no veth peer: interface {ifname} is not a veth")
        # Read after the link: reporting a peer elsewhere is what assigns that namespace an id.
        if link.peer_netnsid is None or link.peer_netnsid != links.netnsid(ipr, host_ns):
            raise fail(f"veth peer of container interface {ifname} is not in host ns")
    return link.peer_index


def _host_interface(request: PluginRequest, prev: Result) -> links.Link:
    if not prev.interfaces:
        raise fail("no interfaces provided")
    host_ns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        peer = netns.run_in(request.netns, _peer_index, request.ifname, host_ns)
    except netns.NetnsError as e:
        raise fail(f'failed to open netns "{request.netns}": {e.strerror}') from e
    finally:
        os.close(host_ns)
    with links.iproute() as ipr:
        link = links.get_link(ipr, index=peer)
    if link is None:
        raise fail(f"veth peer with index {peer} is not in host ns")
    if not any(not i.sandbox and i.name == link.name for i in prev.interfaces):
        raise fail("no veth peer of container interface found in host ns")
    return link


class BandwidthPlugin(Plugin):
    type = "bandwidth"
    supported_versions = tuple(v for v in _version.SUPPORTED if _version.greater_or_equal(v, "0.3.0"))

    def validate(self, request: PluginRequest) -> None:
        load_config(request)

    def _prev(self, request: PluginRequest, message: str) -> Result:
        try:
            prev = prev_result(request)
        except Exception as e:
            raise fail(f"could not parse prevResult: {e}") from e
        if prev is None:
            raise fail(message)
        return prev

    def add(self, request: PluginRequest) -> dict[str, Any]:
        bw = load_config(request)
        if bw is None or not (bw.ingress or bw.egress):
            prev = prev_result(request)
            if prev is None:
                raise fail("must be called as chained plugin")
            return emit(prev, request)
        prev = self._prev(request, "must be called as chained plugin")
        host = _host_interface(request, prev)
        att = attachment(request)
        ifb = ifb_name(att)
        undo: list[Callable[[], Any]] = []
        with links.iproute() as ipr:
            try:
                record = {"attachment": attrs.asdict(att), "host": host.name, "ifb": ifb}
                _records(request).store(att.key, {**record, "ingress": bw.ingress, "egress": bw.egress})
                undo.append(lambda: _records(request).remove(att.key))
                if bw.ingress:
                    with failing("create qdisc"):
                        tc.add_tbf(host.index, tc.tbf_params(bw.ingress_rate, bw.ingress_burst))
                    undo.append(lambda: tc.delete_qdisc(ipr, host.index, ingress=False))
                if bw.egress:
                    with failing("adding link"):
                        links.add_link(ipr, ifb, "ifb", mtu=host.mtu, txqlen=0, up=True)
                    undo.append(lambda: links.delete_link(ifb))
                    ifb_link = links.get_link(ipr, ifb)
                    if ifb_link is None:
                        raise fail(f"get ifb device: {ifb} vanished")
                    with failing("create ingress qdisc"):
                        tc.add_ingress_redirect(ipr, host.index, ifb_link.index)
                    undo.append(lambda: tc.delete_qdisc(ipr, host.index, ingress=True))
                    with failing("create ifb qdisc: create qdisc"):
                        tc.add_tbf(ifb_link.index, tc.tbf_params(bw.egress_rate, bw.egress_burst))
                    prev = attrs.evolve(prev, interfaces=[*prev.interfaces, Interface(ifb, ifb_link.mac)])
            except BaseException:
                for step in reversed(undo):
                    with contextlib.suppress(Exception):
                        step()
                raise
        return emit(prev, request)

    def delete(self, request: PluginRequest) -> None:
        load_config(request)
        att = attachment(request)
        record = _records(request).load(att.key)
        ifb = _ifb_of(record, att)
        try:
            if isinstance(record, dict) and isinstance(record.get("host"), str):
                _remove_host_qdiscs(record)
            if ifb is not None:
                links.delete_link(ifb)
        except links.LinkError as e:
            raise fail(str(e)) from e
        _records(request).remove(att.key)

    def check(self, request: PluginRequest) -> None:
        bw = load_config(request)
        prev = self._prev(request, "must be called as a chained plugin")
        host = _host_interface(request, prev)
        if bw is None or not (bw.ingress or bw.egress):
            return
        with links.iproute() as ipr:
            if bw.ingress:
                _check_tbf(tc.get_tbf(ipr, host.index), bw.ingress_rate, bw.ingress_burst)
            if bw.egress:
                att = attachment(request)
                ifb = _ifb_of(_records(request).load(att.key), att)
                ifb_link = links.get_link(ipr, ifb) if ifb is not None else None
                if ifb_link is None:
                    raise fail("get ifb device: Link not found")
                _check_tbf(tc.get_tbf(ipr, ifb_link.index), bw.egress_rate, bw.egress_burst)
                if tc.ingress_redirect(ipr, host.index) != ifb_link.index:
                    raise fail(f"ingress traffic of {host.name} is not redirected to {ifb}")

    def gc(self, request: PluginRequest) -> GCReport:
        load_config(request)
        network = request.network_name
        keep = {Attachment(network, cid, ifname).key for cid, ifname in valid_attachments(request)}
        removed: list[str] = []
        records = _records(request)
        for name in records.names():
            record = records.load(name)
            if name in keep or not isinstance(record, dict):
                continue
            if (record.get("attachment") or {}).get("network") != network:
                continue
            ifb = _recorded_ifb(record)
            if ifb is not None and links.ifindex(ifb) is not None:
                removed.append(f"ifb {ifb}")
            removed.append(f"pycni state record bandwidth/{name}")
            if dry_run(request):
                continue
            with failing(f"failed to remove {ifb}"):
                _remove_host_qdiscs(record)
                if ifb is not None:
                    links.delete_link(ifb)
            records.remove(name)
        return gc_report(removed)


def _remove_host_qdiscs(record: Mapping[str, Any]) -> None:
    """The tbf and ingress qdiscs ADD put on the recorded host veth, if it is still a veth."""
    with links.iproute() as ipr:
        host = links.get_link(ipr, record["host"])
        if host is None or host.kind != "veth":
            return
        if record.get("ingress"):
            tc.delete_qdisc(ipr, host.index, ingress=False)
        if record.get("egress"):
            tc.delete_qdisc(ipr, host.index, ingress=True)


def _check_tbf(have: tc.TBF | None, rate: int, burst: int) -> None:
    if have is None:
        raise fail("Failed to find qdisc")
    want = tc.tbf_params(rate, burst)
    if have.rate != want.rate:
        raise fail("Rate doesn't match")
    if have.limit != want.limit:
        raise fail("Limit doesn't match")
    if have.buffer != want.buffer:
        raise fail("Buffer doesn't match")

"""loopback: bring ``lo`` up in the container (the reference plugin's behaviour and texts).

``CNI_IFNAME`` is ignored. The result is built at the config's version in the 1.x shape (the
reference does the same: no ``version`` keys even for 0.3.x/0.4.0), unless a prevResult is
passed, which is returned converted to the config's version.

What DEL sets down, and why: the reference's DEL sets ``lo`` down whatever happened before,
so the rollback of an ADD into a namespace another attachment already uses (its ``lo`` up)
would break that attachment. Here each ADD records, under pycni's state dir
(``loopback/<attachment key>``), whether it found ``lo`` down and brought it up. DEL follows
the record when there is one: ``lo`` goes down only if this attachment brought it up. Without
a record (an attachment made by the reference plugin, the state dir lost, a repeated DEL, an
ADD killed before its record) DEL does what the reference does, but only when ``lo`` is the
last interface in the namespace: the chain's other plugins have already deleted what this
attachment made (DEL runs in reverse), so any interface left belongs to another attachment,
which still needs ``lo``. GC removes the records of attachments that are not valid.
"""

from __future__ import annotations

import socket
from typing import Any

import attrs

from pycni import netns
from pycni.sdk import GCReport, Plugin, PluginRequest
from pycni.types import Interface, IPConfig, Result

from ._common import attachment, dry_run, emit, fail, gc_report, in_netns, netns_gone, prev_result, valid_attachments
from .kernel import addressing, batch, links
from .kernel.state import Records

__all__ = ["LoopbackPlugin"]


def _records(request: PluginRequest) -> Records:
    """Per attachment: ``{"attachment", "brought_up"}`` (see the module docstring), under the request's state dir."""
    return Records("loopback", request.state_dir)


def _lo_up() -> tuple[bool, list[Any]]:
    """Bring lo up; whether it was down (its flags: one ioctl), and its addresses: one send
    (set UP, list)."""
    flags = links.flags_of(socket.if_indextoname(links.LOOPBACK_INDEX))
    was_down = flags is None or not flags & batch.IFF_UP
    requests = batch.Requests()
    up = requests.link_set(links.LOOPBACK_INDEX, up=True)
    listed = requests.addr_dump()
    answers = requests.send()
    answers[up].check()
    found = addressing.of_link(answers[listed].check(), links.LOOPBACK_INDEX)
    for addr in found:
        if not addr.ip.is_loopback:
            raise fail(f'loopback interface found with non-loopback address "{addr.ip}"')
    return was_down, found


def _lo_down(only_if_alone: bool) -> None:
    with links.iproute() as ipr:
        if only_if_alone and any(link.index != links.LOOPBACK_INDEX for link in links.dump_links(ipr)):
            return
        links.set_down(ipr, links.LOOPBACK_INDEX)


def _lo_is_up() -> bool:
    with links.iproute() as ipr:
        lo = links.get_link(ipr, index=links.LOOPBACK_INDEX)
        return lo is not None and lo.up


class LoopbackPlugin(Plugin):
    type = "loopback"

    def add(self, request: PluginRequest) -> dict[str, Any]:
        att = attachment(request)
        was_down, addrs = in_netns(request.netns, _lo_up, here=True)  # its one socket closes in there
        # Written after: a crash before it leaves no record, and DEL's rule without one holds.
        _records(request).store(att.key, {"attachment": attrs.asdict(att), "brought_up": was_down})
        prev = prev_result(request)
        if prev is not None:
            return emit(prev, request)
        v4 = [a for a in addrs if a.version == 4][:1]
        v6 = [a for a in addrs if a.version == 6][:1]
        result = Result(
            request.cni_version,
            interfaces=[Interface("lo", "00:00:00:00:00:00", sandbox=request.netns)],
            ips=[IPConfig(a, interface=0) for a in v4 + v6],
        )
        return result.to_json()

    def delete(self, request: PluginRequest) -> None:
        key = attachment(request).key
        record = _records(request).load(key)
        if request.netns and (not isinstance(record, dict) or record.get("brought_up") is not False):
            try:
                netns.run_in(request.netns, _lo_down, not isinstance(record, dict))
            except netns.NetnsError as e:
                if not netns_gone(e):
                    raise
        _records(request).remove(key)

    def gc(self, request: PluginRequest) -> GCReport:
        """Remove the records of this network's attachments not in ``cni.dev/valid-attachments``
        (``lo`` itself is left alone: its namespace is gone or still used)."""
        valid = valid_attachments(request)
        removed = []
        records = _records(request)
        for name in records.names():
            record = records.load(name)
            att = record.get("attachment") if isinstance(record, dict) else None
            if not isinstance(att, dict) or att.get("network") != request.network_name:
                continue
            if (att.get("container_id"), att.get("ifname")) in valid:
                continue
            removed.append(f"pycni state record loopback/{name} of {att.get('container_id')}/{att.get('ifname')}")
            if not dry_run(request):
                records.remove(name)
        return gc_report(removed)

    def check(self, request: PluginRequest) -> None:
        if not in_netns(request.netns, _lo_is_up):
            raise fail("loopback interface is down")

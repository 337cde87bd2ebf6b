"""loopback: bring ``lo`` up in the container (the reference plugin's behaviour and texts).

``CNI_IFNAME`` is ignored. The result is built at the config's version in the 1.x shape (the
reference does the same: no ``version`` keys even for 0.3.x/0.4.0), unless a prevResult is
passed, which is returned converted to the config's version.
"""

from __future__ import annotations

from typing import Any

from pycni import netns
from pycni.plugin import Plugin, PluginRequest
from pycni.types import Interface, IPConfig, Result

from ._common import emit, fail, in_netns, netns_gone, prev_result
from .kernel import links

__all__ = ["LoopbackPlugin"]


def _lo_up() -> list[Any]:
    with links.iproute() as ipr:
        links.set_up(ipr, links.LOOPBACK_INDEX)
        found = [addr for addr, _ in links.addresses(ipr, links.LOOPBACK_INDEX)]
    for addr in found:
        if not addr.ip.is_loopback:
            raise fail(f'loopback interface found with non-loopback address "{addr.ip}"')
    return found


def _lo_down() -> None:
    with links.iproute() as ipr:
        links.set_down(ipr, links.LOOPBACK_INDEX)


def _lo_is_up() -> bool:
    with links.iproute() as ipr:
        lo = links.get_link(ipr, index=links.LOOPBACK_INDEX)
        return lo is not None and lo.up


class LoopbackPlugin(Plugin):
    type = "loopback"

    def add(self, request: PluginRequest) -> dict[str, Any]:
        addrs = in_netns(request.netns, _lo_up)
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
        if not request.netns:
            return
        try:
            netns.run_in(request.netns, _lo_down)
        except netns.NetnsError as e:
            if not netns_gone(e):
                raise

    def check(self, request: PluginRequest) -> None:
        if not in_netns(request.netns, _lo_is_up):
            raise fail("loopback interface is down")

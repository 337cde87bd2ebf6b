"""Helpers the netlink/nftables plugins share: errors, config fields, results, attachments."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pycni import netns
from pycni._json import GoReader, go_field
from pycni.errors import CNIError
from pycni.sdk import Attachment, GCAttachment, GCReport, PluginRequest, delegate, ifname_problem
from pycni.types import Result, convert, parse_result

from .kernel.errors import fail, failing, netns_gone

__all__ = [
    "fail",
    "failing",
    "in_netns",
    "open_container",
    "netns_gone",
    "Fields",
    "ipam_result",
    "prev_result",
    "emit",
    "attachment",
    "is_link_name",
    "left_behind",
    "DRY_RUN_KEY",
    "dry_run",
    "valid_attachments",
    "gc_report",
    "finish_gc",
]

_CURRENT = "1.1.0"
#: GC stdin key (pycni extension): report what would be collected, change nothing.
DRY_RUN_KEY = "pycni.dev/dry-run"
T = TypeVar("T")


def in_netns(path: str | int, fn: Callable[..., T], *args: Any, here: bool = False) -> T:
    """:func:`pycni.netns.run_in` (``here``: :func:`pycni.netns.call_in`, for work that keeps no
    socket), with a namespace that cannot be entered reported as a CNI error."""
    try:
        return (netns.call_in if here else netns.run_in)(path, fn, *args)
    except netns.NetnsError as e:
        raise fail(e.strerror or str(e)) from e


def open_container(request: PluginRequest) -> int:
    """An fd (the caller closes it) of the container's namespace, ``CNI_NETNS``; one that cannot
    be opened is the reference's ``failed to open netns`` error."""
    try:
        return netns.open_netns(request.netns)
    except netns.NetnsError as e:
        raise fail(f'failed to open netns "{request.netns}": {e.strerror}') from e


class Fields(GoReader):
    """Typed reads of a plugin's JSON config (:class:`pycni._json.GoReader`); type errors read
    like Go's ``json.Unmarshal``, wrapped in ``prefix`` (``failed to load netconf``) as the
    reference plugins wrap them, with code 999."""

    __slots__ = ("prefix",)

    def __init__(self, config: Mapping[str, Any], prefix: str) -> None:
        super().__init__(config, error=lambda e: self.error(e.go_message()))
        self.prefix = prefix

    def error(self, msg: str) -> CNIError:
        return fail(f"{self.prefix}: {msg}")


def _as_current(data: Any, version: str) -> Result:
    result = convert(parse_result(data, config_version=version), _CURRENT)
    assert isinstance(result, Result)
    return result


def ipam_result(data: Any, request: PluginRequest) -> Result:
    """A delegated IPAM plugin's ADD output, as a current (1.1.0) result."""
    return _as_current(data, request.cni_version)


def prev_result(request: PluginRequest) -> Result | None:
    """``prevResult`` as a current (1.1.0) result (``None`` if absent)."""
    prev = request.prev_result
    return None if prev is None else _as_current(prev, request.cni_version)


def emit(result: Result, request: PluginRequest) -> dict[str, Any]:
    """The result as the JSON object to print at the config's ``cniVersion``."""
    return convert(result, request.cni_version).to_json()


def is_link_name(name: str) -> bool:
    """Whether a link name a config chooses (a bridge, a VRF) may be used: an interface name
    (:func:`pycni.sdk.ifname_problem`) without ``"`` or ``\\`` as well."""
    return ifname_problem(name) is None and '"' not in name and "\\" not in name


def attachment(request: PluginRequest) -> Attachment:
    return Attachment(request.network_name, request.container_id, request.ifname)


def left_behind(request: PluginRequest, prev: Result, plugin: str) -> str:
    """For a chained plugin's refusal: it changed nothing, but what the earlier plugins of the
    chain set up stays (no rollback by default) until a DEL of the attachment removes it."""
    names = ", ".join(i.name for i in prev.interfaces) or "none"
    addrs = ", ".join(str(ip.address) for ip in prev.ips) or "none"
    return (
        f"{plugin} changed nothing; what the earlier plugins set up for {request.container_id}/{request.ifname} "
        f"(interfaces: {names}; addresses: {addrs}) is still in place unless the runtime rolls the ADD "
        "back: a DEL of this attachment removes it"
    )


def dry_run(request: PluginRequest) -> bool:
    """Whether a GC request only asks what would be collected (``pycni.dev/dry-run``)."""
    return request.config.get(DRY_RUN_KEY) is True


def valid_attachments(request: PluginRequest) -> set[tuple[str, str]]:
    """GC's ``cni.dev/valid-attachments`` (or the older ``cni.dev/attachments``) as
    ``{(containerID, ifname)}``. Absent or null means none is valid, as for the Go plugins
    (cnitool's GC after it has DEL'd every cached attachment)."""
    listed = go_field(request.config, "cni.dev/valid-attachments")
    if listed is None:
        listed = go_field(request.config, "cni.dev/attachments")
    if listed is None:
        return set()
    if not isinstance(listed, list):
        raise fail("invalid cni.dev/valid-attachments: expected an array")
    return {(a.container_id, a.ifname) for a in map(GCAttachment.from_json, listed)}


def gc_report(removed: list[str]) -> GCReport:
    """What a built-in plugin's ``gc`` returns (pycni extension; an exec'd plugin prints nothing)."""
    return GCReport(tuple(removed))


def finish_gc(request: PluginRequest, ipam_type: str, removed: list[str], errors: list[str]) -> GCReport:
    """The end of an interface plugin's GC: the IPAM plugin's GC (its report added), then one
    error naming every failure (and what was removed anyway), or the report."""
    if ipam_type:
        try:
            removed = removed + list(GCReport.from_json(delegate(request, ipam_type, "GC")).removed)
        except CNIError as e:
            errors = [*errors, f"IPAM GC failed: {e.msg}"]
    if errors:
        raise fail("; ".join(errors), "removed: " + ", ".join(removed) if removed else "")
    return gc_report(removed)

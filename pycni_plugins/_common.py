"""Helpers the netlink/nftables plugins share: errors, config fields, results, attachments."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pycni import netns
from pycni._json import go_field, go_kind
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import Attachment, GCAttachment, GCReport, PluginRequest, delegate, ifname_problem
from pycni.types import Result, convert, parse_result

from .kernel import links, nft
from .kernel.errors import fail, failing, netns_gone

__all__ = [
    "fail",
    "failing",
    "add_with_undo",
    "add_veth",
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
    "gc_veths",
    "nftables_status",
]

_CURRENT = "1.1.0"
VETH_RETRIES = 10
#: GC stdin key (pycni extension): report what would be collected, change nothing.
DRY_RUN_KEY = "pycni.dev/dry-run"
T = TypeVar("T")


def in_netns(path: str | int, fn: Callable[..., T], *args: Any) -> T:
    """:func:`pycni.netns.run_in`, with a namespace that cannot be entered reported as a CNI error."""
    try:
        return netns.run_in(path, fn, *args)
    except netns.NetnsError as e:
        raise fail(e.strerror or str(e)) from e


def open_container(request: PluginRequest) -> int:
    """An fd (the caller closes it) of the container's namespace, ``CNI_NETNS``; one that cannot
    be opened is the reference's ``failed to open netns`` error."""
    try:
        return netns.open_netns(request.netns)
    except netns.NetnsError as e:
        raise fail(f'failed to open netns "{request.netns}": {e.strerror}') from e


def add_with_undo(
    request: PluginRequest, body: Callable[[Any, int, list[Callable[[], Any]]], Result]
) -> dict[str, Any]:
    """An interface plugin's ADD: ``body(ipr, netns_fd, undo)`` runs with the container's netns
    open and one netlink socket; on any failure the steps it registered in ``undo`` run in
    reverse (each failure suppressed), so a failed ADD leaves only what a DEL would clean."""
    fd = open_container(request)
    undo: list[Callable[[], Any]] = []
    try:
        with links.iproute() as ipr:
            result = body(ipr, fd, undo)
    except BaseException as e:
        for step in reversed(undo):
            with contextlib.suppress(Exception):
                step()
        if isinstance(e, links.LinkError):
            raise fail(str(e)) from e
        raise
    finally:
        os.close(fd)
    return emit(result, request)


def add_veth(
    ipr: Any,
    request: PluginRequest,
    fd: int,
    container_mac: str,
    mtu: int,
    master: int | None,
    record: Callable[[str, int], None],
) -> tuple[str, str]:
    """A veth whose container end is ``request.ifname`` in the namespace ``fd``, its host end a
    random name (another one on a clash) with a random MAC; returns the host end's name and MAC.
    ``record(host_name, attempt)`` runs before each attempt, so that a crash right after leaves
    no veth nobody can map."""
    host_mac = links.random_mac()
    for attempt in range(VETH_RETRIES):
        host_name = links.random_veth_name()
        record(host_name, attempt)
        try:
            links.add_veth(
                ipr,
                host_name,
                host_mac,
                peer_name=request.ifname,
                peer_netns_fd=fd,
                peer_mac=container_mac,
                mtu=mtu,
                master=master,
            )
            return host_name, host_mac
        except links.LinkError as e:
            if e.errno != errno.EEXIST:
                raise fail(f"failed to make veth pair: {e.strerror}") from e
            if links.ifindex(host_name) is None:
                raise fail(
                    f'container veth name ("{request.ifname}") peer provided ("{host_name}") already exists'
                ) from e
    raise fail(f"failed to find a free veth name after {VETH_RETRIES} attempts")


class Fields:
    """Typed reads of a plugin's JSON config; type errors read like Go's ``json.Unmarshal``.

    ``prefix`` wraps every error (``failed to load netconf``), as the reference plugins do.
    """

    def __init__(self, config: Mapping[str, Any], prefix: str) -> None:
        self.config = config
        self.prefix = prefix

    def error(self, msg: str) -> CNIError:
        return fail(f"{self.prefix}: {msg}")

    def _typed(self, key: str, kind: type[T], go: str, default: T, source: Mapping[str, Any] | None) -> T:
        value = go_field(self.config if source is None else source, key)
        if value is None:
            return default
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise self.error(f"json: cannot unmarshal {go_kind(value)} into Go struct field .{key} of type {go}")
        return value

    def flag(self, key: str, default: bool = False, source: Mapping[str, Any] | None = None) -> bool:
        return self._typed(key, bool, "bool", default, source)

    def integer(self, key: str, default: int = 0, source: Mapping[str, Any] | None = None) -> int:
        return self._typed(key, int, "int", default, source)

    def string(self, key: str, default: str = "", source: Mapping[str, Any] | None = None) -> str:
        return self._typed(key, str, "string", default, source)

    def mapping(self, key: str, source: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
        return self._typed(key, dict, "object", {}, source)

    def array(self, key: str, source: Mapping[str, Any] | None = None) -> list[Any]:
        return self._typed(key, list, "array", [], source)


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


def gc_veths(
    request: PluginRequest,
    collect_links: Callable[[str, set[str], bool, list[str], list[str]], None],
    collect_nft: Callable[[set[tuple[str, str]], bool], list[str]],
    ipam_type: str,
) -> GCReport:
    """GC of a plugin that gives each attachment a host veth (bridge, ptp), for the attachments
    of its network not in ``cni.dev/valid-attachments``: their links and records
    (``collect_links``, :meth:`.kernel.owned.LinkRecords.collect`), their nftables elements
    (``collect_nft(valid, dry_run)``), then the IPAM plugin's GC. Every step runs; their
    failures are raised together, with what was removed as details. ``pycni.dev/dry-run`` only
    reports."""
    valid = valid_attachments(request)
    dry = dry_run(request)
    network = request.network_name
    removed: list[str] = []
    errors: list[str] = []
    collect_links(network, {Attachment(network, cid, ifname).key for cid, ifname in valid}, dry, removed, errors)
    try:
        removed += collect_nft(valid, dry)
    except nft.NftError as e:
        errors.append(f"failed to collect nftables elements: {e.msg}")
    return finish_gc(request, ipam_type, removed, errors)


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


def nftables_status() -> None:
    """STATUS of an nftables plugin: code 50 (plugin not available) unless libnftables loads and
    answers in the calling thread's namespace."""
    try:
        import nftables

        rc, _, err = nftables.Nftables().cmd("list tables")
    except Exception as e:  # ImportError, OSError from dlopen, anything the binding raises
        raise CNIError("nftables is not usable", f"libnftables: {e}", code=ErrorCode.PLUGIN_NOT_AVAILABLE) from e
    if rc != 0:
        raise CNIError(
            "nftables is not usable", f"libnftables: {err.strip() or rc}", code=ErrorCode.PLUGIN_NOT_AVAILABLE
        )

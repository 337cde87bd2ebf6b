"""The firewall plugin's firewalld step: container addresses as sources of a firewalld zone.

firewalld's ``table inet firewalld`` rejects forwarded traffic from interfaces outside its zones
(``reject with icmpx admin-prohibited``), and pycni's own accepts cannot overrule another table
(see :mod:`.kernel.hostfw`). What firewalld honours is a zone: as the Go firewall plugin's
``firewalld`` backend does, each container address (``/32``, ``/128``) becomes a source of
``firewalldZone`` (default ``trusted``, whose target is ACCEPT) over firewalld's D-Bus API
(:mod:`.kernel.firewalld`), and is removed on DEL. pycni's own nftables elements are added as well.

* ``"backend": "firewalld"``: always; firewalld not running on the system bus is an error.
* any other backend: automatically, when firewalld runs and the judge finds
  ``table inet firewalld`` dropping the container's egress (checked per container address, so
  once its sources are in the zone the judge finds nothing).

What was added is recorded under the state dir (``firewalld/<attachment key>``: network,
container, ifname, zone, sources), so DEL removes exactly that, CHECK says which source is
missing, GC removes the sources of attachments no longer valid and re-adds the lost sources of
valid ones (a ``firewall-cmd --reload`` drops runtime sources: ``pycni gc --reconcile``, or a
daemon calling :func:`restore` on firewalld's ``Reloaded`` signal, puts them back).
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from pycni.errors import CNIError, ErrorCode
from pycni.sdk import PluginRequest, environ
from pycni.types.current import Result

from ._common import Fields, attachment, fail, prev_result
from .kernel import firewalld, hostfw, nfnl, nft
from .kernel.state import Records

__all__ = [
    "BACKEND",
    "DEFAULT_ZONE",
    "options",
    "record",
    "add",
    "check",
    "delete",
    "gc",
    "status",
    "restore",
    "heal_on_reload",
]

BACKEND = "firewalld"
DEFAULT_ZONE = "trusted"
_SUB = "firewalld"
_TABLE = "table inet firewalld "


def _records(state_dir: str) -> Records:
    return Records(_SUB, state_dir)


def options(request: PluginRequest) -> tuple[str, str]:
    """``(backend, firewalldZone)`` of the firewall config (the zone defaults to ``trusted``)."""
    f = Fields(request.config, "failed to load netconf")
    return f.string("backend") or "", f.string("firewalldZone") or DEFAULT_ZONE


def record(request: PluginRequest) -> dict[str, Any] | None:
    """The attachment's firewalld record (None: no source was added for it)."""
    rec = _records(request.state_dir).load(attachment(request).key)
    return rec if isinstance(rec, dict) else None


def _sources(prev: Result) -> list[str]:
    return list(dict.fromkeys(firewalld.source_of(ip.address.ip) for ip in prev.ips))


def _rejected(prev: Result) -> bool:
    """Whether the judge finds firewalld's table certainly dropping the container's egress
    (judged for the container's own addresses, on the interface the bridge plugin reported)."""
    if not prev.interfaces or not prev.ips or not _bus_present() or not _firewalld_table():
        return False
    hosts = tuple(ipaddress.ip_network(f"{ip.address.ip}/{ip.address.max_prefixlen}") for ip in prev.ips)
    try:
        found = hostfw.inspect(hostfw.Target(prev.interfaces[0].name, hosts), ("egress",))
    except (nft.NftError, OSError):
        return False
    return any(f.certain and f.where.startswith(_TABLE) for f in found)


def _firewalld_table() -> bool:
    """Whether the calling thread's namespace has firewalld's ``table inet firewalld`` (one
    lookup: on a host without it, ADD reads no ruleset and asks no bus)."""
    try:
        with nfnl.reading("inet") as reader:
            return reader.has_table("firewalld")
    except nfnl.NetlinkError:
        return False


def _bus() -> str:
    """The system bus of this plugin invocation (``DBUS_SYSTEM_BUS_ADDRESS`` of its environment)."""
    return firewalld.bus_address(environ())


def _bus_present() -> bool:
    """Whether the system bus's socket exists (a path address): without a bus there is no
    firewalld to ask, and the judge need not read the ruleset on ADD."""
    address = _bus()
    path = address.removeprefix("unix:path=").split(",", 1)[0]
    return not address.startswith("unix:path=") or os.path.exists(path)


def add(request: PluginRequest, prev: Result, backend: str, zone: str) -> None:
    """ADD's firewalld step (see the module docstring): nothing unless ``backend`` is firewalld
    or firewalld rejects the container's egress."""
    forced = backend == BACKEND
    if not forced and not _rejected(prev):
        return
    sources = _sources(prev)
    if not sources:
        return
    try:
        with firewalld.session(_bus()) as bus:
            att = attachment(request)
            rec = {
                "network": att.network,
                "container": att.container_id,
                "ifname": att.ifname,
                "zone": zone,
                "sources": sources,
            }
            # Recorded first: a crash between the two leaves what DEL and GC can find.
            _records(request.state_dir).store(att.key, rec)
            for source in sources:
                bus.add_source(zone, source)
    except firewalld.FirewalldError as e:
        if e.unavailable and not forced:
            return  # firewalld went away: the bridge plugin's CHECK names what drops, if anything
        where = f"firewalld (system bus {_bus()})"
        raise fail(f"failed to add the container's addresses to {where} zone {zone}: {e.msg}") from e


def check(request: PluginRequest, prev: Result, backend: str, zone: str) -> None:
    """CHECK: every recorded source is bound to its zone (for ``backend: firewalld``, every
    address of prevResult is)."""
    rec = record(request)
    if rec is None:
        if backend != BACKEND:
            return
        rec = {"zone": zone, "sources": _sources(prev)}
    want_zone = str(rec.get("zone", zone))
    try:
        with firewalld.session(_bus()) as bus:
            lost = [s for s in rec.get("sources", ()) if bus.zone_of_source(str(s)) != want_zone]
    except firewalld.FirewalldError as e:
        raise fail(f"cannot check firewalld zone {want_zone}: {e.msg}") from e
    if lost:
        raise fail(
            f"firewalld zone {want_zone} lacks the source(s) {', '.join(map(str, lost))} of this container",
            f"a firewalld reload drops sources added at runtime: {nft.reconcile_hint(request.network_name)}"
            " (the daemon does it by itself)",
        )


def delete(request: PluginRequest, backend: str, zone: str) -> None:
    """DEL: remove the recorded sources, and the record. Without one, ``backend: firewalld``
    removes prevResult's addresses from the zone (an attachment the Go plugin made). firewalld
    not running is no error (its runtime sources went with it)."""
    store = _records(request.state_dir)
    key = attachment(request).key
    rec = store.load(key)
    if isinstance(rec, dict):
        zone, sources = str(rec.get("zone", zone)), [str(s) for s in rec.get("sources", ())]
        # Under the lock a heal takes too: it never sees the record without the sources.
        with store.locked():
            _unbind(zone, sources)
            store.remove(key)
    elif backend == BACKEND and (prev := _prev_or_none(request)) is not None:
        _unbind(zone, _sources(prev))


def status(backend: str) -> None:
    """STATUS: with ``backend: firewalld``, firewalld must be running on the system bus (code
    50, plugin not available, otherwise)."""
    if backend != BACKEND:
        return
    try:
        with firewalld.session(_bus()):
            pass
    except firewalld.FirewalldError as e:
        raise CNIError("firewalld is not available", e.msg, code=ErrorCode.PLUGIN_NOT_AVAILABLE) from e


def _prev_or_none(request: PluginRequest) -> Result | None:
    """DEL's prevResult, if it can be read (DEL never fails on it)."""
    try:
        return prev_result(request)
    except CNIError:
        return None


def _unbind(zone: str, sources: Sequence[str]) -> None:
    try:
        with firewalld.session(_bus()) as bus:
            for source in sources:
                bus.remove_source(zone, source)
    except firewalld.FirewalldError as e:
        if not e.unavailable:
            raise fail(f"failed to remove the container's addresses from firewalld zone {zone}: {e.msg}") from e


def gc(network: str, valid: Collection[tuple[str, str]], *, state_dir: str, dry_run: bool) -> list[str]:
    """GC: remove the sources (and records) of ``network``'s attachments not in ``valid``;
    unless ``dry_run``, re-add the lost sources of the valid ones. What was done, as text."""
    store = _records(state_dir)
    out: list[str] = []
    for name in store.names():
        rec = store.load(name)
        if not isinstance(rec, dict) or rec.get("network") != network:
            continue
        who = f"{rec.get('container')}/{rec.get('ifname')}"
        zone, sources = str(rec.get("zone")), [str(s) for s in rec.get("sources", ())]
        if (rec.get("container"), rec.get("ifname")) in valid:
            continue
        if not dry_run:
            try:
                with store.locked():
                    _unbind(zone, sources)
                    store.remove(name)
            except CNIError as e:
                out.append(f"could not remove firewalld sources of {who}: {e.msg}")
                continue
        out += [f"firewalld zone {zone} source {s} of {who}" for s in sources]
    if not dry_run:
        out += restore(state_dir, network)
    return out


def restore(state_dir: str, network: str | None = None, *, address: str | None = None) -> list[str]:
    """Re-add every recorded source (of ``network``, or of all networks) firewalld lost, as after
    a ``firewall-cmd --reload``; what was restored. firewalld not running restores nothing.
    A daemon may call this on firewalld's ``Reloaded`` signal (:func:`heal_on_reload`). One
    ``getSources`` per zone; only the missing sources are added."""
    store = _records(state_dir)
    if not store.names():
        return []
    with store.locked():  # a DEL's removal of sources and record is never seen half done
        return _restore(store, network, address)


def _restore(store: Records, network: str | None, address: str | None) -> list[str]:
    wanted: list[tuple[str, str, str]] = []
    for name in store.names():
        rec = store.load(name)
        if not isinstance(rec, dict) or (network is not None and rec.get("network") != network):
            continue
        who = f"{rec.get('container')}/{rec.get('ifname')}"
        wanted += [(str(rec.get("zone")), str(s), who) for s in rec.get("sources", ())]
    if not wanted:
        return []
    out: list[str] = []
    try:
        with firewalld.session(address or _bus()) as bus:
            present: dict[str, set[str]] = {}
            for zone, source, who in wanted:
                try:
                    if zone not in present:
                        present[zone] = set(bus.sources(zone))
                    if source not in present[zone] and bus.add_source(zone, source):
                        out.append(f"restored firewalld zone {zone} source {source} of {who}")
                except firewalld.FirewalldError as e:
                    out.append(f"could not restore firewalld zone {zone} source {source} of {who}: {e.msg}")
    except firewalld.FirewalldError:
        return out
    return out


def heal_on_reload(
    state_dir: str,
    stop: threading.Event,
    log: Callable[[str], None],
    *,
    address: str | None = None,
    retry: float = 5.0,
) -> None:
    """Until ``stop`` is set: wait for firewalld's ``Reloaded`` signal and :func:`restore` every
    recorded source, logging one line per restore that put something back (what, how long
    after the signal) — what ``pycni serve`` runs in a thread so a ``firewall-cmd --reload``
    costs a container its network only until the signal arrives. Without a bus or firewalld it
    tries again every ``retry`` seconds (a restore follows each reconnection: firewalld may have
    restarted meanwhile)."""

    def heal(cause: str) -> None:
        since = time.monotonic()
        lines = restore(state_dir, address=address)
        if lines:
            log(f"{'; '.join(lines)} ({(time.monotonic() - since) * 1000:.1f} ms after {cause})")

    while not stop.is_set():
        try:
            with firewalld.Reloads(address) as reloads:
                heal("connecting to the bus")
                while not stop.is_set():
                    if reloads.wait(timeout=0.5):
                        heal("firewalld's Reloaded signal")
        except firewalld.FirewalldError:
            stop.wait(retry)

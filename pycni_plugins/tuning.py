"""tuning: sysctls and link attributes of the container interface (a chained meta plugin).

Config keys, CNI_ARGS, ``runtimeConfig.mac``, ``args.cni``, result and error texts follow
containernetworking/plugins v1.9.1: ``sysctl`` (a map; ``.`` and ``/`` both separate the
path, ``IFNAME`` is replaced by ``CNI_IFNAME``, only ``/proc/sys/net/...`` is allowed), ``mac``,
``mtu``, ``promisc``, ``allmulti``, ``txQLen`` and ``dataDir``; ``MAC=`` in CNI_ARGS and
``runtimeConfig.mac`` (the ``mac`` capability) override ``mac``, ``args.cni`` overrides
everything; the sysctl allowlist ``/etc/cni/tuning/allowlist.conf`` (regular expressions, one a
line) applies when it exists. The prevResult is returned, with the new MAC on the interface
named ``CNI_IFNAME``. DEL restores the MAC, MTU, promiscuous and all-multicast modes and
transmit queue length ADD changed (sysctls are not restored, as upstream); GC and STATUS do
nothing upstream.

Debian's 1.1.1 lacks ``txQLen``, the allowlist and the duplicate-key check; pycni follows
v1.9.1 (also where 1.1.1 quotes a refused sysctl key with its dots, and where its CHECK does not
replace ``IFNAME``). Where pycni differs, on purpose:

* every sysctl name is resolved and checked, and every sysctl file must exist, before anything
  is written (upstream writes them one by one in map order and stops at the first bad one,
  leaving the earlier ones written); a bad MAC or a negative MTU/txQLen is refused before
  anything changes (upstream: after the sysctls are written);
* a failing ADD puts back what it had changed (sysctls and link attributes) and removes its
  backup record: nothing is left half-applied;
* duplicate keys in ``sysctl`` are not detected: the config reaches the plugin decoded (the
  last one wins); upstream refuses them;
* the backup is a pycni state record (``tuning/<containerID>_<ifname>`` below
  the request's state dir, or below ``<dataDir>/tuning/`` when ``dataDir`` is set), and a second
  ADD of the same attachment keeps the values the first one saved (upstream overwrites them
  with the already-tuned ones). DEL removes the record also when the namespace or the interface
  is gone (upstream leaves the file behind), and GC removes the records of this network's
  attachments not in ``cni.dev/valid-attachments``;
* CHECK compares the MAC case-insensitively (upstream fails CHECK for a MAC given in upper case).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from typing import Any

import attrs

from pycni._json import go_kind
from pycni.sdk import GCReport, Plugin, PluginRequest

from ._common import (
    Fields,
    dry_run,
    emit,
    fail,
    failing,
    gc_report,
    in_netns,
    netns_gone,
    prev_result,
    valid_attachments,
)
from .kernel import links, sysctl
from .kernel.state import Records

__all__ = ["TuningConfig", "TuningPlugin", "load_config", "sysctl_path", "ALLOWLIST"]

#: The upstream sysctl allowlist: regular expressions, one a line (no file: no restriction).
ALLOWLIST = "/etc/cni/tuning/allowlist.conf"
_NO_PREV = "Required prevResult missing"
_MAC_FORMS = (
    re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}"),
    re.compile(r"[0-9a-fA-F]{2}(-[0-9a-fA-F]{2}){5}"),
    re.compile(r"[0-9a-fA-F]{4}(\.[0-9a-fA-F]{4}){2}"),
)


@attrs.frozen
class TuningConfig:
    sysctl: tuple[tuple[str, str], ...] = ()
    mac: str = ""
    promisc: bool = False
    mtu: int = 0
    tx_qlen: int | None = None
    allmulti: bool | None = None
    data_dir: str = ""

    @property
    def changes_link(self) -> bool:
        return bool(self.mac or self.mtu or self.promisc or self.allmulti is not None or self.tx_qlen is not None)


def _mac(text: str) -> str:
    """A 6-byte MAC in any of Go's ``net.ParseMAC`` forms, as ``aa:bb:cc:dd:ee:ff``."""
    if not any(form.fullmatch(text) for form in _MAC_FORMS):
        raise fail(f"invalid args {text} for MAC addr: address {text}: invalid MAC address")
    digits = re.sub(r"[:.\-]", "", text).lower()
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


def _sysctls(f: Fields, source: Mapping[str, Any] | None, where: str) -> dict[str, str]:
    table = f.mapping("sysctl", source=source)
    for value in table.values():
        if not isinstance(value, str):
            kind = go_kind(value)
            raise f.error(f"json: cannot unmarshal {kind} into Go struct field {where}.sysctl of type string")
    return dict(table)


def load_config(request: PluginRequest) -> TuningConfig:
    """The tuning config with CNI_ARGS, runtimeConfig and ``args.cni`` applied (upstream's order)."""
    f = Fields(request.config, "failed to load netconf")
    sysctls = _sysctls(f, None, "TuningConf")
    mac = f.string("mac")
    promisc = f.flag("promisc")
    mtu = f.integer("mtu")
    tx_qlen = f.integer("txQLen") if request.config.get("txQLen") is not None else None
    allmulti = f.flag("allmulti") if request.config.get("allmulti") is not None else None
    data_dir = f.string("dataDir")
    env_mac = request.load_args("MAC").get("MAC", "")
    mac = env_mac or mac
    mac = f.string("mac", source=request.runtime_config) or mac
    cni = f.mapping("cni", source=f.mapping("args"))
    if cni.get("sysctl") is not None:
        sysctls.update(_sysctls(f, cni, "IPAMArgs"))
    if cni.get("mac") is not None:
        mac = f.string("mac", source=cni)
    if cni.get("promisc") is not None:
        promisc = f.flag("promisc", source=cni)
    if cni.get("mtu") is not None:
        mtu = f.integer("mtu", source=cni)
    if cni.get("allmulti") is not None:
        allmulti = f.flag("allmulti", source=cni)
    if cni.get("txQLen") is not None:
        tx_qlen = f.integer("txQLen", source=cni)
    if mac:
        _mac(mac)
    if mtu < 0:
        raise fail(f"invalid MTU {mtu}: must not be negative")
    if tx_qlen is not None and not 0 <= tx_qlen < 2**32:
        raise fail(f"invalid txQLen {tx_qlen}: must be between 0 and {2**32 - 1}")
    return TuningConfig(tuple(sysctls.items()), mac, promisc, mtu, tx_qlen, allmulti, data_dir)


def sysctl_path(key: str, ifname: str) -> str:
    """The sysctl ``key`` as a path below ``/proc/sys`` (``net/...``), or the upstream error.

    Dots and slashes both separate; ``IFNAME`` (first occurrence) becomes the interface name,
    after the dots are replaced, so an interface name with dots stays one component. So
    ``net/../kernel/x`` is ``net/kernel/x``, which does not exist: nothing outside
    ``/proc/sys/net`` can be named.
    """
    path = key.replace(".", "/").replace("IFNAME", ifname, 1)
    # No ".." can survive: the dots became separators, and an interface name has no "/".
    parts = [p for p in path.split("/") if p]
    if len(parts) < 2 or parts[0] != "net":
        raise fail(f'invalid net sysctl key: "{path}"')
    return "/".join(parts)


def _allowlist() -> list[str] | None:
    try:
        with open(ALLOWLIST) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return None
    except OSError as e:
        raise fail(f"open {ALLOWLIST}: {e.strerror}") from e


def _validate(request: PluginRequest) -> tuple[TuningConfig, list[tuple[str, str]]]:
    conf = load_config(request)
    if "/" in request.ifname:
        raise fail(f"Interface name ({request.ifname}) contains an invalid character /")
    allowed = _allowlist()
    resolved = []
    for key, value in conf.sysctl:
        if allowed is not None:
            try:
                ok = any(re.search(pattern, key) for pattern in allowed)
            except re.error as e:
                raise fail(f"error parsing regexp in {ALLOWLIST}: {e}") from e
            if not ok:
                listed = " ".join(allowed)
                raise fail(f"Sysctl {key} is not allowed. Only the following sysctls are allowed: [{listed}]")
        resolved.append((sysctl_path(key, request.ifname), value))
    return conf, resolved


def _records(request: PluginRequest, conf: TuningConfig) -> Records:
    return Records("tuning", os.path.join(conf.data_dir, "tuning") if conf.data_dir else request.state_dir)


def _record_name(request: PluginRequest) -> str:
    return f"{request.container_id}_{request.ifname}"


# --- container side (runs in a thread inside the container's namespace) -------------------------


def _get(ipr: Any, ifname: str) -> links.Link:
    link = links.get_link(ipr, ifname)
    if link is None:
        raise fail(f'failed to get "{ifname}": Link not found')
    return link


def _saved(conf: TuningConfig, link: links.Link) -> dict[str, Any]:
    """What DEL restores: the current value of each attribute the config changes."""
    out: dict[str, Any] = {}
    if conf.mac:
        out["mac"] = link.mac
    if conf.promisc:
        out["promisc"] = link.promisc
    if conf.mtu:
        out["mtu"] = link.mtu
    if conf.allmulti is not None:
        out["allmulti"] = bool(link.flags & links.IFF_ALLMULTI)
    if conf.tx_qlen is not None:
        out["txQLen"] = link.txqlen
    return out


_WHAT = {
    "mac": "MAC address",
    "promisc": "promiscuous mode",
    "mtu": "MTU",
    "allmulti": "all-multicast mode",
    "txQLen": "transmit queue length",
}
_FLAGS = {"promisc": links.IFF_PROMISC, "allmulti": links.IFF_ALLMULTI}


def _set(ipr: Any, link: links.Link, values: Mapping[str, Any]) -> None:
    """Set the attributes in ``values`` (keys as in :func:`_saved`), in upstream's order."""
    for key in _WHAT:
        if key not in values:
            continue
        value = values[key]
        with failing(f'failed to set {_WHAT[key]} of "{link.name}" to {value}'):
            if key == "mac":
                links.set_link(ipr, link.index, address=_mac(value))
            elif key == "mtu":
                links.set_link(ipr, link.index, mtu=value)
            elif key == "txQLen":
                links.set_link(ipr, link.index, txqlen=value)
            else:
                flag = _FLAGS[key]
                links.set_link(ipr, link.index, flags=flag if value else 0, change=flag)


def _apply(request: PluginRequest, conf: TuningConfig, resolved: list[tuple[str, str]], records: Records) -> None:
    ifname = request.ifname
    old: list[tuple[str, str]] = []
    for name, _ in resolved:
        try:
            old.append((name, sysctl.read(name)))
        except OSError as e:
            raise fail(f"open /proc/sys/{name}: {e.strerror.lower() if e.strerror else e}") from e
    record = _record_name(request)
    with links.iproute() as ipr:
        link = _get(ipr, ifname) if conf.changes_link else None
        previous = records.load(record) if link is not None else None
        try:
            for name, value in resolved:
                try:
                    sysctl.write(name, value)
                except OSError as e:
                    raise fail(f"write /proc/sys/{name}: {e.strerror.lower() if e.strerror else e}") from e
            if link is None:
                return
            saved = _saved(conf, link)
            if isinstance(previous, dict) and isinstance(previous.get("saved"), dict):
                saved.update(previous["saved"])  # the first ADD saw the original values
            records.store(record, {"network": request.network_name, "saved": saved})
            wanted: dict[str, Any] = {}
            if conf.mac:
                wanted["mac"] = conf.mac
            if conf.promisc:
                wanted["promisc"] = True
            if conf.mtu:
                wanted["mtu"] = conf.mtu
            if conf.allmulti is not None:
                wanted["allmulti"] = conf.allmulti
            if conf.tx_qlen is not None:
                wanted["txQLen"] = conf.tx_qlen
            _set(ipr, link, wanted)
        except BaseException:
            if link is not None:
                with contextlib.suppress(Exception):
                    _set(ipr, link, _saved(conf, link))
                with contextlib.suppress(OSError):
                    if isinstance(previous, dict):
                        records.store(record, previous)
                    else:
                        records.remove(record)
            for name, value in reversed(old):
                with contextlib.suppress(OSError):
                    sysctl.write(name, value)
            raise


def _restore(ifname: str, saved: Mapping[str, Any]) -> None:
    """Put back the saved attributes (an interface that is gone has nothing to restore)."""
    with links.iproute() as ipr:
        link = links.get_link(ipr, ifname)
        if link is not None:
            _set(ipr, link, saved)


def _check(request: PluginRequest, conf: TuningConfig, resolved: list[tuple[str, str]]) -> None:
    ifname = request.ifname
    for name, want in resolved:
        try:
            have = sysctl.read(name)
        except OSError as e:
            raise fail(f"open /proc/sys/{name}: {e.strerror.lower() if e.strerror else e}") from e
        if have != want:
            raise fail(f"Error: Tuning configured value of /proc/sys/{name} is {want}, current value is {have}")
    with links.iproute() as ipr:
        link = links.get_link(ipr, ifname)
    if link is None:
        raise fail(f"Cannot find container link {ifname}")
    if conf.mac and _mac(conf.mac) != link.mac:
        raise fail(f"Error: Tuning configured Ethernet of {ifname} is {conf.mac}, current value is {link.mac}")
    if conf.promisc != link.promisc:
        raise fail(
            f"Error: Tuning link {ifname} configured promisc is {str(conf.promisc).lower()}, "
            f"current value is {int(link.promisc)}"
        )
    if conf.mtu and conf.mtu != link.mtu:
        raise fail(f"Error: Tuning configured MTU of {ifname} is {conf.mtu}, current value is {link.mtu}")
    allmulti = bool(link.flags & links.IFF_ALLMULTI)
    if conf.allmulti is not None and conf.allmulti != allmulti:
        raise fail(
            f"Error: Tuning configured all-multicast mode of {ifname} is {str(conf.allmulti).lower()}, "
            f"current value is {str(allmulti).lower()}"
        )
    if conf.tx_qlen is not None and conf.tx_qlen != link.txqlen:
        raise fail(
            f"Error: Tuning configured Transmit Queue Length of {ifname} is {conf.tx_qlen}, "
            f"current value is {link.txqlen}"
        )


# --- the plugin -------------------------------------------------------------------------------


class TuningPlugin(Plugin):
    type = "tuning"

    def validate(self, request: PluginRequest) -> None:
        _validate(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf, resolved = _validate(request)
        prev = prev_result(request)
        if prev is None:
            raise fail(_NO_PREV)
        in_netns(request.netns, _apply, request, conf, resolved, _records(request, conf))
        if conf.mac:
            prev = attrs.evolve(
                prev,
                interfaces=[attrs.evolve(i, mac=conf.mac) if i.name == request.ifname else i for i in prev.interfaces],
            )
        return emit(prev, request)

    def check(self, request: PluginRequest) -> None:
        conf, resolved = _validate(request)
        if prev_result(request) is None:
            raise fail(_NO_PREV)
        in_netns(request.netns, _check, request, conf, resolved)

    def delete(self, request: PluginRequest) -> None:
        conf = load_config(request)
        records = _records(request, conf)
        name = _record_name(request)
        record = records.load(name)
        if not isinstance(record, dict):
            return
        saved = record.get("saved")
        if isinstance(saved, dict) and request.netns:
            try:
                in_netns(request.netns, _restore, request.ifname, saved)
            except Exception as e:
                if not netns_gone(e.__cause__ or e):
                    return  # as upstream, DEL succeeds; the record stays for a later DEL
        records.remove(name)

    def gc(self, request: PluginRequest) -> GCReport:
        conf = load_config(request)
        records = _records(request, conf)
        valid = {f"{cid}_{ifname}" for cid, ifname in valid_attachments(request)}
        removed = []
        for name in records.names():
            record = records.load(name)
            if name in valid or not isinstance(record, dict) or record.get("network") != request.network_name:
                continue
            removed.append(f"pycni state record tuning/{name}")
            if not dry_run(request):
                records.remove(name)
        return gc_report(removed)

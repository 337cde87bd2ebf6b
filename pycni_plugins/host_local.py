"""host-local IPAM, in-process: the reference plugin's config, allocation order, errors and disk format.

Leases live in ``<dataDir>/<network>/`` exactly as the Go plugin keeps them (one file per IP named
by the canonical IP, holding ``<containerID>\\r\\n<ifname>``; ``last_reserved_ip.<set index>``;
an empty ``lock`` file taken with ``flock``), so Go and pycni can share a data dir both ways.
A long-lived process keeps each directory's leases in memory, kept exact with inotify, so an
operation's cost does not grow with the number of leases (see "The lease cache").
Every error the Go plugin reports as a plain Go error is raised with code 999 and the same text.
Files are opened relative to the network directory's fd and never through a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import re
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from pycni import version as _version
from pycni._json import GoFields, go_kind
from pycni.errors import CNIError, ConfigError, ErrorCode
from pycni.failpoints import failpoint
from pycni.sdk import GCReport, Plugin, PluginRequest

__all__ = ["DEFAULT_DATA_DIR", "HostLocalConfig", "HostLocalPlugin", "IPRange", "load_config", "parse_resolv_conf"]

DEFAULT_DATA_DIR = "/var/lib/cni/networks"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_LAST_RESERVED = "last_reserved_ip."
_LOCK = "lock"
_V4_MAPPED = bytes(10) + b"\xff\xff"
_ROUTE_INTS = ("mtu", "advmss", "priority", "table", "scope")
_OMIT_ZERO = frozenset({"mtu", "advmss", "priority"})  # Go's plain-int omitempty fields; table/scope are *int
# Files in the network dir are always opened with O_NOFOLLOW (os.open adds O_CLOEXEC itself).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a planted FIFO must not hang us
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY


# ---------------------------------------------------------------------------------------------
# Errors: the Go plugin returns plain errors, which skel reports as code 999 with msg = the text.


def _fail(msg: str) -> CNIError:
    return CNIError(msg, code=ErrorCode.INTERNAL)


def _config_fail(msg: str) -> ConfigError:
    return ConfigError(msg, code=ErrorCode.INTERNAL)


def _go_quote(text: str) -> str:
    """Go's ``%q`` for the printable strings CNI_ARGS carry."""
    return json.dumps(text, ensure_ascii=False)


def _strerror(exc: OSError) -> str:
    """Go's lower-case errno text (``no such file or directory``)."""
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    return text[:1].lower() + text[1:]


def _refuse_symlink(path: str) -> CNIError:
    return _fail(f"{path} is a symbolic link, refusing to follow it")


def _os_fail(op: str, path: str, exc: OSError) -> CNIError:
    if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
        return _refuse_symlink(path)
    return _fail(f"{op} {path}: {_strerror(exc)}")


def _type_error(value: Any, field: str, go_type: str) -> ConfigError:
    return _config_fail(f"json: cannot unmarshal {go_kind(value)} into Go struct field {field} of type {go_type}")


# ---------------------------------------------------------------------------------------------
# Addresses, parsed as Go's net.ParseIP / ParseCIDR do (IPv4-mapped IPv6 becomes IPv4).


def _parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.IPv4Address(socket.inet_pton(socket.AF_INET, text))
    except (OSError, ValueError):
        pass
    try:
        packed = socket.inet_pton(socket.AF_INET6, text)
    except (OSError, ValueError):
        return None
    if packed[:12] == _V4_MAPPED:
        return ipaddress.IPv4Address(packed[12:])
    return ipaddress.IPv6Address(packed)


@attrs.frozen
class _CIDR:
    """A parsed ``addr/len``: ``mask_bits`` is 128 whenever the text was IPv6, even v4-mapped."""

    ip: IPAddress
    prefix: int
    mask_bits: int

    def __str__(self) -> str:
        # Go prints a v4-mapped address with its 128-bit mask cut to the last 32 bits.
        return f"{self.ip}/{max(self.prefix - (self.mask_bits - self.ip.max_prefixlen), 0)}"


def _parse_cidr(text: str) -> _CIDR | None:
    addr, slash, bits = text.partition("/")
    ip = _parse_ip(addr) if slash else None
    if ip is None or not (bits.isascii() and bits.isdigit()):
        return None
    mask_bits = 128 if ":" in addr else 32
    prefix = int(bits)
    return _CIDR(ip, prefix, mask_bits) if prefix <= mask_bits else None


def _decode_ip(value: Any, field: str) -> IPAddress | None:
    """A ``net.IP`` field: null and ``""`` mean unset."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _type_error(value, field, "net.IP")
    ip = _parse_ip(value)
    if ip is None:
        raise _config_fail(f"invalid IP address: {value}")
    return ip


def _decode_cidr(value: Any, field: str) -> _CIDR:
    """A ``types.IPNet`` field: null decodes as ``""`` and fails like it."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise _type_error(value, field, "string")
    cidr = _parse_cidr(value)
    if cidr is None:
        raise _config_fail(f"invalid CIDR address: {value}")
    return cidr


def _decode_requested(text: str, error: str) -> IPAddress | None:
    """A requested IP (``ip.IP``): an address or a CIDR; ``""`` is kept as "no address" (None)."""
    if text == "":
        return None
    ip = _parse_ip(text) if "/" not in text else getattr(_parse_cidr(text), "ip", None)
    if ip is None:
        raise _config_fail(f"{error}invalid IP address {text}")
    return ip


# ---------------------------------------------------------------------------------------------
# Config


@attrs.frozen
class IPRange:
    """One canonical range: addresses ``start..end`` (inclusive) of ``subnet``, handing out ``gateway`` never."""

    subnet: IPNetwork
    start: IPAddress
    end: IPAddress
    gateway: IPAddress

    def contains(self, ip: IPAddress) -> bool:
        return ip.version == self.start.version and int(self.start) <= int(ip) <= int(self.end)

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


RangeSet = tuple[IPRange, ...]


@attrs.frozen
class HostLocalConfig:
    """The IPAM config as host-local reads it from the full network config."""

    name: str
    cni_version: str
    range_sets: tuple[RangeSet, ...]
    routes: tuple[dict[str, Any], ...] = ()
    data_dir: str = DEFAULT_DATA_DIR
    resolv_conf: str = ""
    requested_ips: tuple[IPAddress, ...] = ()


@attrs.frozen
class _RawRange:
    subnet: _CIDR | None
    start: IPAddress | None
    end: IPAddress | None
    gateway: IPAddress | None


def _fields(obj: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Pick ``names`` from a JSON object, matching keys as Go's decoder does."""
    return dict(GoFields(*names).pick(obj))


def _object(value: Any, field: str, go_type: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _type_error(value, field, go_type)
    return value


def _array(value: Any, field: str, go_type: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _type_error(value, field, go_type)
    return value


def _string(value: Any, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _type_error(value, field, "string")
    return value


def _decode_range(obj: Mapping[str, Any], struct: str) -> _RawRange:
    f = _fields(obj, ("subnet", "rangeStart", "rangeEnd", "gateway"))
    return _RawRange(
        subnet=_decode_cidr(f["subnet"], f"{struct}.subnet") if "subnet" in f else None,
        start=_decode_ip(f.get("rangeStart"), f"{struct}.rangeStart"),
        end=_decode_ip(f.get("rangeEnd"), f"{struct}.rangeEnd"),
        gateway=_decode_ip(f.get("gateway"), f"{struct}.gateway"),
    )


def _decode_range_sets(value: Any, owner: str, path: str) -> list[list[_RawRange]]:
    sets = []
    for raw_set in _array(value, f"{owner}.{path}", "[]allocator.RangeSet"):
        ranges = []
        for raw in _array(raw_set, f"{owner}.{path}", "allocator.RangeSet"):
            ranges.append(_decode_range(_object(raw, f"{owner}.{path}", "allocator.Range"), f"Range.{path}"))
        sets.append(ranges)
    return sets


def _decode_route(value: Any) -> dict[str, Any]:
    field = "IPAMConfig.ipam.routes"
    if value is None:  # Go would print a null route, which no consumer accepts
        raise _config_fail("invalid route: null")
    obj = _fields(_object(value, field, "types.Route"), ("dst", "gw") + _ROUTE_INTS)
    # A missing dst fails like "" instead of printing Go's "<nil>" route (unusable downstream).
    route: dict[str, Any] = {"dst": str(_decode_cidr(obj.get("dst"), field))}
    gw = _decode_ip(obj.get("gw"), field)
    if gw is not None:
        route["gw"] = str(gw)
    for key in _ROUTE_INTS:  # the CNI 1.1 route attributes, passed through like the latest plugin
        num = obj.get(key)
        if num is None or (num == 0 and key in _OMIT_ZERO):
            continue
        if isinstance(num, bool) or not isinstance(num, int):
            raise _type_error(num, f"route.{key}", "int")
        route[key] = num
    return route


def _decode_ip_list(value: Any, field: str) -> list[IPAddress | None]:
    out = []
    for item in _array(value, field, "[]*ip.IP"):
        if item is not None and not isinstance(item, str):
            raise _type_error(item, field, "*ip.IP")
        out.append(_decode_requested(item or "", ""))
    return out


def _env_requested_ip(request: PluginRequest) -> IPAddress | None:
    """``IP=`` from CNI_ARGS (an empty value requests nothing)."""
    value = request.load_args("IP").get("IP", "")
    return _decode_requested(value, f"ARGS: error parsing value of pair {_go_quote('IP=' + value)}: ")


def _within(ip: IPAddress, subnet: IPNetwork, low: IPAddress | None, high: IPAddress | None) -> bool:
    # Go compares start/end as plain integers, whatever their family.
    return (
        ip.version == subnet.version
        and ip in subnet
        and (low is None or int(ip) >= int(low))
        and (high is None or int(ip) <= int(high))
    )


def _canonical_range(raw: _RawRange) -> IPRange:
    cidr = raw.subnet
    if cidr is None:
        raise _config_fail("IP <nil> not v4 nor v6")
    if cidr.prefix > cidr.mask_bits - 2:
        raise _config_fail(f"Network {cidr} too small to allocate from")
    if cidr.mask_bits != cidr.ip.max_prefixlen:
        raise _config_fail("IPNet IP and Mask version mismatch")
    subnet = ipaddress.ip_network((cidr.ip, cidr.prefix), strict=False)
    if subnet.network_address != cidr.ip:
        raise _config_fail(
            f"Network has host bits set. For a subnet mask of length {cidr.prefix} "
            f"the network address is {subnet.network_address}"
        )
    first = subnet.network_address + 1
    start = first if raw.start is None else raw.start
    if raw.start is not None and not _within(start, subnet, None, raw.end):
        raise _config_fail(f"RangeStart {start} not in network {subnet}")
    if raw.end is None:
        end = subnet.broadcast_address - 1 if subnet.version == 4 else subnet.broadcast_address
    elif _within(raw.end, subnet, start, None):
        end = raw.end
    else:
        raise _config_fail(f"RangeEnd {raw.end} not in network {subnet}")
    return IPRange(subnet=subnet, start=start, end=end, gateway=first if raw.gateway is None else raw.gateway)


def _overlap(a: IPRange, b: IPRange) -> bool:
    return a.start.version == b.start.version and int(a.start) <= int(b.end) and int(b.start) <= int(a.end)


def _canonical_set(raw_set: list[_RawRange]) -> RangeSet:
    if not raw_set:
        raise _config_fail("empty range set")
    ranges: list[IPRange] = []
    for raw in raw_set:
        ranges.append(_canonical_range(raw))
        if ranges[-1].start.version != ranges[0].start.version:
            raise _config_fail("mixed address families")
    for i, a in enumerate(ranges):
        for b in ranges[i + 1 :]:
            if _overlap(a, b):
                raise _config_fail(f"subnets {a} and {b} overlap")
    return tuple(ranges)


def _check_network_name(name: str) -> None:
    """skel's check (code 7), repeated here because the name becomes a directory under ``dataDir``."""
    if not name:
        raise ConfigError("missing network name")
    if not _NAME.fullmatch(name):
        raise ConfigError("invalid characters found in network name", name)


def _check_data_dir(data_dir: str) -> None:
    if "\0" in data_dir or ".." in data_dir.split("/"):
        raise ConfigError(f'invalid dataDir "{data_dir}"', 'it must not contain ".." components or NUL')


def load_config(request: PluginRequest) -> HostLocalConfig:
    """Decode and validate as the reference does, with its error texts (code 999)."""
    _check_network_name(request.network_name)
    top = _fields(request.config, ("ipam", "runtimeConfig", "args"))
    ipam_raw = top.get("ipam")
    ipam = _fields(
        _object(ipam_raw, "Net.ipam", "allocator.IPAMConfig"),
        ("type", "routes", "dataDir", "resolvConf", "ranges", "subnet", "rangeStart", "rangeEnd", "gateway"),
    )
    for key in ("type", "dataDir", "resolvConf"):
        ipam[key] = _string(ipam.get(key), f"IPAMConfig.ipam.{key}")
    routes = [_decode_route(r) for r in _array(ipam.get("routes"), "IPAMConfig.ipam.routes", "[]*types.Route")]
    range_sets = _decode_range_sets(ipam.get("ranges"), "IPAMConfig", "ipam.ranges")
    legacy = _decode_range(ipam, "IPAMConfig.ipam")
    runtime = _fields(_object(top.get("runtimeConfig"), "Net.runtimeConfig", "struct"), ("ipRanges", "ips"))
    runtime_sets = _decode_range_sets(runtime.get("ipRanges"), "", "runtimeConfig.ipRanges")
    runtime_ips = _decode_ip_list(runtime.get("ips"), ".runtimeConfig.ips")
    cni_args = _fields(_object(top.get("args"), "Net.args", "struct"), ("cni",))
    arg_ips = _decode_ip_list(
        _fields(_object(cni_args.get("cni"), ".args.cni", "allocator.IPAMArgs"), ("ips",)).get("ips"),
        "IPAMArgs.args.cni.ips",
    )
    if ipam_raw is None:
        raise _config_fail("IPAM config missing 'ipam' key")

    env_ip = _env_requested_ip(request)
    requested = ([env_ip] if env_ip is not None else []) + arg_ips + runtime_ips
    if None in requested:
        raise _config_fail("cannot understand ip: IP <nil> not v4 nor v6")
    requested_ips = tuple(ip for ip in requested if ip is not None)

    if legacy.subnet is not None:
        range_sets.insert(0, [legacy])
    range_sets[:0] = runtime_sets
    if not range_sets:
        raise _config_fail("no IP ranges specified")
    sets = []
    for i, raw_set in enumerate(range_sets):
        try:
            sets.append(_canonical_set(raw_set))
        except ConfigError as e:
            raise _config_fail(f"invalid range set {i}: {e.msg}") from None

    cni_version = request.cni_version
    families = [s[0].start.version for s in sets]
    if families.count(4) > 1 or families.count(6) > 1:
        try:
            new_enough = _version.greater_or_equal(cni_version, "0.3.0")
        except CNIError:
            new_enough = False
        if not new_enough:
            raise _config_fail(f"CNI version {cni_version} does not support more than 1 address per family")
    for i, a_set in enumerate(sets):
        for j in range(i + 1, len(sets)):
            if any(_overlap(a, b) for a in a_set for b in sets[j]):
                raise _config_fail(f"range set {i} overlaps with {j}")

    data_dir = ipam["dataDir"] or DEFAULT_DATA_DIR
    _check_data_dir(data_dir)
    return HostLocalConfig(
        name=request.network_name,
        cni_version=cni_version,
        range_sets=tuple(sets),
        routes=tuple(routes),
        data_dir=data_dir,
        resolv_conf=ipam["resolvConf"],
        requested_ips=requested_ips,
    )


def parse_resolv_conf(path: str) -> dict[str, Any]:
    """``nameserver``/``domain``/``search``/``options`` of a resolv.conf, as a CNI ``dns`` object."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except IsADirectoryError:
        raise _fail(f"read {path}: is a directory") from None
    except OSError as e:
        raise _fail(f"open {path}: {_strerror(e)}") from None
    except ValueError:
        raise _fail(f"open {path}: invalid argument") from None
    nameservers: list[str] = []
    search: list[str] = []
    options: list[str] = []
    domain = ""
    for line in text.split("\n"):
        fields = line.split()
        if len(fields) < 2 or fields[0][0] in "#;":
            continue
        if fields[0] == "nameserver":
            nameservers.append(fields[1])
        elif fields[0] == "domain":
            domain = fields[1]
        elif fields[0] == "search":
            search += fields[1:]
        elif fields[0] == "options":
            options += fields[1:]
    dns = {"nameservers": nameservers, "domain": domain, "search": search, "options": options}
    return {k: v for k, v in dns.items() if v}


# ---------------------------------------------------------------------------------------------
# The lease cache.
#
# A long-lived process (the in-process backend) keeps, per network directory, the trimmed
# content of every lease file in memory, so ADD's duplicate check, DEL and CHECK cost O(files
# changed since this process last looked) instead of reading every lease. inotify keeps it
# exact: a writer that follows the protocol (the Go plugin, pycni in any process) changes the
# directory only while it holds the flock, the kernel queues the event for each create, unlink,
# rename or write inside that very syscall, so everything a writer did before releasing the lock
# is in our queue by the time we hold it. Names, not inode numbers, are what get re-read, so a
# file deleted and recreated under the same name (ext4 reuses the inode) is never mistaken for
# the old one. A lost watch (directory removed, filesystem unmounted, watch evicted) drops the
# entry, a queue overflow marks every entry for a full re-read, and whenever no watch can be
# had the operation reads the whole directory as before. Hits are re-read before they are acted
# on, so even a writer that ignores the lock can only make us miss a lease it is changing right
# now (as the full read always could), never delete or refuse because of a stale entry.
#
# The cache starts with the second store a process opens: an exec'd plugin (one operation per
# process) never creates an inotify instance, a per-user resource (fs.inotify.max_user_instances).

_IN_MODIFY = 0x00000002
_IN_ATTRIB = 0x00000004
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_WATCH_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_ONLYDIR
_EVENT = struct.Struct("=iIII")  # struct inotify_event: wd, mask, cookie, len, then len bytes of NUL-padded name
_MAX_DIRS = 64  # network directories cached per process, least recently used dropped first (one watch each)
_MAX_DIRTY = 4096  # changed names remembered per directory before a full re-read is cheaper
_RETRY_AFTER = 30.0  # seconds before trying inotify_init1 again after it failed (EMFILE, seccomp, ...)
_FS_ENCODING = sys.getfilesystemencoding()  # how os.scandir decodes names
_CACHE_LEASES = True  # False: every operation reads the whole directory (for tests and benchmarks)


def _is_state_file(name: str) -> bool:
    return name == _LOCK or name.startswith(_LAST_RESERVED)


class _Leases:
    """One network directory's lease files: name → trimmed content, and content → names.

    ``content``/``holders`` change only with ``lock`` held, which callers take while holding the
    directory's flock; ``dirty``/``rescan``/``alive`` belong to the watcher (its mutex).
    One entry per lease file.
    """

    def __init__(self, key: tuple[int, int], wd: int) -> None:
        self.key = key
        self.wd = wd
        self.lock = threading.Lock()
        self.content: dict[str, bytes] = {}
        self.holders: dict[bytes, set[str]] = {}
        self.dirty: set[str] = set()
        self.rescan = True
        self.alive = True

    def set(self, name: str, data: bytes | None) -> None:
        old = self.content.pop(name, None)
        if old is not None:
            names = self.holders[old]
            names.discard(name)
            if not names:
                del self.holders[old]
        if data is not None:
            self.content[name] = data
            self.holders.setdefault(data, set()).add(name)

    def load(self, store: _Store) -> None:
        self.content.clear()
        self.holders.clear()
        for name, data in store.lease_files():
            self.set(name, data)

    def verified(self, store: _Store, data: bytes) -> list[str]:
        """The files cached as holding ``data``, each re-read now; one that no longer does is corrected."""
        found = []
        for name in list(self.holders.get(data, ())):
            now = store.lease(name)
            if now == data:
                found.append(name)
            else:
                self.set(name, now)
        return found


class _Watcher:
    """This process's inotify instance, with one watch per cached network directory."""

    def __init__(self) -> None:
        import ctypes  # only long-lived processes get here

        libc = ctypes.CDLL(None, use_errno=True)
        init, self._add, self._rm = libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch
        init.argtypes = (ctypes.c_int,)
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._rm.argtypes = (ctypes.c_int, ctypes.c_int)
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self.fd = fd
        self.pid = os.getpid()
        self.mutex = threading.Lock()
        self.dirs: dict[tuple[int, int], _Leases] = {}  # by the directory's (st_dev, st_ino), least recent first
        self.by_wd: dict[int, _Leases] = {}

    def entry(self, store: _Store) -> _Leases | None:
        """The cache of the directory ``store`` has open (its flock held), with every event queued so far
        recorded in it; None if the directory cannot be watched.

        A cached (st_dev, st_ino) is still the same directory: the watch pins the inode, and when
        the directory goes away the watch's IN_IGNORED is queued before the inode number can be
        reused, so the drain below has dropped the entry of a directory that was replaced.
        """
        st = os.fstat(store.fd)
        key = (st.st_dev, st.st_ino)
        with self.mutex:
            self._drain()
            entry = self.dirs.pop(key, None)
            if entry is None:
                # Watch the open directory itself (its path may no longer lead to it), through this
                # thread's fd table: /proc/self is the thread-group leader's, which may differ.
                wd = self._add(self.fd, f"/proc/thread-self/fd/{store.fd}".encode(), _WATCH_MASK)
                if wd < 0:  # ENOSPC (fs.inotify.max_user_watches), no /proc, ...
                    return None
                stale = self.by_wd.get(wd)
                if stale is not None:  # cannot happen (see above); never let two entries share a watch
                    self._drop(stale)
                entry = self.by_wd[wd] = _Leases(key, wd)
            self.dirs[key] = entry  # most recently used last
            while len(self.dirs) > _MAX_DIRS:
                oldest = next(iter(self.dirs.values()))
                self._drop(oldest)
                self._rm(self.fd, oldest.wd)
        return entry

    def refresh(self, entry: _Leases, store: _Store) -> bool:
        """Bring ``entry`` up to date (its lock and the directory's flock held); False if it was dropped meanwhile."""
        with self.mutex:
            if not entry.alive:
                return False
            rescan, dirty = entry.rescan, entry.dirty
            entry.rescan, entry.dirty = False, set()
        try:
            if rescan:
                entry.load(store)
            else:
                for name in dirty:
                    entry.set(name, store.lease(name))
        except BaseException:
            with self.mutex:
                entry.rescan = True
            raise
        return True

    def _drop(self, entry: _Leases) -> None:
        entry.alive = False
        if self.dirs.get(entry.key) is entry:
            del self.dirs[entry.key]
        if self.by_wd.get(entry.wd) is entry:
            del self.by_wd[entry.wd]

    def _drain(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:  # cannot happen; if it does, trust nothing
                self._overflow()
                return
            self.dispatch(buf)

    def _overflow(self) -> None:
        for entry in self.dirs.values():
            entry.rescan = True
            entry.dirty.clear()

    def dispatch(self, buf: bytes) -> None:
        """Record a batch of events read from the queue."""
        offset = 0
        while offset + _EVENT.size <= len(buf):
            wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
            start = offset + _EVENT.size
            offset = start + length
            if mask & _IN_Q_OVERFLOW:
                self._overflow()
                continue
            entry = self.by_wd.get(wd)
            if entry is None:
                continue
            if mask & _IN_IGNORED:
                self._drop(entry)
                continue
            name = buf[start:offset].rstrip(b"\0").decode(_FS_ENCODING, "surrogateescape")
            if entry.rescan or not name or _is_state_file(name):  # no name: an event on the directory itself
                continue
            entry.dirty.add(name)
            if len(entry.dirty) > _MAX_DIRTY:
                entry.rescan = True
                entry.dirty.clear()


_watcher: _Watcher | None = None
_watcher_failed_at = float("-inf")
_watcher_lock = threading.Lock()
_stores_opened = 0


def _get_watcher() -> _Watcher | None:
    """This process's watcher, created on first need; None while the cache is off or unavailable."""
    global _watcher, _watcher_failed_at
    if not _CACHE_LEASES or _stores_opened < 2:
        return None
    watcher = _watcher
    if watcher is not None and watcher.pid == os.getpid():
        return watcher
    with _watcher_lock:
        watcher = _watcher
        if watcher is not None and watcher.pid != os.getpid():
            # Inherited through a fork that skipped the at-fork hook: never read the parent's queue
            # (each event is delivered once). The fd number is left alone; the child may reuse it.
            watcher = _watcher = None
        if watcher is None:
            if time.monotonic() - _watcher_failed_at < _RETRY_AFTER:
                return None
            try:
                watcher = _watcher = _Watcher()
            except (OSError, AttributeError, ImportError):  # no inotify (limits, seccomp, not Linux, no ctypes)
                _watcher_failed_at = time.monotonic()
                return None
    return watcher


def _forget_watcher_in_child() -> None:
    """After fork: the child must not read the queue it shares with the parent, nor use its locks."""
    global _watcher, _watcher_lock
    watcher, _watcher = _watcher, None
    _watcher_lock = threading.Lock()
    if watcher is not None:
        try:
            os.close(watcher.fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watcher_in_child)


# ---------------------------------------------------------------------------------------------
# The store: one network's lease directory.


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Store:
    """``<dataDir>/<network>``, reached without following a symlink planted in ``dataDir``.

    Each instance opens its own ``lock`` file description, so ``flock`` excludes other threads
    of this process as well as other processes (Go or pycni).
    """

    def __init__(self, data_dir: str, network: str) -> None:
        global _stores_opened
        _stores_opened += 1
        self._leases: _Leases | None = None  # the lease cache as synced under the current lock hold
        self.path = os.path.join(data_dir, network)
        try:
            parent = os.open(data_dir, _DIR_FLAGS)
        except FileNotFoundError:
            try:
                os.makedirs(data_dir, 0o755, exist_ok=True)
                parent = os.open(data_dir, _DIR_FLAGS)
            except OSError as e:
                raise _os_fail("mkdir", data_dir, e) from None
        except OSError as e:
            raise _os_fail("open", data_dir, e) from None
        try:
            try:
                os.mkdir(network, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
            self.fd = os.open(network, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
        except OSError as e:
            if e.errno == errno.ENOTDIR and os.path.islink(self.path):  # what O_DIRECTORY says of a symlink
                raise _refuse_symlink(self.path) from None
            raise _os_fail("open", self.path, e) from None
        finally:
            os.close(parent)
        try:
            self._lock_fd = os.open(_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o750, dir_fd=self.fd)
        except OSError as e:
            os.close(self.fd)
            raise _os_fail("open", os.path.join(self.path, _LOCK), e) from None

    def __enter__(self) -> _Store:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._lock_fd)
        os.close(self.fd)

    @contextmanager
    def locked(self) -> Iterator[_Store]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield self
        finally:
            self._leases = None
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _read(self, name: str, limit: int | None = None) -> bytes | None:
        """The file's bytes (whole, or None when larger than ``limit``); None when unreadable.

        A lease is read whole: a cap would make a long owner unrecognisable, so its DEL would
        "succeed" without releasing it."""
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self.fd)
        except OSError:
            return None
        try:
            if limit is not None:
                data = os.read(fd, limit + 1)
                return data if len(data) <= limit else None
            with os.fdopen(os.dup(fd), "rb") as f:
                return f.read()
        except OSError:
            return None
        finally:
            os.close(fd)

    def _write(self, name: str, data: bytes, flags: int) -> None:
        """Write a file in the directory; ``FileExistsError`` (O_EXCL) passes through, other failures are CNI errors."""
        path = os.path.join(self.path, name)
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW, 0o600, dir_fd=self.fd)
        except FileExistsError:
            raise
        except OSError as e:
            raise _os_fail("open", path, e) from None
        try:
            _write_all(fd, data)
        except OSError as e:
            os.unlink(name, dir_fd=self.fd)
            raise _os_fail("write", path, e) from None
        finally:
            os.close(fd)

    def reserve(self, ip: str, owner: bytes, range_id: int) -> bool:
        """Create the lease file exclusively; False when the IP is taken. Records ``last_reserved_ip``."""
        try:
            self._write(ip, owner, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        try:
            self._write(f"{_LAST_RESERVED}{range_id}", ip.encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except CNIError:
            os.unlink(ip, dir_fd=self.fd)  # unlike Go, leave no lease behind a failed reservation
            raise
        return True

    def last_reserved(self, range_id: int) -> IPAddress | None:
        data = self._read(f"{_LAST_RESERVED}{range_id}", 64)
        return _parse_ip(data.decode("ascii", "replace")) if data else None

    def lease(self, name: str) -> bytes | None:
        """Lease file ``name``'s trimmed content; None if it is missing, not a regular file or unreadable."""
        if _is_state_file(name):
            return None
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        data = self._read(name)
        return None if data is None else data.strip()

    def lease_files(self) -> Iterator[tuple[str, bytes]]:
        """Every lease file with its trimmed content, read from disk.

        The Go plugin reads every file in the directory; pycni skips ``lock``,
        ``last_reserved_ip.*`` and anything that is not a regular file (symlinks included).
        """
        with os.scandir(self.fd) as entries:
            for entry in entries:
                name = entry.name
                if _is_state_file(name) or not entry.is_file(follow_symlinks=False):
                    continue
                data = self._read(name)
                if data is not None:
                    yield name, data.strip()

    def find(self, container_id: str, ifname: str) -> tuple[list[str], list[str]]:
        """Names of files holding ``id\\r\\nifname`` and of those holding just the legacy bare ``id``.

        From the lease cache when this process has one for the directory (each hit re-read
        just now), else from reading every lease file. The caller holds the lock.
        """
        owner = container_id.strip().encode()
        key = owner + b"\r\n" + ifname.encode()
        watcher = _get_watcher()
        leases = watcher.entry(self) if watcher is not None else None
        if watcher is not None and leases is not None:
            with leases.lock:
                if watcher.refresh(leases, self):
                    self._leases = leases
                    return sorted(leases.verified(self, key)), sorted(leases.verified(self, owner))
        self._leases = None
        current: list[str] = []
        legacy: list[str] = []
        for name, data in self.lease_files():
            if data == key:
                current.append(name)
            elif data == owner:
                legacy.append(name)
        return sorted(current), sorted(legacy)

    def known_taken(self, name: str) -> bool:
        """Whether the cache synced by ``find`` under this lock hold lists ``name`` as a lease file.

        A hint that lets allocation skip leases without an open(2); O_EXCL still decides.
        """
        leases = self._leases
        return leases is not None and name in leases.content

    def release(self, container_id: str, ifname: str, passes: int) -> None:
        """Release the attachment's leases as ``passes`` (>= 1) consecutive Go ``ReleaseByID`` calls would.

        Each call deletes the ``id\\r\\nifname`` files, or, when there are none, the legacy
        bare-id files, so a second pass also removes legacy files. Errors are ignored like Go's.
        ``find`` has just read every candidate under the lock we hold, so only files whose
        content matches right now are unlinked.
        """
        current, legacy = self.find(container_id, ifname)
        doomed = current + legacy if current and passes > 1 else current or legacy
        for name in doomed:
            try:
                os.unlink(name, dir_fd=self.fd)
            except OSError:
                pass

    def collect(self, valid: set[tuple[str, str]], *, dry_run: bool) -> list[tuple[str, str]]:
        """GC (the caller holds the lock): unlink the lease files of attachments not in ``valid``;
        returns ``(ip, "containerID/ifname")`` of each. Only files named by an IP are leases;
        the lease cache learns of the unlinks through inotify, as of any other writer's."""
        ids = {cid for cid, _ in valid}
        doomed = []
        for name, data in self.lease_files():
            if _parse_ip(name) is None:
                continue
            text = data.decode("utf-8", "surrogateescape")
            cid, sep, ifname = text.partition("\r\n")
            if (cid.strip(), ifname.strip()) in valid if sep else cid.strip() in ids:
                continue
            doomed.append((name, f"{cid.strip()}/{ifname.strip()}" if sep else f"{cid.strip()} (legacy lease)"))
        if not dry_run:
            for name, _ in doomed:
                try:
                    os.unlink(name, dir_fd=self.fd)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise _os_fail("remove", os.path.join(self.path, name), e) from None
        return doomed


# ---------------------------------------------------------------------------------------------
# Allocation


def _range_for(range_set: RangeSet, ip: IPAddress) -> IPRange | None:
    return next((r for r in range_set if r.contains(ip)), None)


def _set_str(range_set: RangeSet) -> str:
    return ",".join(map(str, range_set))


def _candidates(range_set: RangeSet, last: IPAddress | None) -> Iterator[tuple[int, IPRange]]:
    """The reference's round-robin order: after ``last`` (which comes last), else from the first start.

    Ranges are walked in order and cyclically; each range's gateway is skipped.
    """
    if last is None or (current := _range_for(range_set, last)) is None:
        segments = [(r, int(r.start), int(r.end)) for r in range_set]
    else:
        i = range_set.index(current)
        segments = [
            (current, int(last) + 1, int(current.end)),
            *((r, int(r.start), int(r.end)) for r in range_set[i + 1 :] + range_set[:i]),
            (current, int(current.start), int(last)),
        ]
    for r, low, high in segments:
        gateway = int(r.gateway) if r.gateway.version == r.start.version else -1
        for value in range(low, high + 1):
            if value != gateway:
                yield value, r


def _reserve_requested(store: _Store, range_set: RangeSet, idx: int, ip: IPAddress, owner: bytes) -> IPRange:
    r = _range_for(range_set, ip)
    if r is None:  # unreachable from ADD (the IP was picked because the set contains it)
        raise _fail(f"{ip} not in range set {_set_str(range_set)}")
    if ip == r.gateway:
        raise _fail(f"requested ip {ip} is subnet's gateway")
    if not store.reserve(str(ip), owner, idx):
        raise _fail(f"requested IP address {ip} is not available in range set {_set_str(range_set)}")
    return r


def _reserve_next(store: _Store, range_set: RangeSet, idx: int, owner: bytes) -> tuple[IPAddress, IPRange]:
    hinted: list[tuple[IPAddress, IPRange]] = []
    for value, r in _candidates(range_set, store.last_reserved(idx)):
        ip = type(r.start)(value)
        name = str(ip)
        if store.known_taken(name):
            hinted.append((ip, r))
        elif store.reserve(name, owner, idx):
            return ip, r
    for ip, r in hinted:  # the cache is only a hint: "no addresses" is O_EXCL's verdict alone
        if store.reserve(str(ip), owner, idx):
            return ip, r
    raise _fail(f"no IP addresses available in range set: {_set_str(range_set)}")


def _allocate(store: _Store, conf: HostLocalConfig, container_id: str, ifname: str) -> list[tuple[IPAddress, IPRange]]:
    """One IP per range set, all-or-nothing; the caller holds the store lock."""
    requested = dict.fromkeys(conf.requested_ips)
    owner = (container_id.strip() + "\r\n" + ifname).encode()
    owned: list[IPAddress] | None = None  # this attachment's existing leases, read once
    allocated: list[tuple[IPAddress, IPRange]] = []
    try:
        for idx, range_set in enumerate(conf.range_sets):
            want = next((ip for ip in requested if _range_for(range_set, ip)), None)
            try:
                if want is not None:
                    del requested[want]
                    allocated.append((want, _reserve_requested(store, range_set, idx, want, owner)))
                    continue
                if owned is None:
                    current, legacy = store.find(container_id, ifname)
                    owned = [ip for name in sorted(current + legacy) if (ip := _parse_ip(name)) is not None]
                dup = next((ip for ip in owned if _range_for(range_set, ip)), None)
                if dup is not None:
                    raise _fail(f"{dup} has been allocated to {container_id}, duplicate allocation is not allowed")
                allocated.append(_reserve_next(store, range_set, idx, owner))
            except CNIError as e:
                raise _fail(f"failed to allocate for range {idx}: {e.msg}") from None
        if requested:
            raise _fail("failed to allocate all requested IPs: " + " ".join(map(str, requested)))
    except CNIError:
        # Exactly what this call reserved: a release by ID (what Go does) would also free the
        # leases an earlier ADD of the same attachment holds.
        for ip, _ in allocated:
            with contextlib.suppress(OSError):
                os.unlink(str(ip), dir_fd=store.fd)
        raise
    return allocated


# ---------------------------------------------------------------------------------------------
# Result, at the request's cniVersion


def _ip_json(ip: IPAddress, r: IPRange) -> dict[str, Any]:
    return {"address": f"{ip}/{r.subnet.prefixlen}", "gateway": str(r.gateway)}


def _result(
    version: str, allocated: list[tuple[IPAddress, IPRange]], routes: Sequence[dict[str, Any]], dns: dict[str, Any]
) -> dict[str, Any]:
    """The result as the Go plugin prints it at ``version`` (keys in its order)."""
    parsed = _version.parse(version)
    out: dict[str, Any] = {"cniVersion": version or "0.1.0"}
    if parsed < (0, 3, 0):  # one IP per family, each with the routes of its family
        for family, key in ((4, "ip4"), (6, "ip6")):
            found = next(((ip, r) for ip, r in allocated if ip.version == family), None)
            if found is None:
                continue
            ip, r = found
            entry: dict[str, Any] = {"ip": f"{ip}/{r.subnet.prefixlen}", "gateway": str(r.gateway)}
            own = [{"dst": rt["dst"]} | ({"gw": rt["gw"]} if "gw" in rt else {}) for rt in routes]
            own = [rt for rt in own if (":" in rt["dst"]) == (family == 6)]
            if own:
                entry["routes"] = own
            out[key] = entry
        out["dns"] = dns
        return out
    if parsed < (1, 0, 0):
        out["ips"] = [{"version": str(ip.version)} | _ip_json(ip, r) for ip, r in allocated]
        if routes:
            out["routes"] = list(routes)
        out["dns"] = dns  # 0.3.x/0.4.0 always print it
        return out
    if dns:  # 1.x: sorted keys, empty dns omitted (the latest cni library)
        out["dns"] = dns
    out["ips"] = [_ip_json(ip, r) for ip, r in allocated]
    if routes:
        out["routes"] = list(routes)
    return out


class HostLocalPlugin(Plugin):
    """The ``host-local`` IPAM plugin: ADD allocates, DEL releases by (container ID, ifname), CHECK finds."""

    type = "host-local"

    def validate(self, request: PluginRequest) -> None:
        load_config(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        conf = load_config(request)
        dns = parse_resolv_conf(conf.resolv_conf) if conf.resolv_conf else {}
        with _Store(conf.data_dir, conf.name) as store, store.locked():
            allocated = _allocate(store, conf, request.container_id, request.ifname)
            failpoint("host-local.add.after-lease")  # leased, lock held, nobody told yet
        return _result(conf.cni_version, allocated, conf.routes, dns)

    def delete(self, request: PluginRequest) -> None:
        conf = load_config(request)
        with _Store(conf.data_dir, conf.name) as store, store.locked():
            failpoint("host-local.del.before-release")  # lock held
            store.release(request.container_id, request.ifname, passes=len(conf.range_sets))

    def gc(self, request: PluginRequest) -> GCReport:
        """Release every lease of the network whose attachment is not in
        ``cni.dev/valid-attachments`` (a legacy bare-ID lease: whose container has no valid
        attachment), under the lock; with ``pycni.dev/dry-run`` only report them."""
        from ._common import dry_run, gc_report, valid_attachments

        conf = load_config(request)
        valid = valid_attachments(request)
        with _Store(conf.data_dir, conf.name) as store, store.locked():
            removed = store.collect(valid, dry_run=dry_run(request))
        return gc_report([f"host-local lease {ip} of {owner} (network {conf.name})" for ip, owner in removed])

    def status(self, request: PluginRequest) -> None:
        """Ready whenever the config is valid (nothing is touched on disk)."""
        load_config(request)

    def check(self, request: PluginRequest) -> None:
        conf = load_config(request)
        with _Store(conf.data_dir, conf.name) as store, store.locked():
            current, legacy = store.find(request.container_id, request.ifname)
        if not (current or legacy):
            raise _fail(f"host-local: Failed to find address added by container {request.container_id}")

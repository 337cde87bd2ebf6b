"""host-local's config: the ``ipam`` section, ``runtimeConfig`` and the requested IPs decoded and
validated as the reference's ``allocator.LoadIPAMConfig`` does, with its error texts (code 999)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from pycni import version as _version
from pycni._json import GoFields
from pycni.errors import CNIError, ConfigError
from pycni.sdk import PluginRequest, validate_network_name
from pycni.types import IPAddress, Route
from pycni.types import _common as _types

from ._errors import config_fail, go_quote, type_error

__all__ = ["DEFAULT_DATA_DIR", "HostLocalConfig", "IPNetwork", "IPRange", "RangeSet", "load_config", "parse_ip"]

DEFAULT_DATA_DIR = "/var/lib/cni/networks"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_ROUTE_INTS = ("mtu", "advmss", "priority", "table", "scope")


# ---------------------------------------------------------------------------------------------
# Addresses, parsed as Go's net.ParseIP / ParseCIDR do (IPv4-mapped IPv6 becomes IPv4).


def parse_ip(text: str) -> IPAddress | None:
    """``net.ParseIP`` (pycni.types' parser); None when ``text`` is not an address."""
    try:
        return _types.address(text)
    except _types.Invalid:
        return None


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
    ip = parse_ip(addr) if slash else None
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
        raise type_error(value, field, "net.IP")
    ip = parse_ip(value)
    if ip is None:
        raise config_fail(f"invalid IP address: {value}")
    return ip


def _decode_cidr(value: Any, field: str) -> _CIDR:
    """A ``types.IPNet`` field: null decodes as ``""`` and fails like it."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise type_error(value, field, "string")
    cidr = _parse_cidr(value)
    if cidr is None:
        raise config_fail(f"invalid CIDR address: {value}")
    return cidr


def _decode_requested(text: str, error: str) -> IPAddress | None:
    """A requested IP (``ip.IP``): an address or a CIDR; ``""`` is kept as "no address" (None)."""
    if text == "":
        return None
    ip = parse_ip(text) if "/" not in text else getattr(_parse_cidr(text), "ip", None)
    if ip is None:
        raise config_fail(f"{error}invalid IP address {text}")
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
    routes: tuple[Route, ...] = ()
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
        raise type_error(value, field, go_type)
    return value


def _array(value: Any, field: str, go_type: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise type_error(value, field, go_type)
    return value


def _string(value: Any, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise type_error(value, field, "string")
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


def _decode_route(value: Any) -> Route:
    field = "IPAMConfig.ipam.routes"
    if value is None:  # Go would print a null route, which no consumer accepts
        raise config_fail("invalid route: null")
    obj = _fields(_object(value, field, "types.Route"), ("dst", "gw") + _ROUTE_INTS)
    # A missing dst fails like "" instead of printing Go's "<nil>" route (unusable downstream).
    dst_text = obj.get("dst")
    _decode_cidr(dst_text, field)  # Go's checks and texts; then pycni.types' (cached) parse of the same text
    gw = _decode_ip(obj.get("gw"), field)
    ints: dict[str, int] = {}
    for key in _ROUTE_INTS:  # the CNI 1.1 route attributes, passed through like the latest plugin
        num = obj.get(key)
        if num is None:
            continue
        if isinstance(num, bool) or not isinstance(num, int):
            raise type_error(num, f"route.{key}", "int")
        ints[key] = num
    return Route(_types.cidr(dst_text), gw, **ints)


def _decode_ip_list(value: Any, field: str) -> list[IPAddress | None]:
    out = []
    for item in _array(value, field, "[]*ip.IP"):
        if item is not None and not isinstance(item, str):
            raise type_error(item, field, "*ip.IP")
        out.append(_decode_requested(item or "", ""))
    return out


def _env_requested_ip(request: PluginRequest) -> IPAddress | None:
    """``IP=`` from CNI_ARGS (an empty value requests nothing)."""
    value = request.load_args("IP").get("IP", "")
    return _decode_requested(value, f"ARGS: error parsing value of pair {go_quote('IP=' + value)}: ")


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
        raise config_fail("IP <nil> not v4 nor v6")
    if cidr.prefix > cidr.mask_bits - 2:
        raise config_fail(f"Network {cidr} too small to allocate from")
    if cidr.mask_bits != cidr.ip.max_prefixlen:
        raise config_fail("IPNet IP and Mask version mismatch")
    subnet = ipaddress.ip_network((cidr.ip, cidr.prefix), strict=False)
    if subnet.network_address != cidr.ip:
        raise config_fail(
            f"Network has host bits set. For a subnet mask of length {cidr.prefix} "
            f"the network address is {subnet.network_address}"
        )
    first = subnet.network_address + 1
    start = first if raw.start is None else raw.start
    if raw.start is not None and not _within(start, subnet, None, raw.end):
        raise config_fail(f"RangeStart {start} not in network {subnet}")
    if raw.end is None:
        end = subnet.broadcast_address - 1 if subnet.version == 4 else subnet.broadcast_address
    elif _within(raw.end, subnet, start, None):
        end = raw.end
    else:
        raise config_fail(f"RangeEnd {raw.end} not in network {subnet}")
    return IPRange(subnet=subnet, start=start, end=end, gateway=first if raw.gateway is None else raw.gateway)


def _overlap(a: IPRange, b: IPRange) -> bool:
    return a.start.version == b.start.version and int(a.start) <= int(b.end) and int(b.start) <= int(a.end)


def _canonical_set(raw_set: list[_RawRange]) -> RangeSet:
    if not raw_set:
        raise config_fail("empty range set")
    ranges: list[IPRange] = []
    for raw in raw_set:
        ranges.append(_canonical_range(raw))
        if ranges[-1].start.version != ranges[0].start.version:
            raise config_fail("mixed address families")
    for i, a in enumerate(ranges):
        for b in ranges[i + 1 :]:
            if _overlap(a, b):
                raise config_fail(f"subnets {a} and {b} overlap")
    return tuple(ranges)


def _check_data_dir(data_dir: str) -> None:
    if "\0" in data_dir or ".." in data_dir.split("/"):
        raise ConfigError(f'invalid dataDir "{data_dir}"', 'it must not contain ".." components or NUL')


def load_config(request: PluginRequest) -> HostLocalConfig:
    """Decode and validate as the reference does, with its error texts (code 999)."""
    validate_network_name(request.network_name)  # skel's check again: the name becomes a dir under dataDir
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
        raise config_fail("IPAM config missing 'ipam' key")

    env_ip = _env_requested_ip(request)
    requested = ([env_ip] if env_ip is not None else []) + arg_ips + runtime_ips
    if None in requested:
        raise config_fail("cannot understand ip: IP <nil> not v4 nor v6")
    requested_ips = tuple(ip for ip in requested if ip is not None)

    if legacy.subnet is not None:
        range_sets.insert(0, [legacy])
    range_sets[:0] = runtime_sets
    if not range_sets:
        raise config_fail("no IP ranges specified")
    sets = []
    for i, raw_set in enumerate(range_sets):
        try:
            sets.append(_canonical_set(raw_set))
        except ConfigError as e:
            raise config_fail(f"invalid range set {i}: {e.msg}") from None

    cni_version = request.cni_version
    families = [s[0].start.version for s in sets]
    if families.count(4) > 1 or families.count(6) > 1:
        try:
            new_enough = _version.greater_or_equal(cni_version, "0.3.0")
        except CNIError:
            new_enough = False
        if not new_enough:
            raise config_fail(f"CNI version {cni_version} does not support more than 1 address per family")
    for i, a_set in enumerate(sets):
        for j in range(i + 1, len(sets)):
            if any(_overlap(a, b) for a in a_set for b in sets[j]):
                raise config_fail(f"range set {i} overlaps with {j}")

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

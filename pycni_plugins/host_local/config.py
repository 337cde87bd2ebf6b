"""host-local's config: the ``ipam`` section, ``runtimeConfig`` and the requested IPs decoded and
validated as the reference's ``allocator.LoadIPAMConfig`` does, with its error texts (code 999)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from pycni import version as _version
from pycni._json import GoFields, GoReader, GoValueError, dumps_compact, go_array, go_fold, go_object, go_string
from pycni.errors import CNIError, ConfigError
from pycni.sdk import PluginRequest, validate_network_name
from pycni.types import IPAddress, Route
from pycni.types import _common as _types

from ._errors import config_fail, go_quote

__all__ = ["DEFAULT_DATA_DIR", "HostLocalConfig", "IPNetwork", "IPRange", "RangeSet", "load_config", "parse_ip"]

DEFAULT_DATA_DIR = "/var/lib/cni/networks"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

T = TypeVar("T")
_ROUTE_INTS = ("mtu", "advmss", "priority", "table", "scope")


# ---------------------------------------------------------------------------------------------
# Addresses, parsed as Go's net.ParseIP / ParseCIDR do (IPv4-mapped IPv6 becomes IPv4).


def parse_ip(text: str) -> IPAddress | None:
    """``net.ParseIP`` (pycni.types' parser); None when ``text`` is not an address."""
    try:
        return _types.address(text)
    except GoValueError:
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


def _decode_ip(value: Any) -> IPAddress | None:
    """A ``net.IP`` field: null and ``""`` mean unset."""
    if value is None or value == "":
        return None
    ip = parse_ip(go_string(value, "net.IP"))
    if ip is None:
        raise config_fail(f"invalid IP address: {value}")
    return ip


def _decode_cidr(value: Any) -> _CIDR:
    """A ``types.IPNet`` field: null decodes as ``""`` and fails like it."""
    value = go_string(value)
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


def _type_error(e: GoValueError) -> ConfigError:
    return config_fail(e.go_message())


def _reader(obj: Mapping[str, Any], struct: str) -> GoReader:
    """Go's decoding into the struct ``struct`` (as Go's messages name it), with host-local's errors."""
    return GoReader(obj, struct, _type_error)


def _each(items: list[Any], decode: Callable[[Any], T], field: str) -> list[T]:
    """The elements of the slice field ``field``, decoded; a type error names the field, as Go's does."""
    out = []
    for item in items:
        try:
            out.append(decode(item))
        except GoValueError as e:
            e.field = e.field or field
            raise _type_error(e) from None
    return out


_SUBNET = GoFields("subnet")


def _decode_range(obj: Mapping[str, Any], struct: str) -> _RawRange:
    f = _reader(obj, struct)
    return _RawRange(
        # A null subnet fails as "" does; no key leaves it unset.
        subnet=f.read("subnet", _decode_cidr) if "subnet" in _SUBNET.pick(obj) else None,
        start=f.read("rangeStart", _decode_ip),
        end=f.read("rangeEnd", _decode_ip),
        gateway=f.read("gateway", _decode_ip),
    )


def _decode_range_sets(f: GoReader, name: str, go_path: str) -> list[list[_RawRange]]:
    field = f"{f.struct}.{name}"

    def range_set(raw_set: Any) -> list[_RawRange]:
        ranges = go_array(raw_set, "allocator.RangeSet")
        return [_decode_range(go_object(raw, "allocator.Range"), f"Range.{go_path}") for raw in ranges]

    return _each(f.array(name, go_type="[]allocator.RangeSet"), range_set, field)


_ROUTE = "IPAMConfig.ipam.routes"


def _decode_route(value: Any) -> Route:
    if value is None:  # Go would print a null route, which no consumer accepts
        raise config_fail("invalid route: null")
    obj = go_object(value, "types.Route")
    f = _reader(obj, "route")
    # A missing dst fails like "" instead of printing Go's "<nil>" route (unusable downstream).
    dst_text = f.get("dst")
    try:
        _decode_cidr(dst_text)  # Go's checks and texts; then pycni.types' (cached) parse of the same text
        gw = _decode_ip(f.get("gw"))
    except GoValueError as e:
        e.field = _ROUTE
        raise _type_error(e) from None
    # The CNI 1.1 route attributes, passed through like the latest plugin.
    ints = {key: f.integer(key) for key in _ROUTE_INTS if f.get(key) is not None}
    return Route(_types.cidr(dst_text), gw, **ints)


def _decode_requested_ip(item: Any) -> IPAddress | None:
    return _decode_requested(go_string(item, "*ip.IP"), "")


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


#: Configs decoded lately, by the JSON text of the top-level members ``load_config`` reads
#: (those whose key folds onto ``name``, ``cniVersion``, ``ipam``, ``runtimeConfig`` or ``args``,
#: so not a DEL's ``prevResult``) and ``CNI_ARGS``: a runtime's preflight, its ADD and its DEL
#: decode the same config. A :class:`HostLocalConfig` is immutable all the way down, so one may
#: be handed out twice. An object with a repeated key is never keyed: its text (last values
#: only) does not say what Go's decoding of each member in turn gives.
_decoded: dict[tuple[str, str], HostLocalConfig] = {}
_DECODED_MAX = 32
_READ = frozenset(("name", "cniversion", "ipam", "runtimeconfig", "args"))


def _memo_key(request: PluginRequest) -> tuple[str, str] | None:
    config = request.config
    if type(config) is not dict:  # a Repeated object, or a mapping that is not decoded JSON
        return None
    read = {key: value for key, value in config.items() if isinstance(key, str) and go_fold(key) in _READ}
    if not all(map(_plain, read.values())):
        return None
    return dumps_compact(read), request.args


_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """Whether ``value`` is what JSON decodes to, with no repeated key: its text then says all
    that decoding it sees (a tuple, an int key or a Repeated object would encode like another)."""
    kind = type(value)
    if kind is dict:
        return all(type(key) is str for key in value) and all(map(_plain, value.values()))
    if kind is list:
        return all(map(_plain, value))
    return kind in _SCALARS


def load_config(request: PluginRequest) -> HostLocalConfig:
    """Decode and validate as the reference does, with its error texts (code 999)."""
    key = _memo_key(request)
    if key is None:
        return _load_config(request)
    conf = _decoded.get(key)
    if conf is None:
        conf = _load_config(request)  # a config that fails is not kept: it fails again, the same way
        if len(_decoded) >= _DECODED_MAX:
            _decoded.clear()
        _decoded[key] = conf
    return conf


def _load_config(request: PluginRequest) -> HostLocalConfig:
    validate_network_name(request.network_name)  # skel's check again: the name becomes a dir under dataDir
    top = _reader(request.config, "Net")
    ipam_raw = top.get("ipam")
    ipam = _reader(top.mapping("ipam", go_type="allocator.IPAMConfig"), "IPAMConfig.ipam")
    ipam.string("type")  # only checked: the runtime chose this plugin by it
    data_dir, resolv_conf = ipam.string("dataDir"), ipam.string("resolvConf")
    routes = _each(ipam.array("routes", go_type="[]*types.Route"), _decode_route, _ROUTE)
    range_sets = _decode_range_sets(ipam, "ranges", "ipam.ranges")
    legacy = _decode_range(ipam.obj, "IPAMConfig.ipam")
    runtime = _reader(top.mapping("runtimeConfig", go_type="struct"), ".runtimeConfig")
    runtime_sets = _decode_range_sets(runtime, "ipRanges", "runtimeConfig.ipRanges")
    runtime_ips = _each(runtime.array("ips", go_type="[]*ip.IP"), _decode_requested_ip, ".runtimeConfig.ips")
    args = _reader(top.mapping("args", go_type="struct"), ".args")
    cni_args = _reader(args.mapping("cni", go_type="allocator.IPAMArgs"), "IPAMArgs.args.cni")
    arg_ips = _each(cni_args.array("ips", go_type="[]*ip.IP"), _decode_requested_ip, "IPAMArgs.args.cni.ips")
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

    data_dir = data_dir or DEFAULT_DATA_DIR
    _check_data_dir(data_dir)
    return HostLocalConfig(
        name=request.network_name,
        cni_version=cni_version,
        range_sets=tuple(sets),
        routes=tuple(routes),
        data_dir=data_dir,
        resolv_conf=resolv_conf,
        requested_ips=requested_ips,
    )

"""What every result version shares: :class:`DNS` and :class:`Route` (Go's ``pkg/types``), and
the decoders the version modules build on.

Decoding mirrors Go's ``encoding/json`` as libcni uses it, so pycni accepts what libcni accepts:

- ``null`` or a missing key gives the zero value (``""``, ``0``, ``None``, ``()``);
- no coercion: a string is never an int, a bool never a string, ``1.0`` is not an int;
- ints are Go ``int`` (int64): negative values are accepted, as Go does;
- unknown keys are ignored, and a key matches a field exactly or else case-insensitively
  (Go's field matching, :class:`~pycni._json.GoFields`); a field reached by several keys is
  decoded from each in turn, as Go does (see :func:`members`);
- addresses and CIDRs follow ``net.ParseIP`` / ``net.ParseCIDR``: no leading zeros in IPv4
  octets, no IPv6 zones, leading zeros allowed in the prefix length, and an IPv4-mapped IPv6
  address *is* IPv4 (Go's ``To4()``), with prefix ``max(0, bits - 96)``.

Deliberately stricter than Go, where Go would hand a nil or ``"<nil>"`` value to the consumer:
a missing ``address``/``ip``/``dst`` and ``null`` entries in object lists are rejected.

Decoders raise :class:`~pycni._json.GoValueError` (the reader's typed getters do); each level
records its key or index on the way out, and the public entry points turn it into one
:class:`~pycni.errors.ResultError` naming the path (:func:`invalid`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from ipaddress import IPv4Address, IPv4Interface, IPv6Address, IPv6Interface
from typing import Any, TypeVar

import attrs

from .._json import GoFields, GoValueError, Repeated, go_array, go_int, go_kind, go_string, kind, members_of
from ..errors import ResultError

IPAddress = IPv4Address | IPv6Address
IPInterface = IPv4Interface | IPv6Interface

T = TypeVar("T")

MISSING: Any = object()
"""``obj.get(key, MISSING)`` for the fields where absent and ``null`` mean different things."""

_QUOTE_LIMIT = 80


def invalid(e: GoValueError, what: str) -> ResultError:
    """The public error for a decoding failure: ``invalid <what>: <path>: <problem>``."""
    where = e.where()
    return ResultError(f"invalid {what}: {where}: {e.problem()}" if where else f"invalid {what}: {e.problem()}")


def checked(decode: Callable[[Any], T], obj: Any, what: str) -> T:
    """Run a decoder for a public ``from_json``: only :class:`ResultError` escapes."""
    try:
        return decode(obj)
    except GoValueError as e:
        raise invalid(e, what) from None


def quote(text: str) -> str:
    """Go-``%q``-like quoting, ASCII-safe and bounded: messages must survive any input."""
    return json.dumps(text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "...")


def expected(what: str, value: Any) -> GoValueError:
    if value is MISSING:
        return GoValueError(text="required field is missing")
    return GoValueError(value, what)


class ObjectKeys:
    """How Go decodes one JSON object type: its fields (:class:`~pycni._json.GoFields`), and
    for a repeated key, which fields a type's own ``UnmarshalJSON`` replaces ``whole`` (IPs and
    routes: their elements too) and which are pointers a later ``null`` resets (``nullable``)."""

    __slots__ = ("fields", "whole", "nullable")

    def __init__(self, fields: GoFields, whole: frozenset[str], nullable: frozenset[str]) -> None:
        self.fields, self.whole, self.nullable = fields, whole, nullable


def object_keys(
    *names: str, ignored: str = "", whole: tuple[str, ...] = (), nullable: tuple[str, ...] = ()
) -> ObjectKeys:
    """``ignored`` is a field read elsewhere (``cniVersion``): matched, then left to its reader."""
    return ObjectKeys(GoFields(*names, *((ignored,) if ignored else ())), frozenset(whole), frozenset(nullable))


def _concat(old: dict[Any, Any], new: dict[Any, Any]) -> Repeated:
    # Decoding two objects in turn into one Go struct (or map) is decoding their members in turn.
    merged = Repeated({**old, **new})
    merged.pairs = members_of(old) + members_of(new)
    return merged


def _clash(old: Any, new: Any) -> bool:
    return old is not None and new is not None and go_kind(old) != go_kind(new)


def _merge(old: Any, new: Any, name: str, keys: ObjectKeys) -> Any:
    """The value Go's decoder is left with after decoding ``new`` over ``old`` in field ``name``.

    A value that a later one replaces is checked for its JSON type only (Go would also report
    a bad value inside it, which pycni never decodes).
    """
    if new is None:  # null resets slices and pointers; a struct, string or number keeps its value
        return None if isinstance(old, list) or name in keys.nullable else old
    if old is None:
        return new
    if _clash(old, new):
        raise GoValueError(text=f"repeated key with clashing types: {kind(old)}, then {kind(new)}").at(name)
    if isinstance(new, dict):
        return new if name in keys.whole else _concat(old, new)
    if not isinstance(new, list):
        return new
    # A slice keeps its elements and decodes the new ones into them (its length is the new one's).
    out = list(new)
    for i, (was, item) in enumerate(zip(old, new)):
        if _clash(was, item):
            raise GoValueError(text=f"repeated key with clashing types: {kind(was)}, then {kind(item)}").at(i).at(name)
        if isinstance(was, dict) and isinstance(item, dict) and name not in keys.whole:
            out[i] = _concat(was, item)
    return out


def members(value: Any, keys: ObjectKeys) -> dict[Any, Any]:
    """``value`` as an object whose keys are the canonical names (fast path: already are).

    A field reached by several keys (a repeated key, or ``name`` then ``Name``) gets what Go's
    decoder leaves there: scalars the last value, objects their members merged, arrays merged
    element by element, and different JSON types an error (Go reports the one that is wrong).
    """
    if not isinstance(value, dict):
        raise expected("an object", value)
    if type(value) is not Repeated and value.keys() <= keys.fields.names:
        return value
    out: dict[str, Any] = {}
    for name, item in keys.fields.pairs(value):
        out[name] = _merge(out[name], item, name, keys) if name in out else item
    return out


def optional_integer(value: Any) -> int | None:
    """A Go ``*int``: ``None`` when absent or null, so an explicit 0 survives."""
    return None if value is None else go_int(value)


def strings(value: Any) -> tuple[str, ...]:
    """A Go ``[]string`` (a ``null`` element is ``""``, as Go decodes it)."""
    return array(value, go_string)


def array(value: Any, decode: Callable[[Any], T]) -> tuple[T, ...]:
    """A Go slice; ``decode`` refuses a ``null`` entry of ``[]*T`` (Go keeps nil pointers that
    crash consumers) and makes it the zero value of ``[]T``."""
    out = []
    for i, item in enumerate(go_array(value)):
        try:
            out.append(decode(item))
        except GoValueError as e:
            raise e.at(i) from None
    return tuple(out)


def _parse_address(text: str) -> IPAddress:
    if ":" not in text:
        return IPv4Address(text)
    if "%" in text:
        raise ValueError("zones are not allowed")
    addr = IPv6Address(text)
    mapped = addr.ipv4_mapped
    return addr if mapped is None else mapped


def _parse_cidr(text: str) -> IPInterface:
    addr, slash, bits = text.partition("/")
    digits = bits.lstrip("0")
    if not slash or not bits.isascii() or not bits.isdigit() or len(digits) > 3:
        raise ValueError("bad prefix length")
    prefix = int(digits or "0")
    if ":" not in addr:
        if prefix > 32:
            raise ValueError("prefix length out of range")
        return IPv4Interface((IPv4Address(addr), prefix))
    if "%" in addr or prefix > 128:
        raise ValueError("zone or prefix length out of range")
    ip6 = IPv6Address(addr)
    mapped = ip6.ipv4_mapped
    if mapped is None:
        return IPv6Interface((ip6, prefix))
    return IPv4Interface((mapped, max(prefix - 96, 0)))


# Plugins repeat the same gateways and routes endlessly, and building ipaddress objects costs
# microseconds; the objects are immutable, so share them. Long strings bypass the caches.
_cached_address = functools.lru_cache(maxsize=2048)(_parse_address)
_cached_cidr = functools.lru_cache(maxsize=2048)(_parse_cidr)


def cidr(value: Any) -> IPInterface:
    """A required CIDR (``net.ParseCIDR``, host bits kept: ``10.1.2.3/24``)."""
    if isinstance(value, str):
        try:
            return _cached_cidr(value) if len(value) <= 64 else _parse_cidr(value)
        except ValueError:
            raise GoValueError(text=f"invalid CIDR address {quote(value)}") from None
    raise expected("a CIDR string", value)


def address(value: Any) -> IPAddress | None:
    """An optional IP (Go ``net.IP``): absent, ``null`` and ``""`` all mean none."""
    if isinstance(value, str):
        if not value:
            return None
        try:
            return _cached_address(value) if len(value) <= 64 else _parse_address(value)
        except ValueError:
            raise GoValueError(text=f"invalid IP address {quote(value)}") from None
    if value is None:
        return None
    raise expected("an IP address string", value)


# attrs field converters: named and per element type, so type checkers see the __init__ types
# (attrs' mypy plugin loses the element type of a bare ``converter=tuple``).
def str_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def route_tuple(items: Iterable[Route]) -> tuple[Route, ...]:
    return tuple(items)


@attrs.frozen
class DNS:
    """Resolver settings; empty when the plugin has none."""

    nameservers: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    domain: str = ""
    search: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    options: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    arrays: frozenset[str] = attrs.field(default=frozenset(), eq=False, repr=False)
    """The list fields the decoded JSON gave as arrays, even empty ones: Go's non-nil slices,
    which consumers such as Nomad's status copy as ``[]`` rather than ``null``."""

    @classmethod
    def from_json(cls, obj: Any) -> DNS:
        return checked(decode_dns, obj, "dns")

    def to_json(self) -> dict[str, Any]:
        """Go omits every empty field, so an empty DNS is ``{}``."""
        out: dict[str, Any] = {}
        if self.nameservers:
            out["nameservers"] = list(self.nameservers)
        if self.domain:
            out["domain"] = self.domain
        if self.search:
            out["search"] = list(self.search)
        if self.options:
            out["options"] = list(self.options)
        return out


_DNS_KEYS = object_keys("nameservers", "domain", "search", "options")
EMPTY_DNS = DNS()


def decode_dns(value: Any) -> DNS:
    if value is None:
        return EMPTY_DNS
    obj = members(value, _DNS_KEYS)
    key = "nameservers"
    try:
        nameservers = strings(obj.get("nameservers"))
        key = "domain"
        domain = go_string(obj.get("domain"))
        key = "search"
        search = strings(obj.get("search"))
        key = "options"
        options = strings(obj.get("options"))
    except GoValueError as e:
        raise e.at(key) from None
    arrays = frozenset(k for k in ("nameservers", "search", "options") if isinstance(obj.get(k), list))
    return DNS(nameservers, domain, search, options, arrays)


@attrs.frozen
class Route:
    """A route; one Go type for every result version, so 0.x results carry the 1.1.0 fields too.

    ``table`` and ``scope`` are Go pointers: ``None`` is absent, 0 is emitted (scope 0 = global).
    """

    dst: IPInterface
    gw: IPAddress | None = None
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None

    @classmethod
    def from_json(cls, obj: Any) -> Route:
        return checked(decode_route, obj, "route")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dst": str(self.dst)}
        if self.gw is not None:
            out["gw"] = str(self.gw)
        if self.mtu:
            out["mtu"] = self.mtu
        if self.advmss:
            out["advmss"] = self.advmss
        if self.priority:
            out["priority"] = self.priority
        if self.table is not None:
            out["table"] = self.table
        if self.scope is not None:
            out["scope"] = self.scope
        return out


_ROUTE_KEYS = object_keys("dst", "gw", "mtu", "advmss", "priority", "table", "scope", nullable=("gw", "table", "scope"))


def decode_route(value: Any) -> Route:
    obj = members(value, _ROUTE_KEYS)
    key = "dst"
    try:
        dst = cidr(obj.get("dst", MISSING))
        key = "gw"
        gw = address(obj.get("gw"))
        key = "mtu"
        mtu = go_int(obj.get("mtu"))
        key = "advmss"
        advmss = go_int(obj.get("advmss"))
        key = "priority"
        priority = go_int(obj.get("priority"))
        key = "table"
        table = optional_integer(obj.get("table"))
        key = "scope"
        scope = optional_integer(obj.get("scope"))
    except GoValueError as e:
        raise e.at(key) from None
    return Route(dst, gw, mtu, advmss, priority, table, scope)


def declared_version(value: Any, versions: tuple[str, ...]) -> str:
    """The ``cniVersion`` of a result decoded on its own: ``""`` or one of ``versions``."""
    if not isinstance(value, dict):
        return ""  # the decoder reports the wrong type
    try:
        version = go_string(value.get("cniVersion"))
    except GoValueError as e:
        raise e.at("cniVersion") from None
    if version and version not in versions:
        raise GoValueError(text=f"version {quote(version)} is not one of {', '.join(versions)}").at("cniVersion")
    return version


def versioned(decode: Callable[[Any, str], T], value: Any, versions: tuple[str, ...]) -> T:
    """A result model's public ``from_json``: ``decode`` at the version ``value`` declares (one of
    ``versions``, or ``""``); only :class:`ResultError` escapes."""
    try:
        return decode(value, declared_version(value, versions))
    except GoValueError as e:
        raise invalid(e, "result") from None

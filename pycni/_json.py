"""Strict JSON decoding shared by every reader of untrusted bytes (configs, results, caches).

Integers stay Python ints (never a float round-trip); NaN/Infinity literals and numbers that
overflow a float are refused, as Go's encoding/json refuses them; deep nesting is an error,
not a RecursionError.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = [
    "JSONDecodeFailure",
    "GoFields",
    "GoReader",
    "GoValueError",
    "INT64",
    "Repeated",
    "go_array",
    "go_bool",
    "go_int",
    "go_object",
    "go_string",
    "go_field",
    "go_fold",
    "members_of",
    "loads",
    "dumps_compact",
    "dumps_compact_ascii",
    "go_escape",
    "go_marshal",
    "go_marshal_indent",
    "go_quote",
    "kind",
    "go_kind",
]


class JSONDecodeFailure(ValueError):
    """Why a document is not acceptable JSON (message says where)."""


def _reject_constant(name: str) -> Any:
    raise JSONDecodeFailure(f"invalid number literal {name}")


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JSONDecodeFailure(f"number {text[:40]} out of range")
    return value


def _float64_int(text: str) -> int:
    if len(text) > 300:  # shorter literals always fit a float64
        _parse_float(text)
    return int(text)


class Repeated(dict[Any, Any]):
    """A decoded object that repeats a key: as a dict it holds the last value (what a Go map
    keeps); ``pairs`` are all its members in order (what a Go struct decoder sees)."""

    __slots__ = ("pairs",)
    pairs: list[tuple[str, Any]]


def members_of(obj: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """All of a decoded object's members in document order, repeated keys included."""
    return obj.pairs if type(obj) is Repeated else list(obj.items())


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    repeated = Repeated(obj)
    repeated.pairs = pairs
    return repeated


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_parse_float, object_pairs_hook=_object)
# Go code that decodes into interface{} (libcni reading results) turns every number into a
# float64, so an integer literal beyond float64 range is an error there too.
_FLOAT64_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_float64_int, object_pairs_hook=_object
)
# Plain dicts: what Go keeps when it decodes into map[string]interface{} (a key's last value).
_MAP_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_parse_float)
_FLOAT64_MAP_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_float64_int
)

# Go's encoding/json folds a key onto an ASCII field name with simple case folding: ASCII
# letters, plus U+017F (long s) and U+212A (Kelvin sign), which fold onto "s" and "k".
_FOLD_TABLE: dict[int, int | str] = {**{c: c + 32 for c in range(ord("A"), ord("Z") + 1)}, 0x17F: "s", 0x212A: "k"}


def go_fold(key: str) -> str:
    """The form under which Go matches ``key`` to a struct field case-insensitively."""
    return key.lower() if key.isascii() else key.translate(_FOLD_TABLE)


class GoFields:
    """The JSON field names of one Go struct and Go's rule for matching a key to one of them:
    the field named exactly, else the first field equal under case folding; unknown keys match
    nothing. (A Go *map* matches keys exactly: use the dict itself.)"""

    __slots__ = ("names", "_folded")

    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)
        self._folded: dict[str, str] = {}
        for name in names:
            self._folded.setdefault(go_fold(name), name)

    def lookup(self, key: object) -> str | None:
        if not isinstance(key, str):
            return None
        if key in self.names:
            return key
        return self._folded.get(go_fold(key))

    def pairs(self, obj: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """``obj``'s members that reach a field, as ``(field, value)`` in document order
        (repeated keys included: Go decodes each in turn into the same field)."""
        out = []
        for key, value in members_of(obj):
            name = self.lookup(key)
            if name is not None:
                out.append((name, value))
        return out

    def pick(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """``obj`` by field name, the later of two keys for one field winning (scalars, as Go)."""
        if type(obj) is not Repeated and obj.keys() <= self.names:
            return obj
        return dict(self.pairs(obj))


_folded_name = functools.lru_cache(maxsize=1024)(go_fold)


def _folded_values(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj``'s values by the folded form of their key, the later key winning: for a single
    field, exactly what :meth:`GoFields.pick` gives (every key that folds onto a field's name
    reaches it). One pass over the keys serves every field read from ``obj``."""
    items = obj.pairs if type(obj) is Repeated else obj.items()
    return {
        (key.lower() if key.isascii() else key.translate(_FOLD_TABLE)): value
        for key, value in items
        if isinstance(key, str)
    }


def go_field(obj: Mapping[str, Any], name: str) -> Any:
    """The value Go decodes into struct field ``name`` from ``obj`` (None when no key reaches it)."""
    return _folded_values(obj).get(_folded_name(name))


T = TypeVar("T")

#: Go's ``int`` (int64).
INT64 = (-(2**63), 2**63 - 1)
_SURROGATE = re.compile("[\ud800-\udfff]")


class GoValueError(ValueError):
    """A JSON value Go's decoder cannot put into its field: of another JSON type than ``wanted``
    (``"a string"``), an integer outside ``bounds``, or (``text``) a problem a caller words itself.

    Each family words it its own way, from the same facts: :meth:`go_message` is Go's
    ``json: cannot unmarshal …`` (configs, plugins), :meth:`problem` pycni's ``expected …, got …``
    (results, Nomad's models) after the ``path`` of keys and indexes (innermost first, :meth:`at`).
    """

    def __init__(
        self,
        value: Any = None,
        wanted: str = "",
        go_type: str = "",
        *,
        bounds: tuple[int, int] | None = None,
        text: str = "",
    ) -> None:
        self.value, self.wanted, self.go_type, self.bounds, self.text = value, wanted, go_type, bounds, text
        self.field = ""
        """The Go struct field (``Struct.name``) Go's message names; set by :class:`GoReader`."""
        self.path: list[str | int] = []
        super().__init__(text or self.problem())

    def at(self, segment: str | int) -> GoValueError:
        """Record the key (``str``; a ``[…]`` one is a map key, kept as written) or index outside."""
        self.path.append(segment)
        return self

    def where(self) -> str:
        out = ""
        for seg in reversed(self.path):
            out += f"[{seg}]" if isinstance(seg, int) else (seg if not out or seg[:1] == "[" else f".{seg}")
        return out

    def go_message(self, field: str = "") -> str:
        """Go's own text, naming ``field`` (default: the one recorded)."""
        if self.text:
            return self.text
        shown = f"number {self.value}" if self.bounds is not None else go_kind(self.value)
        return f"json: cannot unmarshal {shown} into Go struct field {field or self.field} of type {self.go_type}"

    def problem(self, *, literal: bool = False) -> str:
        """pycni's text: the value's kind (``literal``: the value itself, and the bounds)."""
        value = self.value
        if self.text:
            return self.text
        if self.bounds is not None:
            if literal:
                shown = str(value) if value.bit_length() <= 128 else "a too large number"
                return f"integer {shown} out of range [{self.bounds[0]}, {self.bounds[1]}]"
            shown = str(value) if value.bit_length() <= 128 else f"with {value.bit_length()} bits"
            return f"integer {shown} out of range"
        if literal or (isinstance(value, float) and self.wanted == "an integer"):
            return f"expected {self.wanted}, got {_show(value)}"
        return f"expected {self.wanted}, got {kind(value)}"


def _show(value: Any) -> str:
    """A decoded value as messages quote it: scalars as JSON (strings cut at 40), else its kind."""
    if value is None or isinstance(value, (list, dict)):
        return kind(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 128 else "a too large number"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = json.dumps(value[:40])
        return text if len(value) <= 40 else text[:-1] + '..."'
    return kind(value)


# The typed getters: Go's decoding of one JSON value into a Go type. ``null`` (or absence,
# ``None``) gives the zero value; no coercion (a string is never a number, 1.0 is no int).


def go_string(value: Any, go_type: str = "string") -> str:
    """A Go ``string``; a lone surrogate (from a ``\\ud800`` escape) becomes U+FFFD, as in Go."""
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub("\ufffd", value)
    if value is None:
        return ""
    raise GoValueError(value, "a string", go_type)


def go_int(value: Any, go_type: str = "int", bounds: tuple[int, int] | None = INT64) -> int:
    """A Go integer type within ``bounds``: a JSON number without fraction or exponent (``bounds``
    ``None``: any, for a caller that checks the range itself with its own message)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if bounds is None or bounds[0] <= value <= bounds[1]:
            return value
        raise GoValueError(value, "an integer", go_type, bounds=bounds)
    if value is None:
        return 0
    raise GoValueError(value, "an integer", go_type)


def go_bool(value: Any, go_type: str = "bool") -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    raise GoValueError(value, "a boolean", go_type)


def go_object(value: Any, go_type: str = "object") -> Mapping[str, Any]:
    """A Go struct or map: the decoded object (``{}`` for null)."""
    if isinstance(value, dict):
        return value
    if value is None:
        return {}
    raise GoValueError(value, "an object", go_type)


def go_array(value: Any, go_type: str = "array") -> list[Any]:
    """A Go slice: the decoded array (``[]`` for null)."""
    if isinstance(value, list):
        return value
    if value is None:
        return []
    raise GoValueError(value, "an array", go_type)


class GoReader:
    """Typed reads of the fields of a Go struct ``struct`` from a decoded JSON object, by Go's
    rules: the key reaching a field is found as :class:`GoFields` finds it (the later of two
    winning), ``null`` or no key gives the default, and a value of another JSON type is a
    :class:`GoValueError` naming ``struct.field``, which ``error`` turns into the caller's error.

    ``source`` reads another object (a nested struct) with the same error rule.
    """

    __slots__ = ("obj", "struct", "_error", "_values")

    def __init__(
        self,
        obj: Mapping[str, Any],
        struct: str = "",
        error: Callable[[GoValueError], Exception] | None = None,
    ) -> None:
        self.obj, self.struct, self._error = obj, struct, error
        self._values: dict[str, Any] | None = None  # _folded_values(obj), made at the first read

    def get(self, name: str, source: Mapping[str, Any] | None = None) -> Any:
        if source is not None:
            return go_field(source, name)
        if self._values is None:
            self._values = _folded_values(self.obj)
        return self._values.get(_folded_name(name))

    def read(self, name: str, decode: Callable[[Any], T], source: Mapping[str, Any] | None = None) -> T:
        """Field ``name`` through ``decode`` (a typed getter); its error names the field."""
        return self._decoded(name, decode, self.get(name, source))

    def _decoded(self, name: str, decode: Callable[[Any], T], value: Any) -> T:
        try:
            return decode(value)
        except GoValueError as e:
            e.field = f"{self.struct}.{name}"
            e.at(name)
            raise (e if self._error is None else self._error(e)) from None

    def string(self, name: str, default: str = "", source: Mapping[str, Any] | None = None) -> str:
        value = self.get(name, source)
        return default if value is None else self._decoded(name, go_string, value)

    def integer(
        self,
        name: str,
        default: int = 0,
        source: Mapping[str, Any] | None = None,
        bounds: tuple[int, int] | None = INT64,
    ) -> int:
        value = self.get(name, source)
        return default if value is None else self._decoded(name, lambda v: go_int(v, bounds=bounds), value)

    def flag(self, name: str, default: bool = False, source: Mapping[str, Any] | None = None) -> bool:
        value = self.get(name, source)
        return default if value is None else self._decoded(name, go_bool, value)

    def mapping(self, name: str, source: Mapping[str, Any] | None = None, go_type: str = "object") -> Mapping[str, Any]:
        return self.read(name, lambda v: go_object(v, go_type), source)

    def array(self, name: str, source: Mapping[str, Any] | None = None, go_type: str = "array") -> list[Any]:
        return self.read(name, lambda v: go_array(v, go_type), source)


def loads(data: bytes | str, *, float64_numbers: bool = False, go_maps: bool = False) -> Any:
    """Decode one JSON document; raise :class:`JSONDecodeFailure` with a readable reason.

    Objects that repeat a key come back as :class:`Repeated`, for decoders that follow Go's
    struct rules; ``go_maps`` instead keeps only each key's last value everywhere, as Go does
    when it decodes into ``map[string]interface{}``. ``float64_numbers`` also refuses integers a
    float64 cannot hold (as libcni does for results).
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JSONDecodeFailure(f"invalid UTF-8 at byte {e.start}") from None
    if not data.strip():
        raise JSONDecodeFailure("unexpected end of JSON input")
    try:
        if go_maps:
            return (_MAP_DECODER if not float64_numbers else _FLOAT64_MAP_DECODER).decode(data)
        return (_FLOAT64_DECODER if float64_numbers else _DECODER).decode(data)
    except json.JSONDecodeError as e:
        raise JSONDecodeFailure(f"{e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise JSONDecodeFailure("JSON nested too deeply") from None
    except ValueError as e:  # int-string conversion limit, etc.
        raise JSONDecodeFailure(str(e)) from None


# Made once: json.dumps with any argument builds a new encoder per call.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_COMPACT_SORTED = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True)
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"))
_GO_INDENTED = json.JSONEncoder(ensure_ascii=False, indent="\t", separators=(",", ": "))


def dumps_compact(value: Any, *, sort_keys: bool = False) -> str:
    return (_COMPACT_SORTED if sort_keys else _COMPACT).encode(value)


def dumps_compact_ascii(value: Any) -> str:
    """:func:`dumps_compact` with every non-ASCII character escaped: safe to ``.encode()`` even
    when a string holds a lone surrogate."""
    return _COMPACT_ASCII.encode(value)


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def go_escape(encoded: str) -> str:
    """What Go's encoder does beyond Python's to already-encoded JSON (``ensure_ascii=False``):
    the HTML-safe escapes, and strings coerced to valid UTF-8 (a lone surrogate, Python's
    stand-in for invalid UTF-8 or a ``\\ud800`` escape, becomes U+FFFD), so the text always encodes.

    Python's json already escapes exactly Go's control set (``\\b \\f \\n \\r \\t`` short,
    ``\\u00xx`` lowercase); these characters only occur inside strings.
    """
    if encoded.isascii():  # the common case: no surrogate, and translate() only if there is work
        return encoded.translate(_GO_ESCAPES) if "<" in encoded or ">" in encoded or "&" in encoded else encoded
    return _SURROGATE.sub("\ufffd", encoded.translate(_GO_ESCAPES))


def go_marshal(value: Any) -> str:
    """Go's ``json.Marshal`` for dicts (in struct field order), lists, str, int, bool, None."""
    return go_escape(_COMPACT.encode(value))


def go_marshal_indent(value: Any) -> str:
    """Go's ``json.MarshalIndent(v, "", "\\t")``: tab indent, ``": "``, no trailing newline."""
    return go_escape(_GO_INDENTED.encode(value))


_SHORT = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote`` (what ``%q`` prints)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in _SHORT:
            out.append(_SHORT[ch])
        elif ch < " " or ch == "\x7f":
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def kind(value: Any) -> str:
    """A decoded value's JSON kind for messages ("an array", "null", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def go_kind(value: Any) -> str:
    """The kind Go's encoding/json names in "cannot unmarshal <kind> into ..." errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"

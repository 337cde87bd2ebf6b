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
from collections.abc import Mapping
from typing import Any

__all__ = [
    "JSONDecodeFailure",
    "GoFields",
    "Repeated",
    "go_field",
    "go_fold",
    "members_of",
    "loads",
    "dumps_compact",
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


_single_field = functools.lru_cache(maxsize=1024)(GoFields)


def go_field(obj: Mapping[str, Any], name: str) -> Any:
    """The value Go decodes into struct field ``name`` from ``obj`` (None when no key reaches it)."""
    return _single_field(name).pick(obj).get(name)


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


def dumps_compact(value: Any, *, sort_keys: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False)


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


_SURROGATE = re.compile("[\ud800-\udfff]")


def go_escape(encoded: str) -> str:
    """What Go's encoder does beyond Python's to already-encoded JSON (``ensure_ascii=False``):
    the HTML-safe escapes, and strings coerced to valid UTF-8 (a lone surrogate, Python's
    stand-in for invalid UTF-8 or a ``\\ud800`` escape, becomes U+FFFD), so the text always encodes.

    Python's json already escapes exactly Go's control set (``\\b \\f \\n \\r \\t`` short,
    ``\\u00xx`` lowercase); these characters only occur inside strings.
    """
    return _SURROGATE.sub("\ufffd", encoded.translate(_GO_ESCAPES))


def go_marshal(value: Any) -> str:
    """Go's ``json.Marshal`` for dicts (in struct field order), lists, str, int, bool, None."""
    return go_escape(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def go_marshal_indent(value: Any) -> str:
    """Go's ``json.MarshalIndent(v, "", "\\t")``: tab indent, ``": "``, no trailing newline."""
    return go_escape(json.dumps(value, ensure_ascii=False, indent="\t", separators=(",", ": ")))


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

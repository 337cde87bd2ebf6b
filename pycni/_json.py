"""Strict JSON decoding shared by every reader of untrusted bytes (configs, results, caches).

Integers stay Python ints (never a float round-trip); NaN/Infinity literals and numbers that
overflow a float are refused, as Go's encoding/json refuses them; deep nesting is an error,
not a RecursionError.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = [
    "JSONDecodeFailure",
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


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_parse_float)
# Go code that decodes into interface{} (libcni reading results) turns every number into a
# float64, so an integer literal beyond float64 range is an error there too.
_FLOAT64_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_float64_int)


def loads(data: bytes | str, *, float64_numbers: bool = False) -> Any:
    """Decode one JSON document; raise :class:`JSONDecodeFailure` with a readable reason.

    ``float64_numbers`` also refuses integers a float64 cannot hold (as libcni does for results).
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JSONDecodeFailure(f"invalid UTF-8 at byte {e.start}") from None
    if not data.strip():
        raise JSONDecodeFailure("unexpected end of JSON input")
    try:
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

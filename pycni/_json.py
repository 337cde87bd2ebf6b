"""Strict JSON decoding shared by every reader of untrusted bytes (configs, results, caches).

Integers stay Python ints (never a float round-trip); NaN/Infinity literals and numbers that
overflow a float are refused, as Go's encoding/json refuses them; deep nesting is an error,
not a RecursionError.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["JSONDecodeFailure", "loads", "dumps_compact", "go_escape"]


class JSONDecodeFailure(ValueError):
    """Why a document is not acceptable JSON (message says where)."""


def _reject_constant(name: str) -> Any:
    raise JSONDecodeFailure(f"invalid number literal {name}")


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JSONDecodeFailure(f"number {text} out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_parse_float)


def loads(data: bytes | str) -> Any:
    """Decode one JSON document; raise :class:`JSONDecodeFailure` with a readable reason."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JSONDecodeFailure(f"invalid UTF-8 at byte {e.start}") from None
    if not data.strip():
        raise JSONDecodeFailure("unexpected end of JSON input")
    try:
        return _DECODER.decode(data)
    except json.JSONDecodeError as e:
        raise JSONDecodeFailure(f"{e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise JSONDecodeFailure("nesting too deep") from None
    except ValueError as e:  # int-string conversion limit, etc.
        raise JSONDecodeFailure(str(e)) from None


def dumps_compact(value: Any, *, sort_keys: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False)


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def go_escape(encoded: str) -> str:
    """Apply Go's HTML-safe escaping to already-encoded JSON (those characters only occur in strings)."""
    return encoded.translate(_GO_ESCAPES)

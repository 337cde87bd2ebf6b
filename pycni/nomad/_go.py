"""Byte-exact renderings of the Go formatting Nomad's output depends on.

``marshal``/``marshal_indent`` are ``encoding/json``'s ``Marshal``/``MarshalIndent(v, "", "\\t")``
for dicts (in the struct's field order), lists, strings, ints, bools and None: compact or tab
indented, ``\\b``/``\\f`` short escapes (Go ≥ 1.22), ``<``, ``>``, ``&``, U+2028/9 escaped, no
trailing newline; a lone surrogate (Python's stand-in for invalid UTF-8) becomes U+FFFD, as Go
coerces strings to valid UTF-8. ``quote`` is ``strconv.Quote`` (what ``%q`` prints).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .._json import go_escape

__all__ = ["marshal", "marshal_indent", "quote"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def _go(encoded: str) -> str:
    # Python's json escapes exactly Go's control set (\b \f \n \r \t short, \u00xx lowercase);
    # go_escape adds the HTML-safe escapes Go applies by default.
    return _SURROGATE.sub("\ufffd", go_escape(encoded))


def marshal(value: Any) -> str:
    return _go(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def marshal_indent(value: Any) -> str:
    return _go(json.dumps(value, ensure_ascii=False, indent="\t", separators=(",", ": ")))


_SHORT = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def quote(text: str) -> str:
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

"""``CNI_ARGS``: the runtime's strict split and a plugin's Go-``LoadArgs`` read of it."""

from __future__ import annotations

from collections.abc import Iterable

from .. import _json
from ..errors import CNIError, ErrorCode, InvalidArgumentError

__all__ = ["parse_cni_args", "load_args"]


def parse_cni_args(text: str) -> list[tuple[str, str]]:
    """Split ``K=V;K2=V2`` strictly (each pair exactly one ``=``, both sides non-empty)."""
    if not text:
        return []
    pairs = []
    for item in text.split(";"):
        parts = item.split("=")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise InvalidArgumentError(f'invalid CNI_ARGS pair "{item}"')
        pairs.append((parts[0], parts[1]))
    return pairs


def load_args(text: str, known: Iterable[str]) -> dict[str, str]:
    """Plugin-side ``CNI_ARGS`` as Go's ``types.LoadArgs`` reads them into a plugin's struct.

    Each pair must split into exactly two parts on ``=`` (an empty value is allowed); keys outside
    ``known`` are an error unless ``IgnoreUnknown`` is ``1``/``true``. Returns the known keys.
    Errors are plugin-internal (code 999) with Go's texts.
    """
    found: dict[str, str] = {}
    unknown: list[str] = []
    ignore_unknown = False
    wanted = set(known)
    for pair in text.split(";") if text else ():
        parts = pair.split("=")
        if len(parts) != 2:
            raise CNIError(f"ARGS: invalid pair {_json.go_quote(pair)}", code=ErrorCode.INTERNAL)
        key, value = parts
        if key == "IgnoreUnknown":
            if value.lower() not in ("1", "true", "0", "false"):
                raise CNIError(
                    f"ARGS: error parsing value of pair {_json.go_quote(pair)}: "
                    f"boolean unmarshal error: invalid input {value.lower()}",
                    code=ErrorCode.INTERNAL,
                )
            ignore_unknown = value.lower() in ("1", "true")
        elif key in wanted:
            found[key] = value
        else:
            unknown.append(pair)
    if unknown and not ignore_unknown:
        raise CNIError(f"ARGS: unknown args [{' '.join(map(_json.go_quote, unknown))}]", code=ErrorCode.INTERNAL)
    return found

"""Decoding untrusted plugin output (or a cached result) into a result model.

:func:`parse_result` is libcni's ``fixupResultVersion`` + ``create.Create``: whatever the input,
it returns a model or raises :class:`~pycni.errors.ResultError`, never anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _json
from .._json import GoValueError, kind
from ..errors import ResultError
from . import current, v020, v040
from ._common import invalid, quote
from .convert import AnyResult

__all__ = ["parse_result"]

_VERSION = _json.GoFields("cniVersion")
_DECODE_FOR_VERSION: dict[str, Callable[[Any, str], AnyResult]] = {
    version: module.decode_result
    for model, module in ((v020.Result020, v020), (v040.Result040, v040), (current.Result, current))
    for version in model.VERSIONS
}


def _load(data: bytes | bytearray | memoryview | str) -> Any:
    try:
        return _json.loads(data if isinstance(data, str) else bytes(data), float64_numbers=True)
    except _json.JSONDecodeFailure as e:
        raise ResultError(f"failed to unmarshal raw result: {e}") from None


def parse_result(data: Any, *, config_version: str | None = None) -> AnyResult:
    """Decode a plugin's ADD output (bytes, str, or already-decoded JSON) into its version's model.

    A missing, empty or non-string ``cniVersion`` takes ``config_version`` (``""`` meaning 0.1.0),
    as libcni does for plugins that forget it (it reads the key from a map: exactly). Without
    ``config_version`` (a cached result) the version is read as libcni's ``DecodeVersion`` reads
    it, into a struct (so ``"CNIVersion"`` counts), and a missing or empty one means 0.1.0. A
    result version other than the config's is kept as it is; convert it with
    :func:`~pycni.types.convert` where it is consumed.
    """
    obj = _load(data) if isinstance(data, (bytes, bytearray, memoryview, str)) else data
    if obj is None:
        obj = {}
    elif not isinstance(obj, dict):
        raise ResultError(f"failed to unmarshal raw result: expected a JSON object, got {kind(obj)}")
    version = obj.get("cniVersion") if config_version is not None else _VERSION.pick(obj).get("cniVersion")
    if not isinstance(version, str) or not version:
        if config_version is not None:
            version = config_version or "0.1.0"
        elif version is None or version == "":
            version = "0.1.0"
        else:
            raise ResultError(f"invalid result: cniVersion: expected a string, got {kind(version)}")
    decode = _DECODE_FOR_VERSION.get(version)
    if decode is None:
        raise ResultError(f"unsupported CNI result version {quote(version)}")
    try:
        return decode(obj, version)
    except GoValueError as e:
        raise invalid(e, "result") from None

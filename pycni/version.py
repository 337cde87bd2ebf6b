"""CNI spec versions: parsing and comparison as libcni does, and ``cniVersions`` selection."""

from __future__ import annotations

import re
from typing import Any

from .errors import ConfigError, VersionError

__all__ = [
    "CURRENT",
    "SUPPORTED",
    "parse",
    "greater_or_equal",
    "select_version",
    "supports_check",
    "supports_gc",
    "supports_status",
    "supports_prev_result_on_del",
]

CURRENT = "1.1.0"
SUPPORTED: tuple[str, ...] = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

_PART = re.compile(r"[+-]?[0-9]+")
Version = tuple[int, int, int]


def parse(version: str) -> Version:
    """Parse like libcni's ``ParseVersion``: ``""`` is 0.1.0; one to three signed decimal parts."""
    if not isinstance(version, str):
        raise VersionError(f"invalid version {version!r}: not a string")
    if version == "":
        return (0, 1, 0)
    parts = version.split(".")
    if len(parts) > 3:
        raise VersionError(f'invalid version "{version}": too many parts')
    nums = []
    for part in parts:
        if not _PART.fullmatch(part):
            raise VersionError(f'failed to convert version part "{part}" of version "{version}"')
        nums.append(int(part))
    while len(nums) < 3:
        nums.append(0)
    return (nums[0], nums[1], nums[2])


def greater_or_equal(version: str, floor: str) -> bool:
    """``version >= floor``; raises :class:`VersionError` when ``version`` is unparsable."""
    return parse(version) >= parse(floor)


def _ge_or_false(version: str, floor: str) -> bool:
    try:
        return greater_or_equal(version, floor)
    except VersionError:
        return False


def supports_check(version: str) -> bool:
    return greater_or_equal(version, "0.4.0")


def supports_prev_result_on_del(version: str) -> bool:
    return greater_or_equal(version, "0.4.0")


def supports_gc(version: str) -> bool:
    """GC plugin calls need 1.1.0; an unparsable version counts as too old (libcni)."""
    return _ge_or_false(version, "1.1.0")


def supports_status(version: str) -> bool:
    return _ge_or_false(version, "1.1.0")


def select_version(cni_version: Any, cni_versions: Any, *, path: str | None = None) -> str:
    """The list version libcni picks: the highest of ``cniVersion`` ∪ ``cniVersions`` ≤ 1.1.0.

    Without ``cniVersions`` the ``cniVersion`` is kept verbatim (it may be empty or newer);
    when nothing qualifies the original ``cniVersion`` is kept too.
    """
    if cni_version is None:
        cni_version = ""
    if not isinstance(cni_version, str):
        raise ConfigError("invalid cniVersion type", path=path)
    if cni_versions is None:
        return cni_version
    if not isinstance(cni_versions, list):
        raise ConfigError("error parsing configuration list: invalid cniVersions type", path=path)
    candidates: list[tuple[Version, str]] = []
    current = parse(CURRENT)
    for entry in cni_versions:
        if not isinstance(entry, str):
            raise ConfigError(f"error parsing configuration list: invalid cniVersions entry {entry!r}", path=path)
        try:
            parsed = parse(entry)
        except VersionError as e:
            raise ConfigError(f"error parsing configuration list: invalid cniVersions entry: {e}", path=path) from None
        if parsed <= current:
            candidates.append((parsed, entry))
    if cni_version:
        own: Version | None
        try:
            own = parse(cni_version)
        except VersionError:
            own = None
        if own is not None and own <= current:
            candidates.append((own, cni_version))
    if not candidates:
        return cni_version
    return max(candidates)[1]

"""hashicorp/go-version's ``NewSemver`` and ``>=`` constraint, for the CHECK gate on restore.

Nomad only runs CNI CHECK on an existing namespace when the fingerprinted bridge plugin version
(node attribute ``plugins.cni.version.bridge``) parses and satisfies ``>= 1.3.0``. As in
go-version, a pre-release never satisfies a constraint without one (``1.4.0-rc1`` fails
``>= 1.3.0``), build metadata is ignored, and missing segments count as zero.
"""

from __future__ import annotations

import re

__all__ = ["parse_semver", "at_least"]

_IDENT = r"[0-9A-Za-z\-~]"
_SEMVER = re.compile(
    r"v?(?P<segments>[0-9]+(?:\.[0-9]+)*?)"
    rf"(?:-(?P<pre1>[0-9]+{_IDENT}*(?:\.{_IDENT}+)*)|-(?P<pre2>[A-Za-z\-~]+{_IDENT}*(?:\.{_IDENT}+)*))?"
    rf"(?:\+{_IDENT}+(?:\.{_IDENT}+)*)?"
)
_INT64_MAX = 2**63 - 1


def parse_semver(text: str) -> tuple[tuple[int, ...], str] | None:
    """``(segments padded to 3, prerelease)``, or None where go-version reports a malformed version."""
    match = _SEMVER.fullmatch(text)
    if match is None:
        return None
    segments = []
    for part in match["segments"].split("."):
        if len(part.lstrip("0")) > 19 or int(part) > _INT64_MAX:  # strconv.ParseInt(…, 64) overflow
            return None
        segments.append(int(part))
    segments += [0] * (3 - len(segments))
    return tuple(segments), match["pre1"] or match["pre2"] or ""


def at_least(text: str, minimum: tuple[int, ...]) -> bool:
    """Whether ``text`` parses and satisfies ``>= minimum`` (a release constraint)."""
    parsed = parse_semver(text)
    if parsed is None:
        return False
    segments, prerelease = parsed
    if prerelease:
        return False
    width = max(len(segments), len(minimum))
    return segments + (0,) * (width - len(segments)) >= tuple(minimum) + (0,) * (width - len(minimum))

"""The bridge-version gate for CHECK: go-version NewSemver + ">= 1.3.0"."""

from __future__ import annotations

import pytest

from pycni.nomad.semver import at_least, parse_semver


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("1.3.0", True),
        ("v1.3.0", True),
        ("1.4.0", True),
        ("v1.9.1", True),
        ("2", True),
        ("1.3", True),
        ("1.3.0.1", True),
        ("1.3.0+build.7", True),
        ("1.2.9", False),
        ("1.2", False),
        ("0.9.1", False),
        ("1.4.0-rc1", False),  # a pre-release never satisfies a release constraint
        ("1.3.0-beta.2", False),
        ("", False),
        ("unknown", False),
        ("1.3.0 ", False),
        ("1.3.0\n", False),
        ("V1.3.0", False),
        ("1.3.x", False),
        ("99999999999999999999.0.0", False),  # ParseInt overflow → malformed
        ("0000000000000000000001.4", True),  # leading zeros are fine for ParseInt
    ],
)
def test_at_least_1_3_0(text: str, ok: bool) -> None:
    assert at_least(text, (1, 3, 0)) is ok


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("1.4.0-rc1", ((1, 4, 0), "rc1")),
        ("1.4.0-1.beta", ((1, 4, 0), "1.beta")),
        ("v2.0", ((2, 0, 0), "")),
        ("1.2.3.4", ((1, 2, 3, 4), "")),
        ("1.0.0+meta", ((1, 0, 0), "")),
        ("1.0.0rc1", None),  # semver needs the "-" separator
        ("1.0.0-", None),
    ],
)
def test_parse_semver(text: str, parsed: tuple[tuple[int, ...], str] | None) -> None:
    assert parse_semver(text) == parsed

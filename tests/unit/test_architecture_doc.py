"""docs/ARCHITECTURE.md's module map matches the tree: every module listed, every listed one real."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _listed() -> set[str]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    return set(re.findall(r"^(pycni(?:_plugins)?/\S+\.py)\b", text, flags=re.M))


def _modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in ("pycni", "pycni_plugins") for p in (ROOT / pkg).rglob("*.py")}


def test_every_module_is_in_the_module_map() -> None:
    assert sorted(_modules() - _listed()) == []


def test_every_module_in_the_map_exists() -> None:
    assert sorted(_listed() - _modules()) == []

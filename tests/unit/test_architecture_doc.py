"""docs/ARCHITECTURE.md matches the tree: every module in the module map, every listed one real,
and every arrow of its ``arrows`` block (under "Layers") true of the imports."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers.imports import imports, modules

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
DRAWS, FORBIDS = "──►", "──✗"


def _listed() -> set[str]:
    return set(re.findall(r"^(pycni(?:_plugins)?/\S+\.py)\b", DOC.read_text(), flags=re.M))


def _modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in ("pycni", "pycni_plugins") for p in (ROOT / pkg).rglob("*.py")}


def test_every_module_is_in_the_module_map() -> None:
    assert sorted(_modules() - _listed()) == []


def test_every_module_in_the_map_exists() -> None:
    assert sorted(_listed() - _modules()) == []


def resolve(name: str) -> str:
    """A name of the arrows block as a module: under ``pycni`` or ``pycni_plugins``, or as written;
    exactly one of them must exist."""
    found = [m for m in (f"pycni.{name}", f"pycni_plugins.{name}", name) if m in modules()]
    if len(found) != 1:
        raise ValueError(f"{name!r} names {found or 'no module'}: spell it out")
    return found[0]


def parse_arrows(text: str) -> list[tuple[str, str, str]]:
    """``(source, arrow, target)`` for each arrow of ``text``'s arrows block: ``A, B ──► C ──► D``
    draws A→C, B→C and C→D; ``──✗`` forbids instead."""
    block = re.search(r"^```arrows\n(.*?)^```", text, flags=re.M | re.S)
    assert block, "no ```arrows block"
    arrows = []
    for line in filter(None, (raw.strip() for raw in block.group(1).splitlines())):
        parts = re.split(f"\\s*({DRAWS}|{FORBIDS})\\s*", line)
        assert len(parts) >= 3, f"not an arrow: {line!r}"
        groups = [[resolve(n.strip()) for n in part.split(",")] for part in parts[::2]]
        for (sources, targets), arrow in zip(zip(groups, groups[1:]), parts[1::2]):
            arrows += [(s, arrow, t) for s in sources for t in targets]
    return arrows


def _within(name: str, top: str) -> bool:
    return name == top or name.startswith(top + ".")


def _imports_of(source: str) -> set[str]:
    """What the modules of ``source`` (it and those under it) import directly."""
    return {t for m in modules() if _within(m, source) for t in imports(m)}


@cache
def _reach(module: str) -> frozenset[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in imports(todo.pop()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return frozenset(seen)


def holds(source: str, arrow: str, target: str) -> bool:
    if arrow == DRAWS:
        return any(_within(t, target) for t in _imports_of(source))
    reached = {t for m in modules() if _within(m, source) for t in _reach(m)}
    return not any(_within(t, target) for t in reached)


@cache
def _doc_arrows() -> list[tuple[str, str, str]]:
    return parse_arrows(DOC.read_text())


def test_the_arrows_block_is_read() -> None:
    arrows = _doc_arrows()
    assert ("pycni.runtime", FORBIDS, "pycni.sdk.hooks") in arrows
    assert ("pycni.cli", DRAWS, "pycni.nomad") in arrows
    assert sum(a == DRAWS for _, a, _ in arrows) >= 20 and sum(a == FORBIDS for _, a, _ in arrows) >= 20


def test_every_drawn_arrow_is_an_import_and_no_forbidden_one_is() -> None:
    assert [f"{s} {a} {t}" for s, a, t in _doc_arrows() if not holds(s, a, t)] == []


@pytest.mark.parametrize(
    ("source", "arrow", "target", "expected"),
    [
        ("pycni.runtime", DRAWS, "pycni.backends", True),
        ("pycni.runtime", DRAWS, "pycni.sdk", True),  # pycni.sdk.invoke is under it
        ("pycni.cli", DRAWS, "pycni.nomad", True),  # pycni.cli.nomad imports it
        ("pycni.runtime", DRAWS, "pycni.sdk.hooks", False),
        ("pycni.runtime", FORBIDS, "pycni.sdk.hooks", True),
        ("pycni.client", FORBIDS, "pycni.cache", False),  # a direct import
        ("pycni.nomad", FORBIDS, "pycni.backends", False),  # only through client and runtime
    ],
)
def test_an_arrow_is_judged_on_the_imports(source: str, arrow: str, target: str, expected: bool) -> None:
    assert holds(source, arrow, target) is expected


def test_the_arrows_syntax() -> None:
    text = "x\n```arrows\ncli, client ──► runtime ──► backends\nsdk ──✗ cli\n```\n"
    assert parse_arrows(text) == [
        ("pycni.cli", DRAWS, "pycni.runtime"),
        ("pycni.client", DRAWS, "pycni.runtime"),
        ("pycni.runtime", DRAWS, "pycni.backends"),
        ("pycni.sdk", FORBIDS, "pycni.cli"),
    ]
    with pytest.raises(ValueError, match="spell it out"):
        parse_arrows("```arrows\ncli ──► nomad\n```\n")  # pycni.nomad or pycni_plugins.nomad

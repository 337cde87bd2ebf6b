"""The failpoints ``pycni.failpoints`` documents are exactly the ones the code reaches."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pycni import failpoints

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pycni", "pycni_plugins", "bench")


def _trees() -> list[ast.Module]:
    return [ast.parse(p.read_text()) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's top-level ``NAME = "string"`` assignments."""
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _nft_owners(trees: list[ast.Module]) -> set[str]:
    """The owners passed to ``nft.apply`` / ``nft.release`` as a literal or a module constant (a
    variable, such as a loop over owners, holds one of those)."""
    owners = set()
    for tree in trees:
        constants = _constants(tree)
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("apply", "release")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "nft"
                and node.args
            ):
                continue
            owner = node.args[0]
            if isinstance(owner, ast.Constant) and isinstance(owner.value, str):
                owners.add(owner.value)
            elif isinstance(owner, ast.Name) and owner.id in constants:
                owners.add(constants[owner.id])
    return owners


def in_code() -> set[str]:
    """Every failpoint name the code passes to ``failpoint()``, ``{owner}`` expanded."""
    trees = _trees()
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "failpoint"):
                continue
            (arg,) = node.args
            if isinstance(arg, ast.Constant):
                names.add(arg.value)
            else:
                assert isinstance(arg, ast.JoinedStr), ast.unparse(arg)
                template = ast.unparse(arg)[2:-1]  # f"nft.apply.{owner}.after-record"
                assert re.fullmatch(r"[\w.-]*\{owner\}[\w.-]*", template), template
                names |= {template.replace("{owner}", o) for o in _nft_owners(trees)}
    return names


def documented() -> list[str]:
    doc = failpoints.__doc__ or ""
    listed = doc[doc.index("* ADD:") :]
    return re.findall(r"``([\w-]+(?:\.[\w-]+)+)``", listed)


def test_the_code_is_really_read() -> None:
    found = in_code()
    assert "bridge.add.after-veth" in found
    assert {"nft.apply.masq.after-record", "nft.release.portmap.after-commit"} <= found


def test_the_documented_failpoints_are_the_ones_in_the_code() -> None:
    listed = documented()
    assert len(listed) == len(set(listed)), "a failpoint listed twice"
    assert sorted(set(listed) - in_code()) == [], "documented, but no code reaches it"
    assert sorted(in_code() - set(listed)) == [], "in the code, but not documented"

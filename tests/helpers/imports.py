"""The import graph of ``pycni`` and ``pycni_plugins``, read from the source with ``ast``.

Every ``import`` statement counts, those inside functions (lazy imports) included: a lazy import
is still a dependency, only a later one. Imports under ``if TYPE_CHECKING:`` never run and do not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pycni", "pycni_plugins")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _import_nodes(source: str) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``source`` that runs, at any depth."""
    tree = ast.parse(source)
    # Imports under ``if TYPE_CHECKING:`` never run: annotations only, no dependency.
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in type_only:
            yield node


def imports_in(module: str, source: str, *, is_package: bool = False) -> frozenset[str]:
    """The pycni/pycni_plugins modules ``source`` (module ``module``) imports, at any depth."""
    out: set[str] = set()
    for node in _import_nodes(source):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the package.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else base for a in node.names]
        for name in names:
            while name and name not in modules():
                name = name.rpartition(".")[0]  # ``import pycni.sdk.invoke.x`` -> the module itself
            if name and name != module:
                out.add(name)
    return frozenset(out)


@cache
def imports(module: str) -> frozenset[str]:
    path = modules()[module]
    return imports_in(module, path.read_text(), is_package=path.name == "__init__.py")


@cache
def outside_imports(module: str) -> frozenset[str]:
    """The top-level names of the packages outside pycni that ``module`` imports, at any depth."""
    out = set()
    for node in _import_nodes(modules()[module].read_text()):
        if isinstance(node, ast.Import):
            out |= {alias.name.partition(".")[0] for alias in node.names}
        elif node.level == 0 and node.module:
            out.add(node.module.partition(".")[0])
    return frozenset(out)

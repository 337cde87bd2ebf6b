"""The import layers of docs/DESIGN ("Layers", "The plugin SDK"), checked on the source.

Every ``import`` statement of every module of ``pycni`` and ``pycni_plugins`` counts, those
inside functions (lazy imports) included: a lazy import is still a dependency, only a later one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pycni", "pycni_plugins")

#: What the SDK stands on: nothing of the runtime, nothing of the plugins.
#: (pycni.netns, a leaf: the plugin's own-namespace check resolves paths the daemon bound to fds.)
SDK_MAY_IMPORT = ("pycni.sdk", "pycni.errors", "pycni.types", "pycni._json", "pycni.version", "pycni.netns")
#: Leaf modules both sides use; they import nothing of pycni but each other and errors.
LEAVES = (
    "pycni.errors",
    "pycni._json",
    "pycni.version",
    "pycni._version",
    "pycni._fs",
    "pycni.failpoints",
    "pycni.netns",
)
#: What a plugin may import of pycni: the SDK, the wire types and the leaves.
PLUGINS_MAY_IMPORT = ("pycni.sdk", "pycni.types", *LEAVES)
#: The places pycni/ reaches into the plugin package: the CLI's verbs that are the package's own
#: tools (``plugins install/list``; ``serve``, which runs the plugins' daemon).
RUNTIME_INTO_PLUGINS = {
    ("pycni.cli.plugins", "pycni_plugins.install"),
    ("pycni.cli.serve", "pycni_plugins.serve"),
    ("pycni.cli.serve", "pycni_plugins.serve.daemon"),
}


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


def imports_in(module: str, source: str, *, is_package: bool = False) -> frozenset[str]:
    """The pycni/pycni_plugins modules ``source`` (module ``module``) imports, at any depth."""
    out: set[str] = set()
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
        if id(node) in type_only:
            continue
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


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _edges() -> Iterator[tuple[str, str]]:
    for module in modules():
        for target in imports(module):
            yield module, target


def test_the_graph_is_really_read() -> None:
    # A parser that found nothing would pass every rule below.
    assert "pycni.sdk.invoke" in imports("pycni.sdk.plugin")
    assert "pycni.sdk" in imports("pycni_plugins.bridge")
    assert "pycni.sdk.hooks" in imports("pycni.cli.nomad")  # a function-level import
    assert "pycni_plugins.kernel.links" in imports("pycni_plugins.kernel.owned")
    assert len(modules()) > 60


def test_the_sdk_depends_only_on_errors_types_json_and_version() -> None:
    bad = [(m, t) for m, t in _edges() if _within(m, ("pycni.sdk",)) and not _within(t, SDK_MAY_IMPORT)]
    assert bad == []


def test_plugins_import_the_sdk_and_the_types_never_the_runtime() -> None:
    bad = [
        (m, t)
        for m, t in _edges()
        if _within(m, ("pycni_plugins",)) and _within(t, ("pycni",)) and not _within(t, PLUGINS_MAY_IMPORT)
    ]
    assert bad == []


def test_the_kernel_helpers_are_the_plugins_ground_floor() -> None:
    # kernel/ stands on the stdlib, third-party packages, the lower pycni layers and itself:
    # the plugins stand on it, never the other way round.
    kernel = "pycni_plugins.kernel"
    bad = [(m, t) for m, t in _edges() if _within(m, (kernel,)) and not _within(t, (kernel, *PLUGINS_MAY_IMPORT))]
    assert bad == []


def _third_party(source: str) -> set[str]:
    """The top-level names of what ``source`` imports absolutely (lazy imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.partition(".")[0])
    return out


def test_only_the_kernel_helpers_use_pyroute2() -> None:
    # Netlink errors are translated once, in kernel/links.py: a plugin reaches the kernel
    # through kernel/, never through pyroute2 itself.
    users = [m for m, path in modules().items() if "pyroute2" in _third_party(path.read_text())]
    bad = [m for m in users if _within(m, ("pycni_plugins",)) and not _within(m, ("pycni_plugins.kernel",))]
    assert "pycni_plugins.kernel.links" in users
    assert bad == []


def test_nothing_in_pycni_imports_the_plugins_but_the_plugins_cli() -> None:
    bad = {(m, t) for m, t in _edges() if _within(m, ("pycni",)) and _within(t, ("pycni_plugins",))}
    assert bad <= RUNTIME_INTO_PLUGINS


def test_types_and_leaves_import_nothing_above_them() -> None:
    types_may = ("pycni.types", "pycni.errors", "pycni._json", "pycni.version")
    bad = [(m, t) for m, t in _edges() if _within(m, ("pycni.types",)) and not _within(t, types_may)]
    bad += [(m, t) for m, t in _edges() if m in LEAVES and t not in LEAVES]
    assert bad == []


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(imports(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(modules()):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles_lazy_ones_included() -> None:
    assert _cycles() == []


@pytest.mark.parametrize(
    ("module", "source", "is_package", "expected"),
    [
        ("pycni.sdk.plugin", "from .invoke import exec_plugin", False, {"pycni.sdk.invoke"}),
        ("pycni.sdk.plugin", "def f():\n    from .. import errors", False, {"pycni.errors"}),
        ("pycni.sdk", "from .request import PluginRequest", True, {"pycni.sdk.request"}),
        ("pycni.cli.demo", "from ..sdk import hooks, Plugin", False, {"pycni.sdk.hooks", "pycni.sdk"}),
        ("pycni.cli.demo", "import pycni_plugins.kernel.nft", False, {"pycni_plugins.kernel.nft"}),
        ("pycni.cli.demo", "import json\nfrom attrs import frozen", False, set()),
        ("pycni.sdk.plugin", "if TYPE_CHECKING:\n    from .invoke import exec_plugin", False, set()),
    ],
)
def test_imports_are_resolved_as_python_resolves_them(
    module: str, source: str, is_package: bool, expected: set[str]
) -> None:
    assert imports_in(module, source, is_package=is_package) == expected

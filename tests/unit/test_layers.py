"""The import layers of docs/ARCHITECTURE.md ("Layers"), checked on the source.

Every ``import`` statement of every module of ``pycni`` and ``pycni_plugins`` counts, those
inside functions (lazy imports) included: a lazy import is still a dependency, only a later one
(``tests.helpers.imports`` reads the graph).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.imports import imports, imports_in, modules, outside_imports

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
    "pycni._libnftables",
)
#: What a plugin may import of pycni: the SDK, the wire types and the leaves.
PLUGINS_MAY_IMPORT = ("pycni.sdk", "pycni.types", *LEAVES)
#: The places pycni/ reaches into the plugin package: the CLI's verbs that are the package's own
#: tools (``plugins install/list``; ``serve``, which runs the plugins' daemon).
RUNTIME_INTO_PLUGINS = {
    ("pycni.cli.plugins", "pycni_plugins.install"),
    ("pycni.cli.serve", "pycni_plugins.serve"),
    ("pycni.cli.serve", "pycni_plugins.serve.daemon"),
    ("pycni.cli.serve", "pycni_plugins.serve.sockets"),
}
#: The test tooling (mock backend, probes, strategies, the fuzzer) sits on top of the runtime:
#: nothing else in pycni/ imports it but the CLI verbs that are test tools (``demo`` proves
#: connectivity with the probes, ``fuzz`` runs the fuzzer) and the strategies' first published path.
INTO_TESTING = {
    ("pycni.cli.demo", "pycni.testing.probes"),
    ("pycni.cli.fuzz", "pycni.testing.fuzz"),
    ("pycni.strategies", "pycni.testing.strategies"),
}
#: The kernel libraries, which pycni/ uses only to build and read back test worlds: the test
#: tooling, the demo, and netns's named throwaway namespaces (for the demo, tests and bench).
#: libnftables is reached through ``pycni._libnftables``, a leaf and the only importer of the
#: third-party ``nftables`` binding.
KERNEL_LIBRARIES = ("pyroute2", "pycni._libnftables")
KERNEL_USERS = ("pycni.testing", "pycni.cli.demo", "pycni.netns")


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
    assert "pyroute2" in outside_imports("pycni.testing.fuzz.world")  # function-level too
    assert "pycni_plugins.kernel.links" in imports("pycni_plugins.kernel.owned")
    assert len(modules()) > 60


def test_the_sdk_depends_only_on_errors_types_json_version_and_netns() -> None:
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


def test_only_the_kernel_helpers_use_pyroute2() -> None:
    # Netlink errors are translated once, in kernel/links.py: a plugin reaches the kernel
    # through kernel/, never through pyroute2 itself.
    users = [m for m in modules() if "pyroute2" in outside_imports(m)]
    bad = [m for m in users if _within(m, ("pycni_plugins",)) and not _within(m, ("pycni_plugins.kernel",))]
    assert "pycni_plugins.kernel.links" in users
    assert bad == []


def test_nothing_in_pycni_imports_the_plugins_but_the_plugins_cli() -> None:
    bad = {(m, t) for m, t in _edges() if _within(m, ("pycni",)) and _within(t, ("pycni_plugins",))}
    assert bad <= RUNTIME_INTO_PLUGINS


#: The chain plugin runs a whole list on the runtime's list runner, so it sits on the runtime
#: side (pycni/chain/), yet it is a built-in plugin: the backends, the daemon and the shims reach
#: it by entry point. Only the CLI's fold verbs (and ``nomad conflist --fold``) import it.
CHAIN_IMPORTERS = ("pycni.chain", "pycni.cli")


def test_the_chain_plugin_is_reached_by_entry_point_and_imported_only_by_the_cli() -> None:
    bad = {(m, t) for m, t in _edges() if _within(t, ("pycni.chain",)) and not _within(m, CHAIN_IMPORTERS)}
    assert "pycni.list_runner" in imports("pycni.chain.plugin")
    assert bad == set()


def test_the_runtime_never_imports_the_test_tooling() -> None:
    # The runtime core (runtime, backends, cache, config, client, sdk, nomad, ...) included.
    bad = {(m, t) for m, t in _edges() if not _within(m, ("pycni.testing",)) and _within(t, ("pycni.testing",))}
    assert bad <= INTO_TESTING


def test_pycni_uses_the_kernel_libraries_only_to_make_test_worlds() -> None:
    bad = [
        (m, lib)
        for m in modules()
        if _within(m, ("pycni",)) and not _within(m, KERNEL_USERS)
        for lib in (outside_imports(m) | imports(m)) & set(KERNEL_LIBRARIES)
    ]
    assert bad == []


def test_libnftables_is_reached_through_pycnis_binding_and_by_plugins_only_through_kernel() -> None:
    users = [m for m in modules() if "pycni._libnftables" in imports(m)]
    assert "pycni_plugins.kernel.nft.transport" in users
    assert [m for m in users if _within(m, ("pycni_plugins",)) and not _within(m, ("pycni_plugins.kernel",))] == []
    assert [m for m in modules() if "nftables" in outside_imports(m)] == ["pycni._libnftables"]


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

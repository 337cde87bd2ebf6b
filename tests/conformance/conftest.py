"""Fixtures of the conformance suite: pairs of worlds (Go reference, pycni) for one scenario.

``attached`` is module-scoped and parametrised by scenario: both worlds with two containers,
``conf-a`` publishing host port 8080 and ``conf-b`` publishing nothing, for the tests that only
look. Tests that change state (DEL, conflicts) build their own worlds with ``fresh``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pycni import netns
from tests.conftest import TEST_NS_PREFIX

from .harness import SCENARIOS, World, worlds
from .twins import Twin, make_twins


def _namespaces() -> tuple[Callable[[str], netns.Throwaway], Callable[[], None]]:
    made: list[netns.Throwaway] = []

    def make(role: str) -> netns.Throwaway:
        ns = netns.Throwaway(prefix=f"{TEST_NS_PREFIX}-{role}")
        ns.__enter__()
        made.append(ns)
        return ns

    def remove_all() -> None:
        for ns in reversed(made):
            ns.__exit__(None, None, None)

    return make, remove_all


@pytest.fixture(scope="module", params=list(SCENARIOS))
def attached(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, World]]:
    make, remove_all = _namespaces()
    tmp = tmp_path_factory.mktemp(request.param)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PYCNI_STATE_DIR", str(tmp / "pycni-state"))
            pair = worlds(request.param, tmp, make)
            for world in pair.values():
                a, b = world.container("conf-a", ports=True), world.container("conf-b")
                world.add(a)
                world.add(b)
            yield pair
    finally:
        remove_all()


@pytest.fixture
def fresh(
    tmp_path: Path, make_netns: Callable[[str], netns.Throwaway], monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], dict[str, World]]:
    """Worlds for one scenario with no container yet (removed with the test's namespaces)."""
    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "pycni-state"))
    return lambda scenario: worlds(scenario, tmp_path, make_netns)


@pytest.fixture(scope="session")
def pycni_bindir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every built-in plugin installed as an exec'able plugin (``pycni plugins install``)."""
    from pycni_plugins.install import install

    d = tmp_path_factory.mktemp("pycni-bin")
    install(str(d))
    return str(d)


@pytest.fixture
def twins(make_netns: Callable[[str], netns.Throwaway], tmp_path: Path, pycni_bindir: str) -> dict[str, Twin]:
    """One world per implementation (Go, pycni in-process, pycni exec'd) for one plugin (:mod:`.twins`)."""
    return make_twins(make_netns, tmp_path, pycni_bindir)

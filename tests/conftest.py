"""Shared fixtures. Kernel tests work only inside namespaces they create and remove.

``privileged`` tests need root, network namespaces, nftables and (for the exec path) the
Debian reference plugins. Without them they skip, unless ``PYCNI_REQUIRE_PRIVILEGED=1`` (CI),
where they fail loudly instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pycni import netns

REFERENCE_PLUGIN_DIR = "/usr/lib/cni"
# Per test session, so concurrent runs never mistake each other's namespaces for leaks.
TEST_NS_PREFIX = f"pycni-t{os.getpid()}"
REQUIRE_PRIVILEGED = os.environ.get("PYCNI_REQUIRE_PRIVILEGED") == "1"


def _privilege_problem() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    if not os.path.exists("/proc/thread-self/ns/net"):
        return "no network namespaces"
    from pycni._libnftables import LibnftablesMissing, Nftables

    try:
        Nftables()
    except LibnftablesMissing as e:
        return str(e)
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "pyroute2 not importable"
    return None


def _reference_problem() -> str | None:
    for name in ("bridge", "host-local", "loopback", "portmap", "firewall"):
        if not os.access(os.path.join(REFERENCE_PLUGIN_DIR, name), os.X_OK):
            return f"reference plugin {REFERENCE_PLUGIN_DIR}/{name} missing (apt containernetworking-plugins)"
    if shutil.which("iptables") is None:
        return "iptables missing (the reference portmap/firewall need it)"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "privileged: needs root + netns + nftables (fails in CI if missing)")
    config.addinivalue_line("markers", "reference: needs the Debian reference plugins in /usr/lib/cni")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problem = _privilege_problem()
    ref_problem = _reference_problem()
    for item in items:
        reason = None
        if problem and item.get_closest_marker("privileged"):
            reason = problem
        elif ref_problem and item.get_closest_marker("reference"):
            reason = ref_problem
        if reason is None:
            continue
        if REQUIRE_PRIVILEGED:
            item.add_marker(pytest.mark.usefixtures("_fail_unprivileged"))
            item.user_properties.append(("privilege_problem", reason))
        else:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def _fail_unprivileged(request: pytest.FixtureRequest) -> None:
    reason = dict(request.node.user_properties).get("privilege_problem")
    pytest.fail(f"privileged test cannot run here: {reason}", pytrace=False)


@pytest.fixture
def make_netns() -> Iterator[Callable[[str], netns.Throwaway]]:
    """Factory of throwaway namespaces (lo up); all removed at teardown, even on failure."""
    made: list[netns.Throwaway] = []

    def make(role: str = "c") -> netns.Throwaway:
        ns = netns.Throwaway(prefix=f"{TEST_NS_PREFIX}-{role}")
        ns.__enter__()
        made.append(ns)
        return ns

    yield make
    for ns in reversed(made):
        ns.__exit__(None, None, None)


@pytest.fixture
def host_ns(make_netns: Callable[[str], netns.Throwaway]) -> netns.Throwaway:
    """A throwaway namespace standing in for the host: plugins run here, never in the root one."""
    return make_netns("host")


@pytest.fixture(scope="session", autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """pycni's state dir for every test that sets none itself: never the machine's /run/pycni,
    which two suites on one machine would share (their records naming each other's links)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYCNI_STATE_DIR", str(tmp_path_factory.mktemp("session-state")))
        yield


@pytest.fixture
def symlinked_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """``$PYCNI_STATE_DIR`` a symlink to a private directory: ``(link, target)``."""
    real = tmp_path / "real-state"
    real.mkdir(mode=0o700)
    link = tmp_path / "state-link"
    link.symlink_to(real)
    monkeypatch.setenv("PYCNI_STATE_DIR", str(link))
    return link, real


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_namespaces() -> Iterator[None]:
    def ours() -> set[str]:
        try:
            return {n for n in os.listdir(netns.RUN_DIR) if n.startswith(TEST_NS_PREFIX)}
        except FileNotFoundError:
            return set()

    before = ours()
    yield
    leaked = ours() - before
    for name in leaked:
        netns.remove(name)
    assert not leaked, f"tests leaked network namespaces: {sorted(leaked)}"


@pytest.fixture
def fake_plugins(tmp_path):
    """A plugin dir with the scriptable fake plugin installed as ``fake-a``, ``fake-b``, ``fake-c``."""
    from tests.helpers.fake import FakePlugins

    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    fakes = FakePlugins(dir=plugin_dir, log=tmp_path / "fake.log", pidfile=tmp_path / "fake.pids")
    fakes.install("fake-a", "fake-b", "fake-c")
    return fakes

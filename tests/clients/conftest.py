"""Fixtures for the real-client tests: the plugin dir under test, the sandbox, the clients.

The plugin dir is a fixture parameter. Today there is one mode, ``exec``: the directory
``pycni plugins install DIR`` writes. The daemon variants plug in here: add a mode to
``PLUGIN_MODES`` and give :meth:`Plugins.attach` what it does for it (start ``pycni serve``
inside the sandbox with ``sandbox.service([...])``, so the daemon shares the clients' mount
namespace, or leave it stopped to exercise the shims' fallback).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from pycni import netns
from tests.conftest import REQUIRE_PRIVILEGED, TEST_NS_PREFIX
from tests.helpers import kernel

from .clients import IMAGE, Containerd, Podman
from .image import write_busybox_archive
from .sandbox import Sandbox

PLUGIN_MODES = ["exec"]


@attrs.define
class Plugins:
    mode: str
    dir: Path

    def attach(self, sandbox: Sandbox) -> None:
        """Whatever the mode needs running inside the sandbox before a client runs (``exec``:
        nothing — the clients exec the installed plugins)."""


def _require(*tools: str) -> None:
    """The clients come from apt (scripts/setup.sh); without them skip, or fail in CI."""
    missing = [t for t in tools if shutil.which(t) is None]
    if not os.path.exists("/bin/busybox"):
        missing.append("/bin/busybox (busybox-static)")
    if missing:
        message = f"real-client test needs {', '.join(missing)} (scripts/setup.sh installs them)"
        if REQUIRE_PRIVILEGED:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def busybox_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("image") / "busybox.tar"
    write_busybox_archive(path, IMAGE)
    return path


@pytest.fixture(params=PLUGIN_MODES)
def cni_plugins(request: pytest.FixtureRequest, tmp_path: Path) -> Plugins:
    directory = tmp_path / "plugins"
    cli = [sys.executable, "-m", "pycni.cli", "plugins", "install", str(directory)]
    subprocess.run(cli, check=True, capture_output=True)
    return Plugins(request.param, directory)


@pytest.fixture
def root_namespace_untouched() -> Iterator[None]:
    """The root namespace's links, nft ruleset (where iptables-nft rules land too), legacy
    iptables tables and IPv4 forwarding are the same after the test as before: everything the
    clients do stays in the throwaway host."""

    def view() -> dict[str, Any]:
        proc = Path("/proc/self/net")  # the test thread's, i.e. the root namespace's
        return {
            "links": {name: link["kind"] for name, link in kernel.links(None).items()},
            "nft": kernel.nft_ruleset(None),
            # legacy iptables tables in use (reading these loads no module, unlike iptables-legacy-save)
            "iptables-legacy": [
                (proc / f).read_text() for f in ("ip_tables_names", "ip6_tables_names") if (proc / f).exists()
            ],
            "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text(),
        }

    before = view()
    yield
    assert view() == before


@pytest.fixture
def sandbox(make_netns: Any, tmp_path: Path, cni_plugins: Plugins, root_namespace_untouched: None) -> Iterator[Sandbox]:
    host: netns.Throwaway = make_netns("host")
    name = f"{TEST_NS_PREFIX}-{os.urandom(3).hex()}"
    with Sandbox(host, tmp_path / "sandbox", cni_plugins.dir, name) as box:
        cni_plugins.attach(box)
        yield box


@pytest.fixture
def podman(sandbox: Sandbox, busybox_archive: Path) -> Iterator[Podman]:
    _require("podman", "conmon", "runc")
    client = Podman(sandbox)
    client.load(busybox_archive)
    yield client
    assert client.containers() == []


@pytest.fixture
def containerd(sandbox: Sandbox, busybox_archive: Path) -> Iterator[Containerd]:
    _require("containerd", "containerd-shim-runc-v2", "ctr", "runc")
    daemon = Containerd(sandbox)
    daemon.start()
    daemon.load(busybox_archive)
    sandbox.allow_mounts()
    yield daemon
    assert (daemon.containers(), daemon.tasks()) == ([], [])
    daemon.stop()

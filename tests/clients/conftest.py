"""Fixtures for the real-client tests: the plugin dir under test, the sandbox, the clients.

The plugin dir is what ``pycni plugins install DIR`` writes (shims for ``pycni serve``), in one
of three modes, a fixture parameter:

* ``daemon-running``: ``pycni serve`` runs inside the sandbox (the clients' mount namespace, as
  the shims require) on its default socket there, and the clients run with
  ``PYCNI_DAEMON=required``, so a request the daemon did not serve fails the test; afterwards its
  log must show every request answered ``ok``, ADD and DEL among them.
* ``daemon-stopped``: the daemon was started and stopped (socket removed): the shims fall back
  to running the plugin themselves.
* ``daemon-off``: ``PYCNI_DAEMON=off``, the shims run the plugin themselves without asking.

A folded test (:meth:`Plugins.fold`) leaves only the ``pycni-chain`` shim in the dir, so a client
that exec'd any other plugin would fail: one exec per network, in every mode.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from pycni import netns
from pycni.chain import CHAIN_TYPE
from tests.conftest import REQUIRE_PRIVILEGED, TEST_NS_PREFIX
from tests.helpers import kernel

from .clients import IMAGE, Containerd, Podman
from .image import write_busybox_archive
from .sandbox import Sandbox, SandboxError

PLUGIN_MODES = ["daemon-running", "daemon-stopped", "daemon-off"]
_SERVE = [sys.executable, "-m", "pycni.cli", "serve"]


# What the daemon must have served (type, command) for the clients' unfolded networks.
_UNFOLDED_SERVED = frozenset({("bridge", "ADD"), ("bridge", "DEL"), ("firewall", "ADD"), ("firewall", "DEL")})


@attrs.define
class Plugins:
    mode: str
    dir: Path
    serve_log: Path | None = None
    folded: bool = False

    def fold(self) -> None:
        """Keep only the chain plugin's shim: the clients may exec nothing else."""
        for shim in self.dir.iterdir():
            if shim.name != CHAIN_TYPE:
                shim.unlink()
        self.folded = True

    def attach(self, sandbox: Sandbox) -> None:
        """Set the mode up inside the sandbox before any client runs."""
        if self.mode == "daemon-off":
            sandbox.client_env["PYCNI_DAEMON"] = "off"
            return
        self.serve_log = sandbox.root / "serve.log"
        daemon = sandbox.service(_SERVE, self.serve_log)
        deadline = time.monotonic() + 30
        while True:
            try:
                sandbox.run([*_SERVE, "--check"], timeout=10)
                break
            except SandboxError:
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SandboxError(f"pycni serve did not answer: {self.serve_log.read_text()}") from None
                time.sleep(0.1)
        socket = sandbox.state_dir / "pycni.sock"  # /run/pycni/pycni.sock inside
        assert socket.is_socket()
        if self.mode == "daemon-running":
            sandbox.client_env["PYCNI_DAEMON"] = "required"
        else:
            assert sandbox.stop(daemon) == 0, self.serve_log.read_text()
            assert not socket.exists()

    def verify(self) -> None:
        """``daemon-running``: the daemon served the clients' requests, all successfully."""
        if self.mode != "daemon-running":
            return
        assert self.serve_log is not None
        served = [line.split("pycni serve: ", 1)[1] for line in self.serve_log.read_text().splitlines()]
        # "<type> <command> <container id> <outcome> <ms>ms"; "- - - ping" is the --check probe
        requests = [line.split(" ", 3) for line in served if line.endswith("ms") and not line.startswith("- ")]
        commands = {(r[0], r[1]) for r in requests}
        if self.folded:  # one request per network and operation: the whole list ran inside it
            assert {r[0] for r in requests} == {CHAIN_TYPE} and {"ADD", "DEL"} <= {r[1] for r in requests}, served
        else:
            assert _UNFOLDED_SERVED <= commands, served
        assert [r for r in requests if not r[3].startswith("ok ")] == []


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCNI_")}  # the default socket
    subprocess.run(cli, check=True, capture_output=True, env=env)
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
        cni_plugins.verify()


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
    yield daemon
    assert (daemon.containers(), daemon.tasks()) == ([], [])
    daemon.stop()

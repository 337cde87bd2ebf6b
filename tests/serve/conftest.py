"""A ``pycni serve`` daemon and its shims for the tests, every process reaped even on failure.

The daemon runs in a throwaway "host" namespace, started with ``nsenter --net=`` (so it shares
the test's mount namespace, as the design requires), with its socket in a temp dir
(``PYCNI_SOCKET``); callers exec the shims with ``nsenter --net=`` too. The state dir and
host-local's data dir are under ``tmp_path``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from pycni import netns
from tests.helpers.slow import scaled

PYTHON = sys.executable


@attrs.frozen
class Outcome:
    status: int
    stdout: bytes
    stderr: bytes

    def json(self) -> Any:
        return json.loads(self.stdout)


class Daemon:
    """A ``pycni serve`` process in ``host`` (``wrap`` execs before ``nsenter``, keeping the pid);
    :meth:`stop` sends SIGTERM and reaps it."""

    def __init__(
        self,
        host: str,
        socket_path: str,
        log: Path,
        env: Mapping[str, str],
        args: list[str],
        wrap: tuple[str, ...] = (),
    ) -> None:
        self.host = host
        self.socket = socket_path
        self.log_path = log
        argv = [*wrap, "nsenter", f"--net={host}", PYTHON, "-m", "pycni.cli", "serve", "--socket", socket_path, *args]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env))
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        from pycni_plugins.serve.sockets import check

        deadline = time.monotonic() + scaled(timeout)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"pycni serve exited with {self.proc.returncode}:\n{self.log()}")
            if check(self.socket, timeout=1.0)[0]:
                return
            time.sleep(0.05)
        raise AssertionError(f"pycni serve did not answer within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def requests(self, count: int = 0, timeout: float = 10.0) -> list[str]:
        """The per-request log lines (``<type> <command> <container> <outcome> <ms>``), once there
        are ``count`` of them (a request is logged just after its answer is sent)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line.split("pycni serve: ", 1)[1] for line in self.log().splitlines() if line.endswith("ms")]
            lines = [line for line in lines if not line.startswith("- - - ping ")]
            if len(lines) >= count or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "state")
    monkeypatch.setenv("PYCNI_STATE_DIR", path)
    return path


@pytest.fixture
def sock_dir() -> Iterator[str]:
    """A 0700 dir for the socket, short enough for sun_path (pytest's tmp_path can exceed 108)."""
    path = tempfile.mkdtemp(prefix="pycni-serve-")
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", path], check=False)


@pytest.fixture
def bindir(tmp_path: Path) -> str:
    from pycni_plugins.install import install

    path = tmp_path / "bin"
    install(str(path))
    return str(path)


_LOADED = """import sys
sys.path += {path!r}
import {module}, pycni.sdk.skel
for m in list(sys.modules.values()):
    print(getattr(m, "__file__", None) or "")
"""


def install_for_any_uid(directory: str, types: list[str]) -> None:
    """Install shims that another uid can run even when this checkout and its venv sit under a
    0700 directory (CI clones into ``mktemp -d``): the interpreter by its real path, and copies of
    the packages the fallback imports from outside ``/usr`` put in ``directory`` (mode 0755)."""
    from pycni_plugins.install import install

    os.chmod(directory, 0o755)
    shims = install(directory, types)
    with open(shims[0]) as f:
        header = f.read()
    path = ast.literal_eval(re.search(r"^FALLBACK_PATH = (.*)$", header, re.M).group(1))
    target = re.search(r"^TARGET = '([^':]*)", header, re.M).group(1)
    python = os.path.realpath(sys.executable)
    loaded = subprocess.run(
        [python, "-IS", "-c", _LOADED.format(path=path, module=target)], capture_output=True, text=True, check=True
    ).stdout.split()
    site = os.path.join(directory, "site")
    for entry in (p for p in path if not p.startswith("/usr/")):
        prefix = entry.rstrip("/") + "/"
        for top in {f[len(prefix) :].split("/")[0] for f in loaded if f.startswith(prefix)}:
            source = os.path.join(entry, top)
            if os.path.isdir(source):
                shutil.copytree(source, os.path.join(site, top), dirs_exist_ok=True)
            else:
                os.makedirs(site, exist_ok=True)
                shutil.copy(source, site)
    subprocess.run(["chmod", "-R", "a+rX", directory], check=True)
    readable = [site, *(p for p in path if p.startswith("/usr/"))]
    for shim in shims:
        with open(shim) as f:
            text = f.read()
        text = re.sub(r"\A#!\S+", f"#!{python}", text)
        text = re.sub(r"^FALLBACK_PATH = .*$", lambda _: f"FALLBACK_PATH = {readable!r}", text, count=1, flags=re.M)
        with open(shim, "w") as f:
            f.write(text)


@pytest.fixture
def start_daemon(host_ns: netns.Throwaway, sock_dir: str, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(
        *args: str, host: str | None = None, env: Mapping[str, str] | None = None, wrap: tuple[str, ...] = ()
    ) -> Daemon:
        n = len(started)
        log = tmp_path / f"serve{n}.log"
        full = {**os.environ, **(env or {})}
        daemon = Daemon(host or host_ns.path, os.path.join(sock_dir, f"s{n}.sock"), log, full, list(args), wrap)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop(signal.SIGKILL)


@pytest.fixture
def daemon(start_daemon: Callable[..., Daemon]) -> Daemon:
    return start_daemon()


def call(
    bindir: str,
    plugin: str,
    env: Mapping[str, str],
    stdin: bytes | str | dict[str, Any] = b"",
    *,
    host: str,
    socket_path: str | None = None,
    mode: str | None = None,
    pass_fds: tuple[int, ...] = (),
    wrap: tuple[str, ...] = (),
    inner: tuple[str, ...] = (),
    cwd: str | os.PathLike[str] | None = None,
) -> Outcome:
    """Exec shim ``plugin`` in namespace ``host`` with ``env`` (plus PATH and the state dir)
    from ``cwd``; ``mode`` sets ``PYCNI_DAEMON``; ``wrap`` runs before ``nsenter``, ``inner``
    between it and the shim."""
    data = stdin if isinstance(stdin, bytes) else (stdin if isinstance(stdin, str) else json.dumps(stdin)).encode()
    full = {"PATH": os.environ["PATH"], "PYCNI_STATE_DIR": os.environ["PYCNI_STATE_DIR"], **env}
    if socket_path:
        full["PYCNI_SOCKET"] = socket_path
    if mode:
        full["PYCNI_DAEMON"] = mode
    argv = [*wrap, "nsenter", f"--net={host}", *inner, os.path.join(bindir, plugin)]
    p = subprocess.run(argv, input=data, capture_output=True, env=full, pass_fds=pass_fds, timeout=120, cwd=cwd)
    return Outcome(p.returncode, p.stdout, p.stderr)

"""The shim on its own: exec → first byte at the socket, and a VERSION round trip through the
daemon (``pycni-daemon``'s shims and daemon).

Start-up is timed from just before ``posix_spawn`` of the shim (no ``nsenter``, no shell) to the
moment a listener in the same thread receives the first byte of the request; the listener then
hangs up without answering and the shim, run with ``PYCNI_DAEMON=required``, exits at once. The round trip is the whole
exec of ``<shim> VERSION`` against the real daemon, wait included. For scale, the same
interpreter's exec → exit with ``-IS -c pass``: what no Python shim can go below.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Any

from .stats import summarize

__all__ = ["measure"]


def _startup(shim: str, scratch: str, samples: int) -> list[float]:
    path = os.path.join(scratch, "first-byte.sock")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYCNI_SOCKET": path,
        "PYCNI_DAEMON": "required",
        "CNI_COMMAND": "VERSION",
    }
    devnull = os.open(os.devnull, os.O_RDWR)
    out = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(4)
        try:
            for _ in range(samples):
                # posix_spawn, and the listener in this very thread: no thread hand-off in the timing
                actions = [(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)]
                start = time.monotonic()
                pid = os.posix_spawn(shim, [shim], env, file_actions=actions)
                conn, _ = listener.accept()
                with conn:
                    conn.recv(1)
                    out.append((time.monotonic() - start) * 1000)
                os.waitpid(pid, 0)
        finally:
            os.unlink(path)
            os.close(devnull)
    return out


def _bare_interpreter(shim: str, samples: int) -> list[float]:
    """exec → exit of the shim's interpreter doing nothing (``-IS -c pass``): the floor."""
    with open(shim) as f:
        python = f.readline()[2:].split()[0]
    devnull = os.open(os.devnull, os.O_RDWR)
    actions = [(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)]
    out = []
    try:
        for _ in range(samples):
            start = time.monotonic()
            os.waitpid(os.posix_spawn(python, [python, "-IS", "-c", "pass"], {}, file_actions=actions), 0)
            out.append((time.monotonic() - start) * 1000)
    finally:
        os.close(devnull)
    return out


def _version(shim: str, socket_path: str, samples: int) -> list[float]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYCNI_SOCKET": socket_path,
        "PYCNI_DAEMON": "required",
        "CNI_COMMAND": "VERSION",
    }
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        p = subprocess.run([shim], stdin=subprocess.DEVNULL, capture_output=True, env=env, check=False, timeout=30)
        out.append((time.perf_counter() - start) * 1000)
        if p.returncode != 0:
            raise RuntimeError(f"VERSION through the daemon failed: {p.stdout!r} {p.stderr!r}")
    return out


def measure(shim: str, socket_path: str, scratch: str, samples: int = 200) -> dict[str, Any]:
    """p50/p90/p99 (ms) of the shim's start-up and of a VERSION round trip through the daemon."""
    return {
        "samples": samples,
        "startup": summarize(_startup(shim, scratch, samples)),
        "bare_interpreter": summarize(_bare_interpreter(shim, samples)),
        "version_round_trip": summarize(_version(shim, socket_path, samples)),
    }

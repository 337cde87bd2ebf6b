"""The shim on its own: exec → first byte at the socket, and a VERSION round trip through the
daemon (``pycni-daemon``'s shims and daemon).

Start-up is timed from just before ``posix_spawn`` of the shim (no ``nsenter``, no shell) to the
moment a listener in this process receives the first byte of the request (both
``time.monotonic``, one clock for every process); the listener then hangs up without answering
and the shim, run with ``PYCNI_DAEMON=required``, exits at once. The round trip is the whole
exec of ``<shim> VERSION`` against the real daemon, wait included.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from typing import Any

from .stats import summarize

__all__ = ["measure"]


def _startup(shim: str, scratch: str, samples: int) -> list[float]:
    path = os.path.join(scratch, "first-byte.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    arrivals: list[float] = []

    def serve() -> None:
        for _ in range(samples):
            conn, _ = listener.accept()
            with conn:
                conn.recv(1)
                arrivals.append(time.monotonic())

    thread = threading.Thread(target=serve, name="shim-first-byte", daemon=True)
    thread.start()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYCNI_SOCKET": path,
        "PYCNI_DAEMON": "required",
        "CNI_COMMAND": "VERSION",
    }
    out = []
    try:
        for _ in range(samples):
            start = time.monotonic()
            subprocess.run([shim], stdin=subprocess.DEVNULL, capture_output=True, env=env, check=False, timeout=30)
            out.append((arrivals[-1] - start) * 1000)
    finally:
        listener.close()
        os.unlink(path)
        thread.join(5)
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
        "version_round_trip": summarize(_version(shim, socket_path, samples)),
    }

"""What the numbers were measured on: hardware, kernel, interpreter, library and plugin versions."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

from .drivers import NETAVARK, REFERENCE_DIR

PACKAGES = (
    "containernetworking-plugins",
    "netavark",
    "nftables",
    "libnftables1",
    "iptables",
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(argv: list[str], cwd: str | None = None) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=cwd)
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _cpuinfo(key: str) -> str | None:
    with open("/proc/cpuinfo") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    return None


def _meminfo_mib() -> int:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) // 1024


def _dist(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _debs() -> dict[str, str | None]:
    return {p: _run(["dpkg-query", "-W", "-f=${Version}", p]) for p in PACKAGES}


def _reference_cni_versions() -> list[str] | None:
    """The spec versions the reference bridge speaks (1.1.1 binaries report no own version)."""
    from pycni.errors import CNIError
    from pycni.sdk.invoke import exec_version

    try:
        return list(exec_version("bridge", [REFERENCE_DIR], timeout=30).supported_versions)
    except CNIError:
        return None


def _netavark() -> str | None:
    out = _run([NETAVARK, "version"])
    return json.loads(out).get("version") if out else None


def _git() -> dict[str, Any]:
    commit = _run(["git", "rev-parse", "HEAD"], cwd=REPO)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO)
    return {"commit": commit, "dirty": bool(status)}


def describe() -> dict[str, Any]:
    import pycni

    return {
        "cpu_model": _cpuinfo("model name"),
        "cores": os.cpu_count(),
        "memory_mib": _meminfo_mib(),
        "kernel": platform.release(),
        "os": _run(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "pycni": getattr(pycni, "__version__", None),
        "pycni_git": _git(),
        "pyroute2": _dist("pyroute2"),
        "debian_packages": _debs(),
        "reference_plugins_cni_versions": _reference_cni_versions(),
        "netavark": _netavark(),
        "iptables": _run(["iptables", "--version"]),
        "nft": _run(["nft", "--version"]),
        "loadavg": list(os.getloadavg()),
    }

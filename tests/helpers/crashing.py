"""A built-in plugin with a bug (its ADD raises a plain exception), registered for other
processes so that every path (in-process, exec'd skel, ``pycni serve``) can run the same one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pycni.sdk import Plugin, PluginRequest

TYPE = "crashing"
#: What Go's skel prints for a plain error, here the exception's text.
ERROR = {"code": 999, "msg": "bug: no such key"}


class CrashingPlugin(Plugin):
    type = TYPE

    def add(self, request: PluginRequest) -> dict:
        raise RuntimeError("bug: no such key")


def register(directory: Path) -> dict[str, str]:
    """Make ``crashing`` a ``pycni.plugins`` entry point in ``directory`` (a dist-info a process
    with ``PYTHONPATH=directory`` finds) and write its shim to ``directory/bin``; returns the
    environment (``PYTHONPATH``) under which a process sees it as built in."""
    dist = directory / "pycni_test_crashing-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pycni-test-crashing\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[pycni.plugins]\n{TYPE} = {__name__}:{CrashingPlugin.__name__}\n")
    root = str(Path(__file__).resolve().parents[2])  # the shim's fallback imports this module from there
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory), root])}
    install = f"from pycni_plugins.install import install; install({str(directory / 'bin')!r}, [{TYPE!r}])"
    subprocess.run([sys.executable, "-c", install], env=env, check=True, cwd="/")
    return {"PYTHONPATH": env["PYTHONPATH"]}

"""Installed plugin scripts: what they import from."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Records who imported it, then hands over to the real module, so the installer still works.
_SHADOW = """
import importlib, os, sys
with open({marker!r}, "a") as f:
    f.write(getattr(sys, "argv", ["?"])[0] + "\\n")
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules[__name__]
sys.modules[__name__] = importlib.import_module(__name__)
"""


@pytest.mark.parametrize("module", ["json", "ipaddress"])
def test_installed_plugins_never_import_from_the_installers_cwd_or_pythonpath(tmp_path: Path, module: str) -> None:
    cwd, extra, bindir = tmp_path / "cwd", tmp_path / "pythonpath", tmp_path / "bin"
    cwd.mkdir()
    extra.mkdir()
    marker = tmp_path / "imported-by"
    for d in (cwd, extra):
        (d / f"{module}.py").write_text(_SHADOW.format(marker=str(marker)))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{extra}:{ROOT}"}
    subprocess.run(
        [sys.executable, "-m", "pycni.cli", "plugins", "install", str(bindir), "--type", "loopback"],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [str(bindir / "loopback")], cwd=cwd, env=env | {"CNI_COMMAND": "VERSION"}, capture_output=True, check=True
    )
    assert json.loads(out.stdout)["cniVersion"]
    who = marker.read_text().splitlines() if marker.exists() else []
    assert str(bindir / "loopback") not in who
    script = (bindir / "loopback").read_text()
    assert str(cwd) not in script and str(extra) not in script
    assert script.startswith(f"#!{sys.executable} -IS\n")


def test_a_shim_knows_every_built_in_class_so_its_fallback_finds_a_chains_inner_plugins(tmp_path: Path) -> None:
    from importlib.metadata import entry_points

    from pycni.sdk.plugin import ENTRY_POINT_GROUP
    from pycni.version import SUPPORTED
    from pycni_plugins.install import install

    (shim,) = install(str(tmp_path / "bin"), ["pycni-chain"])
    with open(shim) as f:
        targets = ast.literal_eval(re.search(r"^TARGETS = (.*)$", f.read(), re.M).group(1))
    assert targets == {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    folded = {"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "loopback"}, {"type": "static"}]}
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "VERSION", "PYCNI_DAEMON": "off"}
    out = subprocess.run([shim], input=json.dumps(folded).encode(), env=env, capture_output=True, check=True)
    assert json.loads(out.stdout) == {"cniVersion": SUPPORTED[-1], "supportedVersions": list(SUPPORTED)}


@pytest.mark.privileged
def test_install_refuses_a_directory_another_user_could_write_unless_forced(tmp_path: Path) -> None:
    """Root runs what is installed: a 0777 directory owned by nobody would let nobody swap the
    ``bridge`` plugin, so the installer refuses, and with ``--force`` warns and installs."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.chown(bindir, 65534, 65534)
    os.chmod(bindir, 0o777)
    argv = [sys.executable, "-m", "pycni.cli", "plugins", "install", str(bindir), "--type", "loopback"]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused
    assert f"another user could replace the plugins installed in {bindir}: {bindir} is owned by uid 65534" in (
        refused.stderr
    )
    assert os.listdir(bindir) == []
    forced = subprocess.run([*argv, "--force"], capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0 and forced.stdout.split() == [str(bindir / "loopback")], forced
    assert forced.stderr.startswith("warning: another user could replace the plugins installed in "), forced

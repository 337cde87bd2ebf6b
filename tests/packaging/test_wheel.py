"""pycni as a user gets it: an sdist and a wheel built from this checkout, installed with plain
``pip install`` into a fresh venv that does not see the system's site packages (dependencies come
from the package index), then run. Needs the package index (PyPI) and, for the demo, root."""

from __future__ import annotations

import email.parser
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from pycni._version import __version__
from tests.packaging.conftest import run

PLUGIN_TYPES = {
    "loopback",
    "bridge",
    "host-local",
    "portmap",
    "firewall",
    "consul-cni",
    "macvlan",
    "host-device",
    "ipvlan",
    "vlan",
    "sbr",
    "vrf",
    "tuning",
    "static",
    "ptp",
    "bandwidth",
}


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        return email.parser.Parser().parsestr(z.read(f"pycni-{__version__}.dist-info/METADATA").decode())


def test_the_wheel_holds_the_two_packages_their_types_and_the_licence(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert {n.split("/")[0] for n in names} == {"pycni", "pycni_plugins", f"pycni-{__version__}.dist-info"}
    assert {"pycni/py.typed", "pycni_plugins/py.typed"} <= set(names)
    assert f"pycni-{__version__}.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]


def test_the_metadata_is_complete(wheel):
    meta = _metadata(wheel)
    assert meta["Name"] == "pycni" and meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Description-Content-Type"] == "text/markdown" and meta.get_payload().startswith("# pycni")
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert set(urls) >= {"Homepage", "Source", "Issues", "Documentation"}
    assert all(u.startswith("https://") for u in urls.values())
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and "Operating System :: POSIX :: Linux" in classifiers
    assert len(classifiers) >= 10
    requires = meta.get_all("Requires-Dist")
    (pyroute2,) = [r for r in requires if r.startswith("pyroute2")]
    assert pyroute2.replace(" ", "") in ("pyroute2<0.10,>=0.9.5", "pyroute2>=0.9.5,<0.10")
    # The binding is the PyPI copy without a stray top-level __init__.py (not pip-nftables).
    assert [r.split(">=")[0] for r in requires if "nftables" in r] == ["oxl-libnftables"]
    extras = {r.split("extra == ")[1].strip("'\"") for r in requires if "extra ==" in r}
    assert extras == {"test", "fuzz", "bench", "lint"}


def test_the_sdist_builds_the_wheel_and_carries_the_licence(dist):
    (sdist,) = dist.glob("pycni-*.tar.gz")

    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"LICENSE", "pyproject.toml", "README.md", "pycni/py.typed", "pycni_plugins/py.typed"} <= names


def test_the_venv_sees_no_system_site_packages(venv):
    code = (
        "import sys, nftables; print(any('dist-packages' in p for p in sys.path), 'site-packages' in nftables.__file__)"
    )
    # The binding is the venv's own (oxl-libnftables), not Debian's python3-nftables.
    assert run(venv / "bin/python", "-c", code).stdout.split() == ["False", "True"]


def test_the_installed_command_reports_its_version_help_and_plugins(venv):
    assert run(venv / "bin/pycni", "-V").stdout == f"pycni {__version__}\n"
    assert run(venv / "bin/python", "-m", "pycni", "--help").stdout.startswith("Usage: pycni [OPTIONS] COMMAND")
    listed = json.loads(run(venv / "bin/pycni", "plugins", "list").stdout)
    assert {p["type"] for p in listed} >= PLUGIN_TYPES
    assert {p["version"] for p in listed} == {__version__}


@pytest.mark.privileged
def test_the_installed_demo_passes_as_root(venv):
    # The demo works in throwaway namespaces and a temp dir of its own (pycni/cli/demo.py).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCNI_", "CNI_"))}
    out = subprocess.run(
        [venv / "bin/pycni", "demo"], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("pycni demo: all checks passed") and out.stderr == ""

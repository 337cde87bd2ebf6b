"""Without libnftables itself, pycni says which package to install: one line, a CNI code."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.packaging.test_install_doc import shown

pytestmark = pytest.mark.privileged

# The binding's soname pointed at a library that is not there, as on a host without libnftables1.
WITHOUT_LIBNFTABLES = (
    "import sys, pycni._libnftables as lib; lib.SONAME = 'libnftables-missing.so.0'; "
    "from pycni.cli import main; main(sys.argv[1:])"
)


def test_the_demo_without_libnftables_is_one_line_naming_the_package():
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_LIBNFTABLES, "demo"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(
        'pycni: error (code 50): plugin type="bridge" failed (add): libnftables-missing.so.0 not found: '
        "install libnftables (Debian/Ubuntu: apt install libnftables1)"
    )
    # docs/install.md shows the line as it reads with the real library's name.
    page = shown("sudo /opt/pycni/bin/pycni demo")
    assert page[-1] == out.stderr.rstrip("\n").replace("libnftables-missing.so.0", "libnftables.so.1")

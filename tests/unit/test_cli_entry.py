"""How the ``pycni`` command is reached and what it says about itself and missing extras."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from pycni._version import __version__
from pycni.cli import cli


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags_print_the_package_version(flag):
    result = CliRunner().invoke(cli, [flag])
    assert result.exit_code == 0 and result.output == f"pycni {__version__}\n"


def test_python_dash_m_pycni_is_the_pycni_command():
    out = subprocess.run([sys.executable, "-m", "pycni", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: pycni [OPTIONS] COMMAND [ARGS]...") and "demo" in out.stdout


def test_fuzz_without_hypothesis_names_the_extra_to_install(tmp_path):
    plugin = tmp_path / "plugin"
    plugin.write_text("#!/bin/sh\n")
    plugin.chmod(0o755)
    # None in sys.modules: `import hypothesis` fails as it does where the extra is not installed.
    code = "import sys; sys.modules['hypothesis'] = None; from pycni.cli import main; main(sys.argv[1:])"
    out = subprocess.run([sys.executable, "-c", code, "fuzz", str(plugin)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == "Error: hypothesis is not installed: pip install 'pycni[fuzz]'\n"

"""docs/install.md's commands, run where they can be: what the page shows is what pycni prints."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.packaging.conftest import CHECKOUT, run

PAGE = CHECKOUT / "docs/install.md"


def console_blocks() -> list[list[tuple[str, list[str]]]]:
    """Each ```console block of the page: its commands (``$ `` stripped), each with its output lines."""
    blocks = []
    for body in re.findall(r"^```console\n(.*?)^```$", PAGE.read_text(), re.S | re.M):
        steps: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
        blocks.append(steps)
    return blocks


def shown(command: str) -> list[str]:
    """The output the page shows for ``command`` (where it shows one)."""
    (found,) = [out for block in console_blocks() for cmd, out in block if cmd == command and out]
    return found


def _env(venv: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}"}


def test_every_console_block_is_commands_with_their_output():
    blocks = console_blocks()
    assert len(blocks) >= 6 and all(block and block[0][0] for block in blocks)


def test_the_version_commands_print_what_the_page_shows(venv):
    for command in ("pycni -V", "python -m pycni --version"):
        out = subprocess.run(command.split(), capture_output=True, text=True, env=_env(venv), timeout=60, check=True)
        assert out.stdout.splitlines() == shown(command)


def test_the_bash_completion_line_registers_pycnis_completion(venv):
    (line,) = [cmd for block in console_blocks() for cmd, _ in block if "_PYCNI_COMPLETE=bash_source" in cmd]
    out = subprocess.run(
        ["bash", "-c", f"{line} && complete -p pycni"], capture_output=True, text=True, env=_env(venv), timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "complete -o nosort -F _pycni_completion pycni"


def test_a_missing_extra_prints_what_the_page_shows(venv, tmp_path):
    # The wheel's venv has no extras: hypothesis really is missing there.
    (command,) = [cmd for block in console_blocks() for cmd, _ in block if cmd.startswith("sudo pycni fuzz")]
    plugin = tmp_path / "plugin"
    plugin.write_text("#!/bin/sh\n")
    plugin.chmod(0o755)
    argv = [*command.removeprefix("sudo ").split()[:-1], str(plugin)]  # any executable will do
    out = subprocess.run(argv, capture_output=True, text=True, env=_env(venv), timeout=60)
    assert out.returncode == 1 and out.stderr.splitlines() == shown(command)


def test_the_extras_table_lists_the_packages_extras(venv):
    listed = set(re.findall(r"^\| `(\w+)` ", PAGE.read_text(), re.M))
    metadata = run(
        venv / "bin/python",
        "-c",
        "import importlib.metadata as m; print(*m.metadata('pycni').get_all('Provides-Extra'))",
    )
    assert listed == set(metadata.stdout.split())

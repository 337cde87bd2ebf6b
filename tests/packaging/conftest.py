"""A wheel of this checkout and a fresh venv with it installed, shared by the packaging tests
(built once per session: the build and the install fetch from the package index)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
# What a build needs of the checkout; the rest (.venv, .git, caches) stays out of the copy.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "pycni", "pycni_plugins")


def run(*argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{argv}: {out.stdout}{out.stderr}"
    return out


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from it (as ``python -m build`` does), from a copy of the
    checkout so the build leaves nothing in it."""
    root = tmp_path_factory.mktemp("build")
    source = root / "src"
    for name in BUILD_INPUTS:
        src = CHECKOUT / name
        if src.is_dir():
            shutil.copytree(src, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(src, source / name)
    run(sys.executable, "-m", "build", "--outdir", root / "dist", source, timeout=300)
    return root / "dist"


@pytest.fixture(scope="session")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("pycni-*.whl")
    return found


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv without system site packages, the wheel pip-installed into it."""
    path = tmp_path_factory.mktemp("venv") / "v"
    run(sys.executable, "-m", "venv", path)
    run(path / "bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, timeout=300)
    return path

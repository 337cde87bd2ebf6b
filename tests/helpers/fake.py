"""Test-side helpers around the scriptable fake plugin (tests/helpers/fakeplugin.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import attrs

SOURCE = Path(__file__).with_name("fakeplugin.py")


@attrs.define
class FakePlugins:
    """A plugin dir holding copies of the fake plugin under several type names."""

    dir: Path
    log: Path
    pidfile: Path

    def install(self, *types: str) -> None:
        for t in types:
            target = self.dir / t
            shutil.copyfile(SOURCE, target)
            os.chmod(target, 0o755)

    def plugin(self, type_: str, **behaviour: Any) -> dict[str, Any]:
        """A plugin config entry that scripts the fake plugin's behaviour per command."""
        conf: dict[str, Any] = {"type": type_, "fake": {"log": str(self.log), "pidfile": str(self.pidfile)}}
        conf["fake"].update(behaviour)
        return conf

    def conflist(self, *plugins: dict[str, Any], name: str = "testnet", version: str = "1.1.0", **extra: Any) -> bytes:
        return json.dumps({"cniVersion": version, "name": name, "plugins": list(plugins), **extra}).encode()

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def pids(self) -> list[int]:
        if not self.pidfile.exists():
            return []
        return [int(p) for p in self.pidfile.read_text().split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False

"""docs/inspect-and-gc.md, replayed: its conflist, then every command of its ``console`` blocks
in order, in throwaway namespaces (``/run/netns/appN`` stands for a test namespace), each output
compared with the page's. Interface names the kernel picks (``veth…``) and column widths are the
only freedom; a shown error must be an error (exit status not 0), anything else must succeed."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from pycni import netns
from pycni.cli import _base, cli, inspect, runtime_commands

pytestmark = pytest.mark.privileged

PAGE = Path(__file__).resolve().parents[2] / "docs" / "inspect-and-gc.md"
_VETH = re.compile(r"veth[0-9a-f]{8}")


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


def _session() -> list[tuple[str, str]]:
    """(command, the output shown) of every ``$ `` line, in page order."""
    steps: list[tuple[str, list[str]]] = []
    for block in _blocks("console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
    return [(command, "\n".join(out)) for command, out in steps]


def _same(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in _VETH.sub("veth*", text).strip().splitlines())


def test_the_page_shows_what_the_commands_print(host, make_netns, tmp_path, monkeypatch):
    conf = json.loads(_blocks("json")[0])
    conf["plugins"][0]["ipam"]["dataDir"] = str(tmp_path / "ipam")
    confdir = tmp_path / "net.d"
    confdir.mkdir()
    (confdir / "10-web.conflist").write_text(json.dumps(conf))
    env = {"NETCONFPATH": str(confdir), "PYCNI_CACHE_DIR": str(tmp_path / "cache")}
    for module in (_base, runtime_commands, inspect):  # the page's reader sits at a terminal
        monkeypatch.setattr(module, "on_terminal", lambda: True)
    spaces = {f"/run/netns/app{i}": make_netns("c") for i in (1, 2)}
    steps = _session()
    assert len(steps) >= 10 and any(c.startswith("pycni inspect") for c, _ in steps)
    for command, shown in steps:
        argv = shlex.split(command)
        if argv[:3] == ["ip", "netns", "del"]:
            netns.remove(spaces[f"/run/netns/{argv[3]}"].name)
            continue
        if argv == ["nft", "flush", "ruleset"]:
            subprocess.run(["nsenter", f"--net={host.path}", *argv], check=True)
            continue
        assert argv[0] == "pycni", command
        quiet = argv[-1] == ">/dev/null"
        args = [spaces[a].path if a in spaces else a for a in argv[1 : -1 if quiet else None]]
        out = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
        failed = shown.startswith(("Error:", "pycni: error"))
        assert (out.exit_code != 0) == failed, (command, out.output)
        if quiet:
            continue
        printed = out.output
        for shown_path, ns in spaces.items():
            printed = printed.replace(ns.path, shown_path)
        assert _same(printed) == _same(shown), command

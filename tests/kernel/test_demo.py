"""``pycni demo`` end to end, and the network it builds: all its state in its own temp dir,
passed explicitly (the process environment is left alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pycni._json import go_field
from pycni.cli.demo import demo, demo_network

pytestmark = pytest.mark.privileged


def test_the_demo_network_keeps_its_leases_under_the_demo_dir(tmp_path):
    network = demo_network(str(tmp_path))
    bridge = next(p for p in network.plugins if p.type == "bridge")
    assert go_field(bridge.raw, "ipam")["dataDir"] == str(tmp_path / "ipam")
    assert [p.type for p in network.plugins] == ["loopback", "bridge", "firewall", "portmap"]


def test_the_demo_passes_every_check_and_leaves_the_environment_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "not-the-demos"))
    before = dict(os.environ)
    seen: list[str] = []
    from pycni import runtime

    real = runtime.Runtime.__init__

    def spy(self, *args, **kw):
        real(self, *args, **kw)
        seen.append(self.state_dir)
        seen.append(os.environ.get("PYCNI_STATE_DIR", ""))

    monkeypatch.setattr(runtime.Runtime, "__init__", spy)
    result = CliRunner().invoke(demo, ["--backend", "inprocess"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "all checks passed" in result.output
    assert dict(os.environ) == before
    state, env_during = seen
    assert os.path.basename(state) == "state" and os.path.basename(os.path.dirname(state)).startswith("pycni-demo-")
    assert env_during == str(tmp_path / "not-the-demos"), "the demo did not rewrite $PYCNI_STATE_DIR"
    assert not os.path.exists(state) and not os.path.exists(tmp_path / "not-the-demos")


def test_the_demo_without_the_privileges_it_needs_says_so_in_one_line():
    """As root with every capability dropped (what a non-root user lacks): one line, exit 1,
    no traceback, nothing created."""
    argv = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-m", "pycni.cli", "demo"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        "Error: pycni demo needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN): it creates throwaway network namespaces\n"
    )


def test_the_demo_with_json_prints_one_json_document_and_nothing_else():
    result = CliRunner().invoke(demo, ["--backend", "inprocess", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["passed"] and document["network"] == "nomad"
    assert sorted(document["results"]) == ["c1", "c2"]
    assert document["results"]["c1"]["ips"][0]["address"].startswith("172.26.64.")
    assert all(step["ok"] for step in document["steps"]) and len(document["steps"]) >= 10

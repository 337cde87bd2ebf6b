"""``pycni fuzz`` against real plugins (one Go reference plugin, one of pycni's) and against
small shell plugins that each break one rule of the contract.

Every run is a subprocess, as a user runs it; it must leave no namespace or temp dir behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycni import netns
from tests.conftest import REFERENCE_PLUGIN_DIR

pytestmark = pytest.mark.privileged


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pycni-fuzz-test-") as path:
        yield Path(path)


def _of(pid: int) -> list[str]:
    """The namespaces and temp dirs of the ``pycni fuzz`` process ``pid`` (their names carry it;
    other runs on the machine may be creating theirs meanwhile)."""
    prefix = f"pycni-fuzz-{pid}-"
    return [n for d in ("/run/netns", tempfile.gettempdir()) for n in os.listdir(d) if n.startswith(prefix)]


def _fuzz(workdir: Path, plugin: str, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``pycni fuzz`` as a user does; it leaves no namespace or temp dir behind."""
    report = workdir / "report.json"
    argv = [sys.executable, "-m", "pycni.cli", "fuzz", plugin, "--report", str(report), *args]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
    proc = subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not _of(child.pid), _of(child.pid)
    return proc, json.loads(report.read_text())


def _checks(doc: dict) -> list[str]:
    return [v["check"] for v in doc["violations"]]


@pytest.mark.reference
def test_catches_the_reference_portmap_check_on_an_ipv4_only_attachment_first(workdir):
    """portmap 1.1.1's CHECK fails on every IPv4-only attachment with a port mapping: the first
    canonical example (newest version, IPv4-only, one mapping) finds it, whatever the seed."""
    proc, doc = _fuzz(
        workdir, f"{REFERENCE_PLUGIN_DIR}/portmap", "--commands", "ADD,CHECK,DEL", "--examples", "3", "--seed", "1"
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert _checks(doc) == ["check-after-add"]
    assert doc["example_kinds"] == {"canonical": 3}
    violation = doc["violations"][0]
    assert violation["example_kind"] == "canonical"
    add, check = violation["steps"]
    assert "could not check ipv6 dnat" in check["stdout"]
    stdin = json.loads(add["stdin"])
    assert stdin["cniVersion"] == doc["versions"][-1]
    assert [ip["address"].count(".") for ip in stdin["prevResult"]["ips"]] == [3]
    assert stdin["runtimeConfig"]["portMappings"] == [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
    assert check["shell"].startswith("printf '") and check["shell"].endswith(f"{REFERENCE_PLUGIN_DIR}/portmap")
    assert "CNI_COMMAND=CHECK" in check["shell"] and "CNI_NETNS=/run/netns/pycni-fuzz-" in check["shell"]
    assert "check-after-add: CHECK after a successful ADD failed" in proc.stdout
    assert "1 contract violation(s)" in proc.stdout


def test_pycni_loopback_keeps_the_contract(workdir, tmp_path):
    from pycni_plugins.install import install

    (plugin,) = install(str(tmp_path / "bin"), ["loopback"])
    proc, doc = _fuzz(workdir, plugin, "--examples", "9", "--seed", "1")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert doc["violations"] == [] and doc["examples"] == 9
    assert doc["versions"] == ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
    assert doc["example_kinds"]["canonical"] == 7, "one per version: loopback takes no addresses"
    assert sum(doc["outcomes"]["ADD"].values()) == 9
    assert "no contract violation found" in proc.stdout
    as_json, _ = _fuzz(workdir, plugin, "--examples", "2", "--seed", "1", "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["examples"] == 2, "--json: the report on stdout"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_run_stopped_by_a_signal_leaves_nothing_behind(workdir, tmp_path, signum):
    """As a CI timeout (SIGTERM), a closed terminal (SIGHUP) or Ctrl-C stops it mid-example: the
    example's namespaces and temp dir are removed, then it dies of that signal (Ctrl-C: exit 1)."""
    from pycni_plugins.install import install

    (plugin,) = install(str(tmp_path / "bin"), ["loopback"])
    argv = [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "pycni.cli",
        "fuzz",
        plugin,
        "--examples",
        "100000",
        "--seed",
        "1",
    ]
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored
    # across exec: the child gets SIGINT at its default, as a terminal's foreground job has it.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, inherited)
    with child:
        try:
            deadline = time.monotonic() + 60
            while not _of(child.pid):  # an example is running: its namespaces exist
                assert child.poll() is None and time.monotonic() < deadline, child.communicate()
                time.sleep(0.005)
            child.send_signal(signum)
            try:
                _, stderr = child.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
                pytest.fail(f"still running 60 s after {signum.name}:\n{child.communicate(timeout=30)[1][-8000:]}")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            for name in _of(child.pid):  # what a killed run could not remove
                if os.path.exists(f"/run/netns/{name}"):
                    netns.remove(name)
                else:
                    shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not _of(child.pid), _of(child.pid)
    if signum == signal.SIGINT:
        assert child.returncode == 1, stderr
    else:
        assert child.returncode == -signum, stderr
        assert f"pycni fuzz: stopped by {signum.name}; cleaned up" in stderr


# --- plugins that break one rule each (sh scripts: fast, and exact) ------------------------------------

ERROR = """printf '{"code": 7, "msg": "nope"}'; exit 1"""
# Each fake speaks only 1.0.0, so a valid example's result is {"cniVersion": "1.0.0"}.
PROLOGUE = """if [ "$CNI_COMMAND" = VERSION ]; then
    echo '{"cniVersion": "1.0.0", "supportedVersions": ["1.0.0"]}'; exit 0
fi
"""
SCRIPTS = {
    # exit 0 on ADD with something that is no result
    "bad-result": """case $CNI_COMMAND in ADD) echo '{"cniVersion": "1.0.0", "ips": 5}';; esac""",
    # a failure without an error object
    "bad-error": """case $CNI_COMMAND in ADD) echo oops >&2; exit 1;; esac""",
    "signal": """case $CNI_COMMAND in ADD) kill -SEGV $$;; esac""",
    "hang": """case $CNI_COMMAND in ADD) exec sleep 30;; esac""",
    "output-bound": """case $CNI_COMMAND in ADD) head -c 2000000 /dev/zero;; esac""",
    # ADD succeeds (prints its prevResult-free result), CHECK refuses
    "check-after-add": """read -r _
case $CNI_COMMAND in
ADD) printf '{"cniVersion": "1.0.0"}';;
CHECK) """
    + ERROR
    + """;;
esac""",
    # the second DEL fails
    "del-twice": """read -r _
mkdir -p "$PYCNI_STATE_DIR"; d=$PYCNI_STATE_DIR/deleted
case $CNI_COMMAND in
ADD) printf '{"cniVersion": "1.0.0"}';;
DEL) if [ -e "$d" ]; then rm -f "$d"; """
    + ERROR
    + """; fi; : > "$d";;
esac""",
    # ADD makes a veth pair in the container; DEL forgets it
    "leftovers": """read -r _
case $CNI_COMMAND in
ADD) ip -n "$(basename "$CNI_NETNS")" link add fz0 type veth peer name fz1; printf '{"cniVersion": "1.0.0"}';;
esac""",
}


@pytest.mark.parametrize("check", sorted(SCRIPTS))
def test_each_rule_of_the_contract_is_enforced(workdir, check):
    plugin = workdir / "bin" / "fake"
    plugin.parent.mkdir()
    plugin.write_text("#!/bin/sh\n" + PROLOGUE + SCRIPTS[check] + "\n")
    plugin.chmod(0o755)
    args = ["--type", "fake", "--examples", "3", "--seed", "3", "--timeout", "0.3"]
    proc, doc = _fuzz(workdir, str(plugin), *args)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert check in _checks(doc), doc["violations"]
    violation = next(v for v in doc["violations"] if v["check"] == check)
    assert violation["steps"][-1]["shell"].endswith(str(plugin))
    assert f"{check}: " in proc.stdout


def test_usage_errors_are_one_line(workdir):
    proc = subprocess.run(
        [sys.executable, "-m", "pycni.cli", "fuzz", "/bin/true", "--commands", "ADD,NOPE"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "NOPE: choose from ADD,CHECK,DEL" in proc.stderr


@pytest.mark.parametrize("plugin_type", ["macvlan", "ipvlan", "vlan", "host-device"])
def test_link_plugin_configs_name_the_link_each_fuzz_host_has(plugin_type):
    """macvlan, ipvlan and vlan get a master and host-device a device that exist in the
    example's host namespace (without it every "valid" ADD failed before doing anything)."""
    from hypothesis import given, settings

    from pycni.testing import strategies
    from pycni.testing.fuzz.world import throwaway_world
    from tests.helpers.kernel import links

    @settings(max_examples=10, deadline=None, database=None)
    @given(strategies.network_configs(plugin_type))
    def named(conf):
        assert conf.get("master", conf.get("device")) == strategies.HOST_LINK

    named()
    with throwaway_world(0) as world:
        # operstate UP (the kernel reports it a moment after the carrier): its peer is up, so
        # IPv6 DAD runs on what is made of it
        deadline = time.monotonic() + 5
        while links(world.host)[strategies.HOST_LINK]["state"] != "UP":
            assert time.monotonic() < deadline, links(world.host)[strategies.HOST_LINK]
            time.sleep(0.05)
        assert set(links(world.container)) == {"lo"}

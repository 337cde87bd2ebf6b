"""``pycni inspect`` over the built-in plugins, in a throwaway host namespace: the attachments
with their addresses, host ports, host veths, host-local leases and nftables elements, and the
stale one (its netns removed) marked as `gc --reconcile` would treat it."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from pycni import netns
from pycni.cli import cli

pytestmark = pytest.mark.privileged


def _conflist(tmp_path) -> dict:
    return {
        "cniVersion": "1.1.0",
        "name": "inspectnet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "pbr-insp",
                "isGateway": True,
                "ipMasq": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(tmp_path / "ipam"),
                    "ranges": [[{"subnet": "198.18.71.0/24"}]],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def test_inspect_shows_each_attachment_with_its_kernel_state_and_the_stale_one(host, make_netns, tmp_path):
    confdir = tmp_path / "net.d"
    confdir.mkdir()
    (confdir / "10-inspect.conflist").write_text(json.dumps(_conflist(tmp_path)))
    env = {"NETCONFPATH": str(confdir), "PYCNI_CACHE_DIR": str(tmp_path / "cache"), "PYCNI_BACKEND": "inprocess"}
    live, doomed = make_netns("c"), make_netns("c")
    ports = '{"portMappings":[{"hostPort":8081,"containerPort":80,"protocol":"tcp"}]}'

    def cli_ok(*args: str) -> str:
        out = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return out.output

    cli_ok("add", "inspectnet", live.path, "--container-id", "live", "--cap-args", ports)
    cli_ok("add", "inspectnet", doomed.path, "--container-id", "doomed")
    netns.remove(doomed.name)  # a container whose namespace went without a DEL
    (tmp_path / "ipam" / "inspectnet" / "198.18.71.99").write_bytes(b"crashed\r\neth0")  # ADD died before the cache

    out = json.loads(cli_ok("inspect", "inspectnet"))
    rows = {r["containerId"]: r for r in out["attachments"]}
    assert sorted(rows) == ["crashed", "doomed", "live"]
    orphan = rows["crashed"]
    assert (orphan["cached"], orphan["leases"], orphan["netns"]) == (False, ["198.18.71.99"], None)
    assert orphan["stale"] == "not in the cache: gc --reconcile collects it"
    lease = "bridge: host-local lease 198.18.71.99 of crashed/eth0 (network inspectnet)"
    assert out["reconcile"][0]["collected"] == orphan["reconcile"] == [lease]
    ok, gone = rows["live"], rows["doomed"]
    assert (ok["netns"], ok["netnsAlive"], ok["stale"]) == (live.path, True, None)
    assert ok["hostPorts"] == ["8081/tcp->80"]
    assert [a.split("/")[0] for a in ok["addresses"]] == ok["leases"]
    assert ok["hostLinks"][0] == "pbr-insp" and ok["hostLinks"][1].startswith("veth")
    assert ok["nftElements"] == {"masq": 1, "portmap": 2}
    assert gone["netnsAlive"] is False and gone["stale"] == "netns gone: gc --reconcile DELs it"
    assert gone["leases"], "the stale attachment's lease is still there, for gc --reconcile to release"

    report = json.loads(cli_ok("gc", "inspectnet", "--reconcile"))
    assert [s.split(" ")[0] for s in report["staleAttachments"]] == ["doomed/eth0"]
    after = json.loads(cli_ok("inspect", "inspectnet", "--json"))["attachments"]
    assert [(r["containerId"], r["stale"]) for r in after] == [("live", None)]
    cli_ok("del", "inspectnet", live.path, "--container-id", "live")
    assert json.loads(cli_ok("inspect", "inspectnet"))["attachments"] == []


def test_after_a_ruleset_flush_check_names_the_reconcile_that_restores_it(host, make_netns, tmp_path):
    confdir = tmp_path / "net.d"
    confdir.mkdir()
    (confdir / "10-inspect.conflist").write_text(json.dumps(_conflist(tmp_path)))
    env = {"NETCONFPATH": str(confdir), "PYCNI_CACHE_DIR": str(tmp_path / "cache"), "PYCNI_BACKEND": "inprocess"}
    c = make_netns("c")
    argv = [c.path, "--container-id", "flushed"]
    ports = ["--cap-args", '{"portMappings":[{"hostPort":8082,"containerPort":80,"protocol":"tcp"}]}']
    assert CliRunner().invoke(cli, ["add", "inspectnet", *argv, *ports], env=env).exit_code == 0
    subprocess.run(["nsenter", f"--net={host.path}", "nft", "flush", "ruleset"], check=True)
    check = CliRunner().invoke(cli, ["check", "inspectnet", *argv, *ports], env=env)
    assert check.exit_code == 1
    assert check.output.rstrip().endswith("; run `pycni gc inspectnet --reconcile` to restore"), check.output
    assert CliRunner().invoke(cli, ["gc", "inspectnet", "--reconcile"], env=env).exit_code == 0
    assert CliRunner().invoke(cli, ["check", "inspectnet", *argv, *ports], env=env).exit_code == 0
    assert CliRunner().invoke(cli, ["del", "inspectnet", *argv, *ports], env=env).exit_code == 0


def test_inspect_of_a_folded_network_reads_the_leases_of_its_inner_plugins(host, make_netns, tmp_path):
    from pycni.chain import fold

    confdir = tmp_path / "net.d"
    confdir.mkdir()
    (confdir / "10-inspect.conflist").write_bytes(fold(json.dumps(_conflist(tmp_path))))
    env = {"NETCONFPATH": str(confdir), "PYCNI_CACHE_DIR": str(tmp_path / "cache"), "PYCNI_BACKEND": "inprocess"}
    live = make_netns("c")
    added = CliRunner().invoke(cli, ["add", "inspectnet", live.path, "--container-id", "live"], env=env)
    assert added.exit_code == 0, added.output
    (tmp_path / "ipam" / "inspectnet" / "198.18.71.99").write_bytes(b"crashed\r\neth0")  # ADD died before the cache

    out = CliRunner().invoke(cli, ["inspect", "inspectnet"], env=env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    rows = {r["containerId"]: r for r in json.loads(out.output)["attachments"]}
    assert rows["crashed"]["leases"] == ["198.18.71.99"] and not rows["crashed"]["cached"]
    assert [a.split("/")[0] for a in rows["live"]["addresses"]] == rows["live"]["leases"] != []

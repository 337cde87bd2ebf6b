"""``pycni inspect`` over fake plugins: the cache's attachments, their netns, and what is stale
(the reconcile dry run's verdict); JSON when stdout is not a terminal, a table with --json absent
on one."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pycni.cli import cli
from pycni.cli.inspect import _table
from pycni.cli.runtime_commands import container_id_for


@pytest.fixture
def env(fake_plugins, tmp_path):
    confdir = tmp_path / "net.d"
    confdir.mkdir()
    (confdir / "10-test.conflist").write_bytes(
        fake_plugins.conflist(fake_plugins.plugin("fake-a") | {"capabilities": {"portMappings": True}})
    )
    return {
        "NETCONFPATH": str(confdir),
        "CNI_PATH": str(fake_plugins.dir),
        "PYCNI_CACHE_DIR": str(tmp_path / "cache"),
        "PYCNI_BACKEND": "exec",
    }


def run(args, env):
    out = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.output


def test_inspect_lists_each_cached_attachment_and_marks_the_one_whose_netns_is_gone(env, fake_plugins):
    alive = "/proc/self/ns/net"
    run(["add", "testnet", alive, "--cap-args", '{"portMappings":[{"hostPort":8080,"containerPort":80}]}'], env)
    run(["add", "testnet", "/run/netns/does-not-exist", "--ifname", "net1"], env)
    calls = len(fake_plugins.calls())
    out = json.loads(run(["inspect", "testnet"], env))
    rows = {r["containerId"]: r for r in out["attachments"]}
    live, gone = rows[container_id_for(alive)], rows[container_id_for("/run/netns/does-not-exist")]
    assert (live["ifname"], live["netns"], live["netnsAlive"], live["stale"]) == ("eth0", alive, True, None)
    assert live["addresses"] == ["198.18.0.2/24"] and live["hostPorts"] == ["8080/tcp->80"]
    assert (gone["ifname"], gone["netnsAlive"]) == ("net1", False)
    assert gone["stale"] == "netns gone: gc --reconcile DELs it"
    assert out["reconcile"][0]["dryRun"] and len(out["reconcile"][0]["staleAttachments"]) == 1
    assert len(fake_plugins.calls()) == calls, "inspect changed something"


def test_inspect_without_a_network_covers_the_conf_dir(env, fake_plugins):
    run(["add", "testnet", "/run/netns/x"], env)
    out = json.loads(run(["inspect", "--json"], env))
    assert [(r["network"], r["containerId"]) for r in out["attachments"]] == [
        ("testnet", container_id_for("/run/netns/x"))
    ]


def test_the_table_has_a_column_per_field_and_says_alive_or_gone():
    row = {
        "network": "n",
        "containerId": "c1",
        "ifname": "eth0",
        "netns": "/run/netns/c1",
        "netnsAlive": False,
        "addresses": ["198.18.0.2/24"],
        "hostPorts": [],
        "hostLinks": ["br0", "veth1"],
        "stale": "netns gone",
    }
    header, line = _table([row])
    columns = ["NETWORK", "CONTAINER", "IFNAME", "NETNS", "ADDRESSES", "HOST PORTS", "HOST LINK", "STALE"]
    values = ["n", "c1", "eth0", "/run/netns/c1 (gone)", "198.18.0.2/24", "-", "br0,veth1", "netns gone"]
    assert [line[header.index(c) :].split("  ")[0] for c in columns] == values

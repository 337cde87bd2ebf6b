"""A failed ADD, its rollback and a DEL touch only what their own attachment made: another
attachment's lease, interfaces, ``lo`` and nftables elements stay, and it stays CHECK-clean.
In-process, and through the CLI with the plugins exec'd as CNI binaries (issue 10, items 1, 5)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pycni.errors import CNIError
from pycni.request import RuntimeConf
from pycni_plugins.install import install
from tests.faults.conftest import REPO
from tests.helpers.kernel import links

pytestmark = pytest.mark.privileged


def _intact(world, cid, ns, ip, lease_before):
    """``cid`` at ``ip`` in ``ns`` is as its ADD left it: lease, eth0, lo up, CHECK, ping."""
    assert world.leases() == lease_before
    in_ns = links(ns.path)
    assert "eth0" in in_ns and in_ns["lo"]["state"] != "DOWN", in_ns
    world.check(cid, ns.path)
    assert world.ping(ip), f"{cid} at {ip} does not answer"


def test_a_failed_add_of_an_attachment_held_elsewhere_keeps_its_lease(world):
    """Same container ID and ifname, another netns: the second ADD is refused and releases
    nothing; the address stays taken, so a third container asking for it is refused."""
    a, b, c = (world.make_netns("c") for _ in range(3))
    [ip] = world.add("dupx", a.path)
    leases = world.leases()
    with pytest.raises(CNIError):  # today: "attachment dupx/eth0 of network crashnet already exists"
        world.add("dupx", b.path)
    assert set(links(b.path)) == {"lo"}
    _intact(world, "dupx", a, ip, leases)
    asking = RuntimeConf(
        "third", c.path, "eth0", args=[("IgnoreUnknown", "1"), ("IP", ip)], capability_args={"portMappings": []}
    )
    with pytest.raises(CNIError, match=f"requested IP address {ip} is not available"):
        world.runtime.add_network_list(world.network, asking, rollback=True)
    _intact(world, "dupx", a, ip, leases)
    world.delete("dupx", a.path)
    assert world.leftovers(a) == {}


def test_add_with_rollback_into_a_namespace_another_attachment_uses_leaves_it_alone(world):
    """The intruder's ADD fails ("eth0 already exists"); its rollback DEL, and any later DEL of
    it, delete neither the victim's eth0 nor set lo down."""
    ns = world.make_netns("c")
    [ip] = world.add("vic2", ns.path)
    leases = world.leases()
    with pytest.raises(CNIError, match="already exists"):
        world.runtime.add_network_list(world.network, world.rt("intruder", ns.path), rollback=True)
    _intact(world, "vic2", ns, ip, leases)
    with pytest.raises(CNIError, match="already exists"):
        world.add("intruder", ns.path)  # no rollback: the runtime's DEL follows later, twice
    world.delete("intruder", ns.path)
    world.delete("intruder", ns.path)
    _intact(world, "vic2", ns, ip, leases)
    world.delete("vic2", ns.path)
    assert world.leftovers(ns) == {}


@pytest.fixture
def cli(world, tmp_path):
    """``pycni VERB NETWORK NETNS ...`` inside the host namespace, the plugins exec'd from an
    installed plugin dir (``--backend exec``), as an operator would run it."""
    bindir = tmp_path / "bin"
    install(str(bindir))
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-crash.conflist").write_text(world.conflist_text)

    def run(verb: str, ns: str, cid: str, *extra: str, ports=None) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pycni.cli", verb, world.network.name, ns, "--container-id", cid, *extra]
        argv += ["--conf-dir", str(conf_dir), "--cache-dir", str(world.cache_dir)]
        argv += ["--plugin-path", str(bindir), "--backend", "exec"]
        env = world.env(CAP_ARGS=json.dumps({"portMappings": world.ports(cid) if ports is None else ports}))
        return subprocess.run(
            ["nsenter", f"--net={world.host.path}", *argv],
            cwd=str(REPO),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_exec_a_failed_add_of_an_attachment_held_elsewhere_keeps_its_lease(world, cli):
    a, b = world.make_netns("c"), world.make_netns("c")
    out = json.loads(_ok(cli("add", a.path, "dupx")).stdout)
    ip = out["ips"][0]["address"].split("/")[0]
    leases = world.leases()
    proc = cli("add", b.path, "dupx")
    assert proc.returncode == 1, proc.stderr
    assert set(links(b.path)) == {"lo"}
    assert world.leases() == leases
    _ok(cli("check", a.path, "dupx"))
    proc = cli("add", b.path, "third", "--args", f"IgnoreUnknown=1;IP={ip}")
    assert proc.returncode == 1 and f"requested IP address {ip} is not available" in proc.stderr, proc.stderr
    assert world.leases() == leases
    _ok(cli("check", a.path, "dupx"))
    _ok(cli("del", a.path, "dupx"))
    _ok(cli("del", b.path, "third"))
    assert world.leftovers(a) == {}


def test_cli_exec_rollback_into_a_namespace_another_attachment_uses_leaves_it_alone(world, cli):
    ns = world.make_netns("c")
    out = json.loads(_ok(cli("add", ns.path, "vic2")).stdout)
    ip = out["ips"][0]["address"].split("/")[0]
    leases = world.leases()
    proc = cli("add", ns.path, "intruder", "--rollback")
    assert proc.returncode == 1 and "already exists" in proc.stderr, proc.stderr
    _ok(cli("del", ns.path, "intruder"))
    assert world.leases() == leases
    in_ns = links(ns.path)
    assert "eth0" in in_ns and in_ns["lo"]["state"] != "DOWN", in_ns
    _ok(cli("check", ns.path, "vic2"))
    assert world.ping(ip)
    _ok(cli("del", ns.path, "vic2"))
    assert world.leftovers(ns) == {}


def test_cli_exec_a_host_ip_mapping_cannot_shadow_another_containers_port_on_every_address(world, cli):
    """c1 publishes 18080 on every address; c2 asks for 18080 on the gateway address: refused,
    the message says what the earlier plugins left and that DEL removes it; c1 stays reachable."""
    c1, c2 = world.make_netns("c"), world.make_netns("c")
    _ok(cli("add", c1.path, "c1", ports=[{"hostPort": 18080, "containerPort": 80}]))
    before = world.nft_elements()
    one = [{"hostPort": 18080, "containerPort": 80, "hostIP": "198.18.64.1"}]
    proc = cli("add", c2.path, "c2", ports=one)
    assert proc.returncode == 1, proc.stderr
    assert "host port 18080/tcp is already mapped by another container (crashnet c1 eth0)" in proc.stderr
    assert "portmap changed nothing" in proc.stderr and "a DEL of this attachment removes it" in proc.stderr
    assert [e for e in world.nft_elements() if "hostports" in e] == [e for e in before if "hostports" in e]
    _ok(cli("check", c1.path, "c1", ports=[{"hostPort": 18080, "containerPort": 80}]))
    _ok(cli("del", c2.path, "c2", ports=one))
    assert world.nft_elements() == before
    _ok(cli("del", c1.path, "c1"))
    assert world.leftovers() == {}

"""A failed ADD, its rollback and a DEL touch only what their own attachment made: another
attachment's lease, interfaces, ``lo`` and nftables elements stay, and it stays CHECK-clean.
In-process, and through the CLI with the plugins exec'd as CNI binaries (``pycni_plugins.kernel.owned``),
with each veth-making plugin (bridge, ptp) in the chain. An ADD of an attachment cached in
another netns is refused by the runtime before any plugin runs, so no rollback DEL reaches the
attachment that holds it."""

from __future__ import annotations

import json
import subprocess

import pytest

from pycni import netns
from pycni.errors import CNIError, ErrorCode
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni_plugins.install import install
from pycni_plugins.kernel import links as kernel_links
from tests.faults.conftest import World, conflist, ok
from tests.helpers.kernel import links

pytestmark = pytest.mark.privileged


@pytest.fixture(params=["bridge", "ptp"])
def world(request, host_ns, make_netns, tmp_path, monkeypatch) -> World:
    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "state"))
    return World(host_ns, make_netns, tmp_path, conflist(str(tmp_path / "ipam"), main=request.param))


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
    with pytest.raises(CNIError, match="already attached"):  # by the runtime: dupx/eth0 is cached in a
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


@pytest.mark.parametrize(
    ("veth", "refusal"),
    [("live", "attachment dupx/eth0 of network crashnet already exists"), ("gone", "duplicate allocation")],
)
def test_an_add_of_an_attachment_held_elsewhere_by_a_runtime_without_its_cache_keeps_its_lease(
    world, tmp_path, veth, refusal
):
    """A runtime without dupx's cache entry ADDs dupx into b. With dupx's veth there, the
    interface plugin refuses before it makes anything; with the veth deleted behind pycni's
    back, host-local refuses the duplicate. Either way the undo frees no lease it did not make."""
    a, b = world.make_netns("c"), world.make_netns("c")
    world.add("dupx", a.path)
    leases = world.leases()
    if veth == "gone":
        [host] = world.veths()
        netns.run_in(world.host.path, kernel_links.delete_link, host)
    other = Runtime([], cache_dir=str(tmp_path / "other-cache"), backend="inprocess", host_netns=world.host.path)
    with pytest.raises(CNIError, match=refusal):
        other.add_network_list(world.network, world.rt("dupx", b.path))
    assert set(links(b.path)) == {"lo"}
    assert world.leases() == leases
    if veth == "live":
        world.check("dupx", a.path)
    world.delete("dupx", a.path)
    assert world.leftovers(a) == {}


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
        cap_args = json.dumps({"portMappings": world.ports(cid) if ports is None else ports})
        return world.cli(bindir, conf_dir, verb, ns, cid, *extra, CAP_ARGS=cap_args)

    return run


def test_cli_exec_a_failed_add_of_an_attachment_held_elsewhere_keeps_its_lease(world, cli):
    a, b = world.make_netns("c"), world.make_netns("c")
    out = json.loads(ok(cli("add", a.path, "dupx")).stdout)
    ip = out["ips"][0]["address"].split("/")[0]
    leases = world.leases()
    proc = cli("add", b.path, "dupx")
    assert proc.returncode == 1, proc.stderr
    assert set(links(b.path)) == {"lo"}
    assert world.leases() == leases
    ok(cli("check", a.path, "dupx"))
    proc = cli("add", b.path, "third", "--args", f"IgnoreUnknown=1;IP={ip}")
    assert proc.returncode == 1 and f"requested IP address {ip} is not available" in proc.stderr, proc.stderr
    assert world.leases() == leases
    ok(cli("check", a.path, "dupx"))
    ok(cli("del", a.path, "dupx"))
    ok(cli("del", b.path, "third"))
    assert world.leftovers(a) == {}


def test_cli_exec_rollback_into_a_namespace_another_attachment_uses_leaves_it_alone(world, cli):
    ns = world.make_netns("c")
    out = json.loads(ok(cli("add", ns.path, "vic2")).stdout)
    ip = out["ips"][0]["address"].split("/")[0]
    leases = world.leases()
    proc = cli("add", ns.path, "intruder", "--rollback")
    assert proc.returncode == 1 and "already exists" in proc.stderr, proc.stderr
    ok(cli("del", ns.path, "intruder"))
    assert world.leases() == leases
    in_ns = links(ns.path)
    assert "eth0" in in_ns and in_ns["lo"]["state"] != "DOWN", in_ns
    ok(cli("check", ns.path, "vic2"))
    assert world.ping(ip)
    ok(cli("del", ns.path, "vic2"))
    assert world.leftovers(ns) == {}


def test_cli_exec_a_host_ip_mapping_cannot_shadow_another_containers_port_on_every_address(world, cli):
    """c1 publishes 18080 on every address; c2 asks for 18080 on the gateway address: refused,
    the message says what the earlier plugins left and that DEL removes it; c1 stays reachable."""
    c1, c2 = world.make_netns("c"), world.make_netns("c")
    ok(cli("add", c1.path, "c1", ports=[{"hostPort": 18080, "containerPort": 80}]))
    before = world.nft_elements()
    one = [{"hostPort": 18080, "containerPort": 80, "hostIP": "198.18.64.1"}]
    proc = cli("add", c2.path, "c2", ports=one)
    assert proc.returncode == 1, proc.stderr
    assert "host port 18080/tcp is already mapped by another container (crashnet c1 eth0)" in proc.stderr
    assert "portmap changed nothing" in proc.stderr and "a DEL of this attachment removes it" in proc.stderr
    assert [e for e in world.nft_elements() if "hostports" in e] == [e for e in before if "hostports" in e]
    ok(cli("check", c1.path, "c1", ports=[{"hostPort": 18080, "containerPort": 80}]))
    ok(cli("del", c2.path, "c2", ports=one))
    assert world.nft_elements() == before
    ok(cli("del", c1.path, "c1"))
    assert world.leftovers() == {}


def _attached_elsewhere(cid: str, a: str, b: str) -> str:
    return f'CNI_CONTAINERID "{cid}" with CNI_IFNAME "eth0" is already attached to network "crashnet" in netns "{a}"'


def test_add_with_rollback_of_an_attachment_cached_in_another_netns_is_refused_before_any_plugin(world):
    """dupx/eth0 is cached in A: its ADD into B is refused with code 4 before any plugin runs,
    so no rollback DEL (which would be dupx/eth0's DEL) frees A's lease or deletes its veth."""
    a, b = world.make_netns("c"), world.make_netns("c")
    [ip] = world.add("dupx", a.path)
    leases, elements, records = world.leases(), world.nft_elements(), world.records()
    with pytest.raises(CNIError, match=_attached_elsewhere("dupx", a.path, b.path)) as info:
        world.runtime.add_network_list(world.network, world.rt("dupx", b.path), rollback=True)
    assert info.value.code == ErrorCode.INVALID_ENVIRONMENT_VARIABLES
    assert set(links(b.path)) == {"lo"}
    assert (world.nft_elements(), world.records()) == (elements, records)
    _intact(world, "dupx", a, ip, leases)
    world.delete("dupx", a.path)
    assert world.leftovers(a) == {}


def test_a_repeated_add_into_the_same_netns_still_reaches_the_plugins(world):
    """Same netns: the runtime lets it through (libcni does), the interface plugin refuses it."""
    a = world.make_netns("c")
    world.add("dupx", a.path)
    with pytest.raises(CNIError, match="already exists") as info:
        world.add("dupx", a.path)
    assert info.value.code == ErrorCode.INTERNAL
    world.delete("dupx", a.path)
    assert world.leftovers(a) == {}


def test_cli_exec_rollback_of_an_attachment_cached_in_another_netns_is_refused_before_any_plugin(world, cli):
    a, b = world.make_netns("c"), world.make_netns("c")
    out = json.loads(ok(cli("add", a.path, "dupx")).stdout)
    ip = out["ips"][0]["address"].split("/")[0]
    leases, elements = world.leases(), world.nft_elements()
    proc = cli("add", b.path, "dupx", "--rollback")
    assert proc.returncode == 1, proc.stderr
    assert _attached_elsewhere("dupx", a.path, b.path) in proc.stderr + proc.stdout
    assert '"code": 4' in proc.stdout or "code 4" in proc.stderr, (proc.stdout, proc.stderr)
    assert set(links(b.path)) == {"lo"}
    assert (world.leases(), world.nft_elements()) == (leases, elements)
    ok(cli("check", a.path, "dupx"))
    assert world.ping(ip)
    ok(cli("del", a.path, "dupx"))
    assert world.leftovers(a) == {}

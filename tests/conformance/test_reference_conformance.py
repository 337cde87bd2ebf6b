"""pycni_plugins against Debian's reference binaries (containernetworking-plugins 1.1.1).

The same conflist runs through both, each in its own throwaway world (see :mod:`.harness`), and
the suite compares results, kernel state, CHECK and behaviour, then DEL. Where the two differ,
the difference is asserted to be exactly one of these, so that none is hidden and a new one
fails the suite:

* **veth txqueuelen** -- 1.1.1 creates both veth ends with ``txqueuelen 0`` (a struct literal
  left TxQLen at 0; fixed upstream in v1.6.0); pycni leaves the kernel default, 1000.
* **keep_addr_on_down** -- with IPv6, pycni sets ``keep_addr_on_down=1`` on the container
  interface, as the reference does since v1.7.0; 1.1.1 predates it.
* **portmap CHECK** -- 1.1.1 fails CHECK for a container with port mappings: it checks the
  other address family's table (IPv4 rules looked up in ip6tables, or a chain in a family the
  container does not have). An upstream bug, recorded as such; pycni's CHECK passes.
* **DEL without portMappings** -- the reference portmap's DEL does nothing unless the runtime
  passes the mappings again (containernetworking/plugins #510): its DNAT rules leak. pycni
  removes what its ADD added from its own record.
* **a host port already published** -- the reference publishes it a second time without a
  word (the first container keeps the traffic); pycni refuses the ADD and changes nothing.
* **a port mapping without protocol** -- the reference passes the empty protocol on to iptables,
  which refuses it, and the ADD fails; pycni publishes it as TCP.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest

from pycni.errors import CNIError
from pycni.testing import probes

from .harness import CONTAINER_PORT, HOST_PORT, World, behaviour, expected_behaviour
from .twins import differences

pytestmark = [pytest.mark.privileged, pytest.mark.reference]


def _pair(attached: dict[str, World]) -> tuple[World, World]:
    return attached["go"], attached["pycni"]


# --- ADD: results, kernel state, CHECK, behaviour ------------------------------------------------


def test_results_match(attached):
    go, ours = _pair(attached)
    for g, o in zip(go.containers, ours.containers, strict=True):
        assert o.result is not None and g.result is not None
        assert ours.normalise(o.result.to_json()) == go.normalise(g.result.to_json())
        assert [i.name for i in o.result.interfaces] == [ours.bridge, o.result.interfaces[1].name, "eth0"]
        assert {ip.interface for ip in o.result.ips} == {2}
        assert sorted(ip.address.version for ip in o.result.ips) == sorted(ours.families)


def test_kernel_state_matches(attached):
    go, ours = _pair(attached)
    expected = []
    for c in ours.containers:
        expected += [(f"/host/links/VETH({c.id})/txqlen", 0, 1000), (f"/{c.id}/links/eth0/txqlen", 0, 1000)]
        if 6 in ours.families:
            expected.append((f"/{c.id}/sysctls/net/ipv6/conf/eth0/keep_addr_on_down", "0", "1"))
    assert sorted(differences(go.snapshot(), ours.snapshot())) == sorted(expected)


def test_check_passes_and_the_reference_portmap_check_bug(attached):
    go, ours = _pair(attached)
    a, b = ours.containers
    ours.check(a)
    ours.check(b)
    ga, gb = go.containers
    go.check(gb)  # no port mappings: the reference passes too
    other = "ipv4" if go.families == (6,) else "ipv6"
    with pytest.raises(CNIError, match=f"^could not check {other} dnat: "):
        go.check(ga)


def test_behaviour_matches(attached):
    go, ours = _pair(attached)
    seen = {name: behaviour(w, *w.containers) for name, w in attached.items()}
    assert seen["pycni"] == expected_behaviour(ours)
    assert seen["go"] == expected_behaviour(go)


# --- DEL, and the refused conflict -----------------------------------------------------------------


def test_del_leaves_nothing_and_repeats_cleanly(fresh):
    for world in fresh("dual-1.0.0").values():
        a, b = world.container("conf-a", ports=True), world.container("conf-b")
        world.add(a)
        world.add(b)
        for _ in range(2):
            world.delete(a)
            assert world.leftovers(a) == {}, world.impl
        world.settle()
        assert probes.ping(b.ns.path, b.gateway(4)) and probes.ping(b.ns.path, b.gateway(6)), world.impl
        world.delete(b)
        assert world.leftovers(b) == {}, world.impl


def test_del_without_port_mappings(fresh):
    pair = fresh("dual-1.0.0")
    for world in pair.values():
        a = world.container("conf-a", ports=True)
        world.add(a)
        world.delete(a, ports=False)
    assert pair["pycni"].leftovers(pair["pycni"].containers[0]) == {}
    leaked = pair["go"].leftovers(pair["go"].containers[0])
    assert set(leaked) == {"firewall"}, leaked
    assert all(re.search(r"-j (DNAT|CNI-DN-)", rule) for rule in leaked["firewall"]), leaked
    assert any("--to-destination 198.18.0.2:80" in rule for rule in leaked["firewall"])


def _everything(world: World, but: str) -> dict[str, Any]:
    """The world's state apart from container ``but``'s own namespace (whose ``lo`` the rolled
    back loopback plugin leaves down, as its DEL does)."""
    kernel = world.snapshot()
    del kernel[but]
    return {
        "kernel": kernel,
        "firewall": world.firewall_text(),
        "leases": sorted(p.name for p in (world.root / "ipam").glob("*/*") if p.name[0].isdigit() or ":" in p.name),
        "cache": [(e.container_id, e.ifname) for e in world.runtime.get_cached_attachments()],
    }


def test_a_published_host_port_is_refused_and_nothing_changes(fresh):
    pair = fresh("ipv4-1.0.0")
    ours = pair["pycni"]
    a, b = ours.container("conf-a", ports=True), ours.container("conf-b", ports=True)
    ours.add(a)
    before = _everything(ours, but="conf-b")
    taken = re.escape("host port 8080/tcp is already mapped by another container (confnet conf-a eth0)")
    with pytest.raises(CNIError, match=f'plugin type="portmap" failed \\(add\\): {taken}'):
        ours.add(b, rollback=True)
    assert differences(before, _everything(ours, but="conf-b")) == []
    with probes.TCPEchoServer(a.ns.path, CONTAINER_PORT) as server:
        assert probes.tcp_echo(ours.host.path, a.gateway(4), HOST_PORT)
        assert server.peers

    go = pair["go"]
    ga, gb = go.container("conf-a", ports=True), go.container("conf-b", ports=True)
    go.add(ga)
    go.add(gb)  # accepted: the port is now published twice
    with probes.TCPEchoServer(ga.ns.path, CONTAINER_PORT) as first, probes.TCPEchoServer(gb.ns.path, CONTAINER_PORT):
        assert probes.tcp_echo(go.host.path, ga.gateway(4), HOST_PORT)
        assert first.peers  # the first container keeps the traffic


def test_a_port_mapping_without_protocol(fresh):
    pair = fresh("ipv4-1.0.0")
    no_protocol = {"portMappings": [{"hostPort": HOST_PORT, "containerPort": CONTAINER_PORT}]}
    for world in pair.values():
        c = world.container("conf-a")
        c.rt = attrs.evolve(c.rt, capability_args=no_protocol)
    go, ours = pair["go"], pair["pycni"]
    with pytest.raises(CNIError, match='unable to setup DNAT: .*unknown protocol ""'):
        go.add(go.containers[0])
    a = ours.containers[0]
    ours.add(a)
    with probes.TCPEchoServer(a.ns.path, CONTAINER_PORT):
        assert probes.tcp_echo(ours.host.path, a.gateway(4), HOST_PORT)

"""The firewalld D-Bus client's answers (a fake connection speaking jeepney messages) and the
firewall plugin's firewalld step (records, DEL, CHECK, GC and restore) against a fake bus."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

jeepney = pytest.importorskip("jeepney")

from pycni.errors import CNIError, ErrorCode  # noqa: E402
from pycni.sdk import PluginRequest  # noqa: E402
from pycni_plugins import firewalld_zone  # noqa: E402
from pycni_plugins.kernel import firewalld  # noqa: E402

# -- the client ------------------------------------------------------------------------------


class FakeConn:
    """Answers firewalld's zone methods from ``zones`` as firewalld 1.3 does (errors included)."""

    def __init__(self, zones: dict[str, list[str]] | None = None, on_bus: bool = True) -> None:
        self.zones = zones if zones is not None else {"trusted": [], "public": []}
        self.on_bus = on_bus
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def send_and_get_reply(self, msg: Any, timeout: float | None = None) -> Any:
        from jeepney import new_error, new_method_return

        member = msg.header.fields[jeepney.HeaderFields.member]
        body = tuple(msg.body)
        self.calls.append((member, body))
        if not self.on_bus:
            return new_error(msg, "org.freedesktop.DBus.Error.ServiceUnknown", "s", ("no firewalld",))

        def fail(text: str) -> Any:
            return new_error(msg, "org.fedoraproject.FirewallD1.Exception", "s", (text,))

        if member == "Get":
            return new_method_return(msg, "v", (("s", "RUNNING"),))
        if member == "getDefaultZone":
            return new_method_return(msg, "s", ("public",))
        if member == "getSources":
            return new_method_return(msg, "as", (list(self.zones.get(body[0], [])),))
        if member == "getZoneOfSource":
            zone = next((z for z, s in self.zones.items() if body[0] in s), "")
            return new_method_return(msg, "s", (zone,))
        if member == "addSource":
            zone, source = body
            if zone not in self.zones:
                return fail(f"INVALID_ZONE: {zone}")
            holder = next((z for z, s in self.zones.items() if source in s), None)
            if holder == zone:
                return fail(f"ZONE_ALREADY_SET: '{source}' already bound to '{zone}'")
            if holder is not None:
                return fail(f"ZONE_CONFLICT: '{source}' already bound to a zone")
            self.zones[zone].append(source)
            return new_method_return(msg, "s", (zone,))
        if member == "removeSource":
            zone, source = body
            if zone not in self.zones:
                return fail(f"INVALID_ZONE: {zone}")
            if source not in self.zones.get(zone, []):
                return fail(f"UNKNOWN_SOURCE: '{source}' is not in any zone")
            self.zones[zone].remove(source)
            return new_method_return(msg, "s", (zone,))
        raise AssertionError(member)


def test_adding_twice_is_no_error_and_removing_an_unknown_source_neither() -> None:
    bus = firewalld.Session(FakeConn())
    assert bus.add_source("trusted", "198.18.64.2/32")
    assert not bus.add_source("trusted", "198.18.64.2/32")
    assert bus.sources("trusted") == ["198.18.64.2/32"]
    assert bus.zone_of_source("198.18.64.2/32") == "trusted"
    assert bus.remove_source("trusted", "198.18.64.2/32")
    assert not bus.remove_source("trusted", "198.18.64.2/32")
    assert bus.state() == "RUNNING" and bus.default_zone() == "public"


def test_firewalld_s_errors_carry_their_code() -> None:
    bus = firewalld.Session(FakeConn())
    with pytest.raises(firewalld.FirewalldError) as e:
        bus.add_source("nosuch", "198.18.64.2/32")
    assert (e.value.code, e.value.unavailable) == ("INVALID_ZONE", False)
    bus.add_source("public", "198.18.64.3/32")
    with pytest.raises(firewalld.FirewalldError) as e:
        bus.add_source("trusted", "198.18.64.3/32")
    assert e.value.code == "ZONE_CONFLICT"


def test_no_firewalld_on_the_bus_is_unavailable() -> None:
    with pytest.raises(firewalld.FirewalldError) as e:
        firewalld.Session(FakeConn(on_bus=False)).add_source("trusted", "198.18.64.2/32")
    assert e.value.unavailable


def test_no_bus_is_unavailable(tmp_path: Path) -> None:
    address = f"unix:path={tmp_path}/none"
    with pytest.raises(firewalld.FirewalldError) as e, firewalld.session(address):
        pass
    assert e.value.unavailable and address in e.value.msg
    assert not firewalld.available(address)


def test_the_bus_address() -> None:
    assert firewalld.bus_address({}) == "unix:path=/run/dbus/system_bus_socket"
    assert firewalld.bus_address({"DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/x"}) == "unix:path=/x"
    assert firewalld.source_of(ipaddress.ip_address("198.18.64.2")) == "198.18.64.2/32"
    assert firewalld.source_of(ipaddress.ip_address("fd00::2")) == "fd00::2/128"


# -- the plugin's step -------------------------------------------------------------------------

PREV = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "nomad"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
    "ips": [{"address": "198.18.64.2/20", "interface": 2, "gateway": "198.18.64.1"}],
}


@pytest.fixture
def fake_bus(monkeypatch: pytest.MonkeyPatch) -> FakeConn:
    conn = FakeConn()

    @contextlib.contextmanager
    def session(address: str | None = None) -> Iterator[firewalld.Session]:
        if not conn.on_bus:
            raise firewalld.FirewalldError("cannot connect to the system bus", "unavailable")
        yield firewalld.Session(conn)

    monkeypatch.setattr(firewalld, "session", session)
    return conn


def _request(tmp_path: Path, command: str, cid: str = "c1", **conf: Any) -> PluginRequest:
    config = {"cniVersion": "1.0.0", "name": "nomad", "type": "firewall", "prevResult": PREV, **conf}
    return PluginRequest(command, config, cid, "/run/netns/x", "eth0", state_dir=str(tmp_path / "state"))


def _run(tmp_path: Path, command: str, cid: str = "c1", **conf: Any) -> None:
    req = _request(tmp_path, command, cid, **conf)
    backend, zone = firewalld_zone.options(req)
    prev = firewalld_zone.prev_result(req)
    assert prev is not None
    if command == "ADD":
        firewalld_zone.add(req, prev, backend, zone)
    elif command == "CHECK":
        firewalld_zone.check(req, prev, backend, zone)
    else:
        firewalld_zone.delete(req, backend, zone)


def test_backend_firewalld_adds_records_and_deletes(tmp_path: Path, fake_bus: FakeConn) -> None:
    _run(tmp_path, "ADD", backend="firewalld")
    assert fake_bus.zones["trusted"] == ["198.18.64.2/32"]
    rec = firewalld_zone.record(_request(tmp_path, "ADD"))
    want = {"network": "nomad", "container": "c1", "ifname": "eth0", "zone": "trusted"}
    assert rec == {**want, "sources": ["198.18.64.2/32"]}
    _run(tmp_path, "CHECK", backend="firewalld")
    _run(tmp_path, "DEL", backend="firewalld")
    assert fake_bus.zones["trusted"] == []
    assert firewalld_zone.record(_request(tmp_path, "DEL")) is None
    _run(tmp_path, "DEL", backend="firewalld")  # twice: nothing left to do, no error


def test_the_zone_is_configurable(tmp_path: Path, fake_bus: FakeConn) -> None:
    _run(tmp_path, "ADD", backend="firewalld", firewalldZone="public")
    assert fake_bus.zones == {"trusted": [], "public": ["198.18.64.2/32"]}
    _run(tmp_path, "DEL")  # the record names the zone, whatever DEL's config says
    assert fake_bus.zones["public"] == []


def test_an_unknown_zone_fails_add_and_del_cleans_up(tmp_path: Path, fake_bus: FakeConn) -> None:
    with pytest.raises(CNIError) as e:
        _run(tmp_path, "ADD", backend="firewalld", firewalldZone="nosuch")
    assert e.value.msg.endswith("zone nosuch: INVALID_ZONE: nosuch")
    _run(tmp_path, "DEL", backend="firewalld", firewalldZone="nosuch")
    assert firewalld_zone.record(_request(tmp_path, "DEL")) is None


def test_check_names_the_lost_source(tmp_path: Path, fake_bus: FakeConn) -> None:
    _run(tmp_path, "ADD", backend="firewalld")
    fake_bus.zones["trusted"].clear()  # a firewall-cmd --reload
    with pytest.raises(CNIError) as e:
        _run(tmp_path, "CHECK", backend="firewalld")
    assert e.value.msg == "firewalld zone trusted lacks the source(s) 198.18.64.2/32 of this container"
    assert "run `pycni gc nomad --reconcile` to restore" in e.value.details


def test_backend_firewalld_without_firewalld_fails_add(tmp_path: Path, fake_bus: FakeConn) -> None:
    fake_bus.on_bus = False
    with pytest.raises(CNIError) as e:
        _run(tmp_path, "ADD", backend="firewalld")
    assert e.value.code == ErrorCode.INTERNAL
    assert "zone trusted: cannot connect to the system bus" in e.value.msg
    with pytest.raises(CNIError) as status:
        firewalld_zone.status("firewalld")
    assert status.value.code == ErrorCode.PLUGIN_NOT_AVAILABLE
    firewalld_zone.status("iptables")  # not asked: no error
    _run(tmp_path, "DEL", backend="firewalld")  # DEL is no error without firewalld


def test_other_backends_add_nothing_where_firewalld_does_not_reject(
    tmp_path: Path, fake_bus: FakeConn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(firewalld_zone, "_firewalld_table", lambda: False)  # no table inet firewalld
    _run(tmp_path, "ADD", backend="iptables")
    _run(tmp_path, "ADD")
    assert fake_bus.calls == []
    assert firewalld_zone.record(_request(tmp_path, "ADD")) is None
    _run(tmp_path, "CHECK")
    _run(tmp_path, "DEL")
    assert fake_bus.calls == []


def test_other_backends_add_sources_where_firewalld_rejects_egress(
    tmp_path: Path, fake_bus: FakeConn, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pycni_plugins.kernel import hostfw

    judged: list[Any] = []

    def inspect(target: Any, only: Any = None) -> list[Any]:
        judged.append((target, only))
        where = "table inet firewalld chain filter_FWD_public rule handle 101 (reject)"
        return [hostfw.Finding("egress", where, True, "forwarded traffic from 198.18.64.2/32 on bridge nomad")]

    monkeypatch.setattr(firewalld_zone, "_firewalld_table", lambda: True)
    monkeypatch.setattr(firewalld_zone, "_bus_present", lambda: True)
    monkeypatch.setattr(hostfw, "inspect", inspect)
    _run(tmp_path, "ADD", backend="iptables")
    assert judged == [(hostfw.Target("nomad", (ipaddress.ip_network("198.18.64.2/32"),)), ("egress",))]
    assert fake_bus.zones["trusted"] == ["198.18.64.2/32"]
    _run(tmp_path, "CHECK", backend="iptables")
    _run(tmp_path, "DEL", backend="iptables")
    assert fake_bus.zones["trusted"] == []


def test_gc_removes_dead_attachments_and_restores_valid_ones(tmp_path: Path, fake_bus: FakeConn) -> None:
    _run(tmp_path, "ADD", "alive", backend="firewalld")
    dead = {**PREV, "ips": [{"address": "198.18.64.3/20", "interface": 2}]}
    req = _request(tmp_path, "ADD", "dead", backend="firewalld", prevResult=dead)
    prev = firewalld_zone.prev_result(req)
    assert prev is not None
    firewalld_zone.add(req, prev, "firewalld", "trusted")
    fake_bus.zones["trusted"].remove("198.18.64.2/32")  # lost in a reload
    state = str(tmp_path / "state")
    assert firewalld_zone.gc("nomad", {("alive", "eth0")}, state_dir=state, dry_run=True) == [
        "firewalld zone trusted source 198.18.64.3/32 of dead/eth0"
    ]
    assert fake_bus.zones["trusted"] == ["198.18.64.3/32"]  # a dry run changes nothing
    assert firewalld_zone.gc("other", set(), state_dir=state, dry_run=False) == []  # another network's GC
    assert firewalld_zone.gc("nomad", {("alive", "eth0")}, state_dir=state, dry_run=False) == [
        "firewalld zone trusted source 198.18.64.3/32 of dead/eth0",
        "restored firewalld zone trusted source 198.18.64.2/32 of alive/eth0",
    ]
    assert fake_bus.zones["trusted"] == ["198.18.64.2/32"]
    assert firewalld_zone.restore(state) == []  # nothing lost any more

"""The go-cni style client: loading options, interface naming, parallel setup, Result mapping."""

from __future__ import annotations

import ipaddress
import json

import pytest

from pycni.client import (
    CNI,
    InvalidConfigError,
    LoadError,
    NotInitializedError,
    PortMapping,
    with_all_conf,
    with_args,
    with_capability_port_map,
    with_conf,
    with_conf_list_bytes,
    with_default_conf,
    with_labels,
    with_lo_network,
)
from pycni.errors import PluginError
from pycni.gocni_result import GoCNIResult
from pycni.types import parse_result


def result(version, ips, interfaces=None):
    out = {"cniVersion": version, "ips": ips}
    if interfaces is not None:
        out["interfaces"] = interfaces
    return out


@pytest.fixture
def make(fake_plugins, tmp_path):
    confdir = tmp_path / "net.d"
    confdir.mkdir()

    def make(**kw):
        kw.setdefault("plugin_dirs", [str(fake_plugins.dir)])
        kw.setdefault("conf_dir", str(confdir))
        return CNI(cache_dir=str(tmp_path / "cache"), backend="exec", **kw)

    return make, confdir


def single_conf(fakes, name, type_, **fake):
    return json.dumps(
        fakes.plugin(type_, **fake) | {"name": name, "cniVersion": "0.2.0", "capabilities": {"portMappings": True}}
    )


def test_type020_results_without_interfaces_land_on_the_default_interface(make, fake_plugins):
    factory, confdir = make
    (confdir / "mocknetwork1.conf").write_text(
        single_conf(
            fake_plugins, "plugin1", "fake-a", ADD={"result": {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.1/24"}}}
        )
    )
    (confdir / "mocknetwork2.conf").write_text(
        single_conf(
            fake_plugins, "plugin2", "fake-b", ADD={"result": {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}}}
        )
    )
    cni = factory(min_network_count=2)
    cni.load(with_all_conf)
    cni.status()
    res = cni.setup("c1", "/run/netns/c1", with_capability_port_map([PortMapping(80, 8080)]))
    assert [c.ip for c in res.interfaces["eth0"].ip_configs] == [
        ipaddress.ip_address("10.0.0.1"),
        ipaddress.ip_address("10.0.0.2"),
    ]
    ifnames = sorted(c["env"]["CNI_IFNAME"] for c in fake_plugins.calls())
    assert ifnames == ["eth0", "eth1"]
    stdin = fake_plugins.calls()[0]["stdin"]
    assert stdin["runtimeConfig"] == {"portMappings": [{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}]}
    cni.remove("c1", "/run/netns/c1")
    config = cni.get_config()
    assert (config.prefix, config.plugin_dirs[0], config.networks[0].config.name, config.networks[0].ifname) == (
        "eth",
        str(fake_plugins.dir),
        "plugin1",
        "eth0",
    )


def test_type100_ips_land_on_the_interface_their_index_names(make, fake_plugins):
    factory, _ = make
    res100 = result(
        "1.0.0",
        [
            {"address": "10.0.0.1/24", "gateway": "10.0.0.255", "interface": 0},
            {"address": "10.0.0.2/24", "interface": 1},
        ],
        [{"name": "eth0", "sandbox": "/x"}, {"name": "eth1", "sandbox": "/x"}],
    )
    cni = factory()
    cni.load(
        with_conf_list_bytes(
            fake_plugins.conflist(fake_plugins.plugin("fake-a", ADD={"result": res100}), version="1.0.0")
        )
    )
    res = cni.setup("c1", "/x")
    assert [str(c.ip) for c in res.interfaces["eth0"].ip_configs] == ["10.0.0.1"]
    assert str(res.interfaces["eth0"].ip_configs[0].gateway) == "10.0.0.255"
    assert [str(c.ip) for c in res.interfaces["eth1"].ip_configs] == ["10.0.0.2"]
    cni.check("c1", "/x")
    cni.remove("c1", "/x")


def test_lo_network_then_default_conf_names_lo_and_eth0(make, fake_plugins):
    factory, confdir = make
    (confdir / "10.conflist").write_bytes(fake_plugins.conflist(fake_plugins.plugin("fake-a"), name="containerd-net"))
    cni = factory(min_network_count=2, plugin_dirs=[str(fake_plugins.dir), "/nonexistent"])
    (fake_plugins.dir / "loopback").symlink_to(fake_plugins.dir / "fake-a")
    cni.load(with_lo_network, with_default_conf)
    assert [(n.config.name, n.ifname) for n in cni.networks()] == [("cni-loopback", "lo"), ("containerd-net", "eth0")]
    cni.status()


def test_conf_list_bytes_after_lo_is_eth1(make, fake_plugins):
    factory, _ = make
    cni = factory()
    cni.load(with_lo_network, with_conf_list_bytes(fake_plugins.conflist(fake_plugins.plugin("fake-a"))))
    assert [n.ifname for n in cni.networks()] == ["lo", "eth1"]


def test_interface_prefix(make, fake_plugins):
    factory, _ = make
    cni = factory(interface_prefix="net")
    cni.load(with_conf(json.dumps(fake_plugins.plugin("fake-a") | {"name": "n", "cniVersion": "1.0.0"}).encode()))
    res = cni.setup("c1", "/x")
    assert "net0" in res.interfaces


def test_not_initialized_until_enough_networks(make, fake_plugins):
    factory, _ = make
    cni = factory(min_network_count=2)
    with pytest.raises(NotInitializedError, match="cni plugin not initialized"):
        cni.status()
    cni.load(with_conf_list_bytes(fake_plugins.conflist(fake_plugins.plugin("fake-a"))))
    with pytest.raises(NotInitializedError):
        cni.setup("c", "/x")


def test_load_errors_are_wrapped(make):
    factory, confdir = make
    cni = factory()
    with pytest.raises(LoadError, match="failed to load cni config") as e:
        cni.load(with_default_conf)
    assert isinstance(e.value.__cause__, NotInitializedError)
    (confdir / "bad.conf").write_text('{"name":"x"}')
    with pytest.raises(LoadError) as e:
        cni.load(with_default_conf)
    assert isinstance(e.value.__cause__, InvalidConfigError)


def test_setup_first_error_fails_the_whole_setup(make, fake_plugins):
    factory, _ = make
    cni = factory()
    ok = fake_plugins.conflist(fake_plugins.plugin("fake-a"), name="ok")
    bad = fake_plugins.conflist(fake_plugins.plugin("fake-b", ADD={"error": {"code": 7, "msg": "no"}}), name="bad")
    cni.load(with_conf_list_bytes(ok), with_conf_list_bytes(bad))
    with pytest.raises(PluginError, match="no"):
        cni.setup("c1", "/x")
    with pytest.raises(PluginError):
        cni.setup_serially("c2", "/x")


def test_labels_and_args_become_cni_args(make, fake_plugins):
    factory, _ = make
    cni = factory()
    cni.load(with_conf_list_bytes(fake_plugins.conflist(fake_plugins.plugin("fake-a"))))
    cni.setup("c1", "/x", with_labels({"A": "1", "B": "2"}), with_args("B", "3"))
    assert fake_plugins.calls()[0]["env"]["CNI_ARGS"] == "A=1;B=3"


def test_remove_tolerates_not_found(make, fake_plugins):
    factory, _ = make
    cni = factory()
    gone = fake_plugins.plugin("fake-a", DEL={"error": {"code": 3, "msg": "container not found"}})
    cni.load(with_conf_list_bytes(fake_plugins.conflist(gone)))
    cni.remove("c1", "/x")
    hard = fake_plugins.plugin("fake-a", DEL={"error": {"code": 11, "msg": "busy"}})
    cni.load(with_conf_list_bytes(fake_plugins.conflist(hard)))
    with pytest.raises(PluginError, match="busy"):
        cni.remove("c1", "/x")


class TestResultMapping:
    def test_default_interface_always_present_and_dns_per_network(self):
        res = GoCNIResult.from_results([parse_result(result("1.0.0", []))], default_ifname="eth0")
        assert set(res.interfaces) == {"eth0"} and len(res.dns) == 1

    def test_later_interface_of_the_same_name_replaces_earlier(self):
        a = parse_result(result("1.0.0", [{"address": "10.0.0.1/24", "interface": 0}], [{"name": "eth0"}]))
        b = parse_result(result("1.0.0", [], [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff"}]))
        res = GoCNIResult.from_results([a, b])
        assert res.interfaces["eth0"].ip_configs == () and res.interfaces["eth0"].mac == "aa:bb:cc:dd:ee:ff"

    @pytest.mark.parametrize("index", [1, 2, -1])
    def test_out_of_range_interface_index_is_invalid(self, index):
        bad = parse_result(result("1.0.0", [{"address": "10.0.0.1/24", "interface": index}], [{"name": "eth0"}]))
        with pytest.raises(Exception, match="invalid interface config"):
            GoCNIResult.from_results([bad])

    def test_go_json_shape(self):
        a = parse_result(
            result(
                "1.0.0",
                [{"address": "10.0.0.1/24", "gateway": "10.0.0.254", "interface": 0}],
                [{"name": "eth0", "sandbox": "/x"}],
            )
        )
        out = GoCNIResult.from_results([a]).to_go_json()
        assert out["Interfaces"]["eth0"]["IPConfigs"] == [{"IP": "10.0.0.1", "Gateway": "10.0.0.254"}]
        assert out["Interfaces"]["eth0"]["Sandbox"] == "/x"

"""Runtime semantics (libcni api.go) against scriptable fake plugins, and pycni's extras."""

from __future__ import annotations

import os
import threading
import time

import pytest

from pycni.cache import CachedAttachment
from pycni.config import conflist_from_bytes
from pycni.errors import (
    CacheError,
    CNIError,
    ErrorCode,
    InvalidArgumentError,
    MultiError,
    PluginError,
    PluginNotFoundError,
    PluginTimeoutError,
    VersionError,
)
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.sdk import GCAttachment, GCReport, Plugin, delegate
from tests.helpers import crashing
from tests.helpers.fake import alive

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another uid's files needs root")
RT = RuntimeConf(container_id="ctr1", netns="/run/netns/ctr1", ifname="eth0", args=[("K", "V")])


@pytest.fixture
def runtime(fake_plugins, tmp_path):
    return Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="exec")


def net(fakes, *plugins, **kw):
    return conflist_from_bytes(fakes.conflist(*plugins, **kw))


def stdin_of(calls, command, type_=None):
    return [c["stdin"] for c in calls if c["env"]["CNI_COMMAND"] == command and (type_ is None or c["type"] == type_)]


class TestAdd:
    def test_a_plugin_type_with_a_path_loads_but_never_reaches_exec(self, runtime, fake_plugins, tmp_path):
        escape = os.path.relpath(fake_plugins.dir / "fake-a", fake_plugins.dir / "x")
        n = conflist_from_bytes(fake_plugins.conflist(fake_plugins.plugin("fake-a") | {"type": escape}))
        assert n.plugins[0].type == escape
        with pytest.raises(PluginNotFoundError, match="invalid plugin name"):
            runtime.add_network_list(n, RT)
        with pytest.raises(MultiError, match="invalid plugin name"):
            runtime.validate_network_list(n)
        assert fake_plugins.calls() == []

    def test_plugins_run_in_order_each_getting_the_previous_result(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b", ADD={"echo_prev": True}))
        result = runtime.add_network_list(n, RT)
        calls = fake_plugins.calls()
        assert [c["type"] for c in calls] == ["fake-a", "fake-b"]
        assert "prevResult" not in calls[0]["stdin"]
        assert calls[1]["stdin"]["prevResult"] == result.to_json()
        assert all(c["stdin"]["name"] == "testnet" and c["stdin"]["cniVersion"] == "1.1.0" for c in calls)

    def test_runtime_config_from_capability_args(self, runtime, fake_plugins):
        plugin = fake_plugins.plugin("fake-a") | {"capabilities": {"portMappings": True}}
        rt = RuntimeConf("ctr1", "/run/netns/x", capability_args={"portMappings": [{"hostPort": 1}], "dns": {}})
        runtime.add_network_list(net(fake_plugins, plugin), rt)
        assert fake_plugins.calls()[0]["stdin"]["runtimeConfig"] == {"portMappings": [{"hostPort": 1}]}

    def test_stops_at_first_error_wrapped_with_plugin_type_and_writes_no_cache(self, runtime, fake_plugins):
        n = net(
            fake_plugins,
            fake_plugins.plugin("fake-a"),
            fake_plugins.plugin("fake-b", ADD={"error": {"code": 11, "msg": "later"}}) | {"name": "second"},
            fake_plugins.plugin("fake-c"),
        )
        with pytest.raises(PluginError) as e:
            runtime.add_network_list(n, RT)
        assert str(e.value) == 'plugin type="fake-b" name="second" failed (add): later'
        assert e.value.code == 11
        assert [c["type"] for c in fake_plugins.calls()] == ["fake-a", "fake-b"]
        assert runtime.cache.read("testnet", "ctr1", "eth0") is None

    def test_missing_plugin_is_reported_before_validation(self, runtime, fake_plugins):
        n = net(fake_plugins, {"type": "absent"})
        with pytest.raises(PluginNotFoundError, match='failed to find plugin "absent"'):
            runtime.add_network_list(n, RuntimeConf(container_id="bad/id"))

    @pytest.mark.parametrize(
        "rt, message",
        [
            (RuntimeConf(container_id=""), "missing containerID"),
            (RuntimeConf(container_id="-bad"), "invalid characters in containerID"),
            (RuntimeConf(container_id="ok", ifname="toolonginterface0"), "interface name is too long"),
            (RuntimeConf(container_id="ok", ifname="é" * 9), "interface name is too long"),
            # testnet-<id>-eth0 longer than a file name: the cache write would fail after the plugins ran
            (RuntimeConf(container_id="c" * 243), "containerID is too long"),
            (RuntimeConf(container_id="c" * 4100), "containerID is too long"),
            (RuntimeConf(container_id="c" * 5000), "containerID is too long"),
        ],
    )
    def test_validation_before_any_exec(self, runtime, fake_plugins, rt, message):
        with pytest.raises(InvalidArgumentError, match=message) as info:
            runtime.add_network_list(net(fake_plugins, fake_plugins.plugin("fake-a")), rt)
        assert fake_plugins.calls() == []
        assert info.value.code == (3 if not rt.container_id else 4)

    def test_the_longest_id_whose_cache_file_fits_works(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        rt = RuntimeConf(container_id="c" * 242)  # len("testnet-" + id + "-eth0") == 255
        runtime.add_network_list(n, rt)
        assert runtime.cache.read("testnet", rt.container_id, "eth0") is not None
        runtime.delete_network_list(n, rt)

    def test_network_name_validated(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), name="bad name")
        with pytest.raises(CNIError, match="invalid characters found in network name"):
            runtime.add_network_list(n, RT)

    def test_result_is_returned_unconverted_and_empty_version_fixed_up(self, runtime, fake_plugins):
        old = {"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "198.18.0.9/24"}]}
        r = runtime.add_network_list(net(fake_plugins, fake_plugins.plugin("fake-a", ADD={"result": old})), RT)
        assert r.cni_version == "0.3.1"
        unversioned = {"ips": [{"address": "198.18.0.9/24"}]}
        r = runtime.add_network_list(net(fake_plugins, fake_plugins.plugin("fake-a", ADD={"result": unversioned})), RT)
        assert r.cni_version == "1.1.0"

    def test_cache_written_after_success(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        result = runtime.add_network_list(n, RT)
        entry = runtime.cache.read("testnet", "ctr1", "eth0")
        assert entry.result == result.to_json() and entry.config == n.bytes
        assert entry.netns == RT.netns and entry.cni_args == (("K", "V"),)

    def test_unusable_cache_is_reported_before_any_plugin_runs(self, runtime, fake_plugins, tmp_path):
        os.makedirs(tmp_path / "cache")
        (tmp_path / "cache" / "results").write_text("blocked")
        with pytest.raises(CacheError, match="cannot use cache dir"):
            runtime.add_network_list(net(fake_plugins, fake_plugins.plugin("fake-a")), RT)
        assert fake_plugins.calls() == []

    def test_failed_cache_write_rolls_every_plugin_back(self, runtime, fake_plugins, monkeypatch):
        def broken(entry):
            raise CacheError("disk full")

        monkeypatch.setattr(runtime.cache, "write", broken)
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b"))
        with pytest.raises(CacheError, match='failed to set network "testnet" cached result: disk full'):
            runtime.add_network_list(n, RT)
        order = [(c["type"], c["env"]["CNI_COMMAND"]) for c in fake_plugins.calls()]
        assert order == [("fake-a", "ADD"), ("fake-b", "ADD"), ("fake-b", "DEL"), ("fake-a", "DEL")]

    def test_rollback_deletes_what_ran_in_reverse(self, runtime, fake_plugins):
        n = net(
            fake_plugins,
            fake_plugins.plugin("fake-a"),
            fake_plugins.plugin("fake-b"),
            fake_plugins.plugin("fake-c", ADD={"error": {"code": 5, "msg": "nope"}}),
        )
        with pytest.raises(PluginError, match="nope"):
            runtime.add_network_list(n, RT, rollback=True)
        order = [(c["type"], c["env"]["CNI_COMMAND"]) for c in fake_plugins.calls()]
        assert order == [
            ("fake-a", "ADD"),
            ("fake-b", "ADD"),
            ("fake-c", "ADD"),
            ("fake-c", "DEL"),
            ("fake-b", "DEL"),
            ("fake-a", "DEL"),
        ]

    def test_a_failed_rollback_is_reported_on_the_add_error(self, runtime, fake_plugins):
        n = net(
            fake_plugins,
            fake_plugins.plugin("fake-a", DEL={"error": {"code": 11, "msg": "stuck"}}),
            fake_plugins.plugin("fake-b", ADD={"error": {"code": 5, "msg": "nope"}}),
        )
        with pytest.raises(PluginError, match="nope") as e:
            runtime.add_network_list(n, RT, rollback=True)
        assert [f.msg for f in e.value.rollback_errors] == ["stuck"]
        assert PluginError("clean").rollback_errors == ()

    def test_a_host_netns_that_cannot_be_entered_is_a_cni_error(self, fake_plugins, tmp_path):
        runtime = Runtime(
            [str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="exec", host_netns=str(tmp_path / "no")
        )
        with pytest.raises(CNIError, match="cannot enter network namespace|failed to open netns") as e:
            runtime.add_network_list(net(fake_plugins, fake_plugins.plugin("fake-a")), RT)
        assert e.value.code == ErrorCode.INTERNAL
        assert fake_plugins.calls() == []

    def test_an_attachment_cached_in_another_netns_is_refused_before_any_plugin_and_not_rolled_back(
        self, runtime, fake_plugins
    ):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b"))
        runtime.add_network_list(n, RT)
        cached = runtime.get_network_list_cached_result(n, RT)
        before = len(fake_plugins.calls())
        elsewhere = RuntimeConf(container_id="ctr1", netns="/run/netns/other", ifname="eth0")
        with pytest.raises(InvalidArgumentError) as info:
            runtime.add_network_list(n, elsewhere, rollback=True)
        assert info.value.code == 4
        assert str(info.value) == (
            'CNI_CONTAINERID "ctr1" with CNI_IFNAME "eth0" is already attached to network "testnet" in netns '
            '"/run/netns/ctr1", not CNI_NETNS "/run/netns/other": DEL it first'
        )
        assert len(fake_plugins.calls()) == before
        assert runtime.get_network_list_cached_result(n, RT) == cached
        # Another ifname of the container is another attachment.
        runtime.add_network_list(n, RuntimeConf(container_id="ctr1", netns="/run/netns/other", ifname="eth1"))

    def test_a_repeated_add_into_the_same_netns_reaches_the_plugins(self, runtime, fake_plugins, tmp_path):
        """The same path, or another path of the same file (a second bind mount of the netns)."""
        ns = tmp_path / "ns"
        ns.touch()
        (tmp_path / "alias").hardlink_to(ns)
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        runtime.add_network_list(n, RuntimeConf(container_id="ctr1", netns=str(ns), ifname="eth0"))
        for path in (ns, tmp_path / "alias"):
            runtime.add_network_list(n, RuntimeConf(container_id="ctr1", netns=str(path), ifname="eth0"))
        assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()] == ["ADD"] * 3


class TestDel:
    def test_reverse_order_with_cached_result_converted_to_list_version(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b"), version="0.4.0")
        result = runtime.add_network_list(n, RT)
        runtime.delete_network_list(n, RT)
        dels = [c for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
        assert [c["type"] for c in dels] == ["fake-b", "fake-a"]
        assert all(c["stdin"]["prevResult"] == result.to_json() for c in dels)
        assert runtime.cache.read("testnet", "ctr1", "eth0") is None

    def test_old_versions_get_no_prev_result(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), version="0.3.1")
        runtime.add_network_list(n, RT)
        runtime.delete_network_list(n, RT)
        assert "prevResult" not in stdin_of(fake_plugins.calls(), "DEL")[0]

    def test_corrupt_cache_is_removed_and_del_proceeds(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        runtime.add_network_list(n, RT)
        with open(runtime.cache.path("testnet", "ctr1", "eth0"), "w") as f:
            f.write("")
        runtime.delete_network_list(n, RT)
        assert "prevResult" not in stdin_of(fake_plugins.calls(), "DEL")[0]
        assert not os.path.exists(runtime.cache.path("testnet", "ctr1", "eth0"))

    def test_plugin_failure_keeps_the_cache_for_a_retry(self, runtime, fake_plugins):
        failing = net(fake_plugins, fake_plugins.plugin("fake-a", DEL={"error": {"code": 11, "msg": "busy"}}))
        runtime.add_network_list(failing, RT)
        with pytest.raises(PluginError, match=r'plugin type="fake-a" failed \(delete\): busy'):
            runtime.delete_network_list(failing, RT)
        assert runtime.cache.read("testnet", "ctr1", "eth0") is not None

    def test_repeated_del_succeeds(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        runtime.delete_network_list(n, RT)
        runtime.add_network_list(n, RT)
        runtime.delete_network_list(n, RT)
        runtime.delete_network_list(n, RT)

    def test_best_effort_runs_every_plugin_and_reports_all(self, runtime, fake_plugins):
        n = net(
            fake_plugins,
            fake_plugins.plugin("fake-a", DEL={"error": {"code": 1, "msg": "a broke"}}),
            fake_plugins.plugin("fake-b"),
            fake_plugins.plugin("fake-c", DEL={"error": {"code": 2, "msg": "c broke"}}),
        )
        with pytest.raises(MultiError) as e:
            runtime.delete_network_list(n, RT, best_effort=True)
        assert [err.msg for err in e.value.errors] == ["c broke", "a broke"]
        assert [c["type"] for c in fake_plugins.calls()] == ["fake-c", "fake-b", "fake-a"]

    def test_list_version_parse_error_stops_before_any_plugin(self, runtime, fake_plugins):
        with pytest.raises(VersionError):
            runtime.delete_network_list(net(fake_plugins, fake_plugins.plugin("fake-a"), version="x.y"), RT)
        assert fake_plugins.calls() == []


class TestCheck:
    def test_refused_below_0_4_0_even_with_disable_check(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), version="0.3.1", disableCheck=True)
        with pytest.raises(VersionError, match='configuration version "0.3.1" does not support the CHECK command'):
            runtime.check_network_list(n, RT)

    def test_disable_check_runs_nothing(self, runtime, fake_plugins):
        runtime.check_network_list(net(fake_plugins, fake_plugins.plugin("fake-a"), disableCheck="true"), RT)
        assert fake_plugins.calls() == []

    def test_forward_order_with_cached_result(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b"))
        result = runtime.add_network_list(n, RT)
        runtime.check_network_list(n, RT)
        checks = [c for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "CHECK"]
        assert [c["type"] for c in checks] == ["fake-a", "fake-b"]
        assert all(c["stdin"]["prevResult"] == result.to_json() for c in checks)

    def test_missing_cache_runs_without_prev_result(self, runtime, fake_plugins):
        runtime.check_network_list(net(fake_plugins, fake_plugins.plugin("fake-a")), RT)
        assert "prevResult" not in stdin_of(fake_plugins.calls(), "CHECK")[0]

    def test_corrupt_cache_is_an_error(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        runtime.add_network_list(n, RT)
        with open(runtime.cache.path("testnet", "ctr1", "eth0"), "w") as f:
            f.write("{")
        with pytest.raises(CacheError, match='failed to get network "testnet" cached result'):
            runtime.check_network_list(n, RT)

    def test_plugin_error_is_unwrapped_with_its_code(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a", CHECK={"error": {"code": 123, "msg": "drifted"}}))
        with pytest.raises(PluginError) as e:
            runtime.check_network_list(n, RT)
        assert (e.value.code, str(e.value)) == (123, "drifted")


class TestGC:
    def test_disable_gc_is_a_no_op(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), disableGC=True)
        runtime.add_network_list(n, RT)
        runtime.gc_network_list(n, [])
        assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()] == ["ADD"]

    def test_stale_attachments_deleted_with_cached_parameters_valid_ones_kept(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        other = net(fake_plugins, fake_plugins.plugin("fake-b"), name="othernet")
        runtime.add_network_list(n, RT)
        runtime.add_network_list(n, RuntimeConf("keep", "/run/netns/keep", args=[("X", "1")]))
        runtime.add_network_list(other, RuntimeConf("elsewhere", "/run/netns/e"))
        runtime.gc_network_list(n, [GCAttachment("keep", "eth0")])
        dels = [c for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
        assert [(c["env"]["CNI_CONTAINERID"], c["env"]["CNI_NETNS"], c["env"]["CNI_ARGS"]) for c in dels] == [
            ("ctr1", "/run/netns/ctr1", "K=V")
        ]
        gcs = [c for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "GC"]
        assert len(gcs) == 1
        assert gcs[0]["stdin"]["cni.dev/valid-attachments"] == [{"containerID": "keep", "ifname": "eth0"}]
        assert gcs[0]["stdin"]["cni.dev/attachments"] == [{"containerID": "keep", "ifname": "eth0"}]
        assert all(gcs[0]["env"][k] == "" for k in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS"))
        assert sorted(a.container_id for a in runtime.get_cached_attachments()) == ["elsewhere", "keep"]

    @staticmethod
    def _plant_ghost(results, uid):
        ghost = CachedAttachment(
            container_id="ghost", network="testnet", ifname="eth0", config=b"{}", netns="/run/netns/victim"
        )
        path = results / "testnet-ghost-eth0"
        path.write_bytes(ghost.to_bytes())
        os.chown(path, uid, uid)

    @needs_root
    def test_gc_refuses_a_cache_dir_another_uid_made_and_acts_on_none_of_its_entries(
        self, runtime, fake_plugins, tmp_path
    ):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        results = tmp_path / "cache" / "results"
        results.mkdir(parents=True)
        for d in (results.parent, results):  # as 'nobody' would leave them
            os.chown(d, NOBODY, NOBODY)
            os.chmod(d, 0o777)
        self._plant_ghost(results, NOBODY)
        with pytest.raises(CacheError, match="refusing cache dir .*results: .*must be private to uid") as info:
            runtime.gc_network_list(n, [GCAttachment("victim", "eth0")])
        assert info.value.code == 5
        assert fake_plugins.calls() == []
        with pytest.raises(CacheError, match="refusing cache dir"):
            runtime.add_network_list(n, RT)
        assert fake_plugins.calls() == []

    @needs_root
    def test_gc_never_acts_on_a_cache_entry_another_uid_owns(self, runtime, fake_plugins, tmp_path):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        runtime.add_network_list(n, RuntimeConf("victim", "/run/netns/victim"))
        self._plant_ghost(tmp_path / "cache" / "results", NOBODY)
        runtime.gc_network_list(n, [GCAttachment("victim", "eth0")])
        assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()] == ["ADD", "GC"]
        with pytest.raises(CacheError, match="not owned by uid"):
            runtime.cache.read("testnet", "ghost", "eth0")

    def test_a_cache_dir_others_can_access_is_refused_before_any_plugin_runs(self, runtime, fake_plugins, tmp_path):
        (tmp_path / "cache" / "results").mkdir(parents=True, mode=0o755)
        os.chmod(tmp_path / "cache" / "results", 0o755)
        with pytest.raises(CacheError, match="mode 0755"):
            runtime.add_network_list(net(fake_plugins, fake_plugins.plugin("fake-a")), RT)
        assert fake_plugins.calls() == []

    def test_plugin_gc_only_from_1_1_0_but_stale_dels_always(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), version="0.4.0")
        runtime.add_network_list(n, RT)
        runtime.gc_network_list(n, None)
        assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()] == ["ADD", "DEL"]

    def test_errors_are_collected_and_every_plugin_still_called(self, runtime, fake_plugins):
        n = net(
            fake_plugins,
            fake_plugins.plugin("fake-a", GC={"error": {"code": 1, "msg": "a"}}),
            fake_plugins.plugin("fake-b", GC={"error": {"code": 2, "msg": "b"}}),
        )
        with pytest.raises(MultiError) as e:
            runtime.gc_network_list(n, [])
        assert [str(x) for x in e.value.errors] == ["failed to GC plugin fake-a: a", "failed to GC plugin fake-b: b"]


class TestStatus:
    def test_no_op_below_1_1_0(self, runtime, fake_plugins):
        runtime.get_status_network_list(net(fake_plugins, fake_plugins.plugin("fake-a"), version="1.0.0"))
        assert fake_plugins.calls() == []

    def test_stops_at_first_error_keeping_code_50(self, runtime, fake_plugins):
        n = net(
            fake_plugins,
            fake_plugins.plugin("fake-a", STATUS={"error": {"code": 50, "msg": "not ready"}}),
            fake_plugins.plugin("fake-b"),
        )
        with pytest.raises(PluginError) as e:
            runtime.get_status_network_list(n)
        assert e.value.code == 50 and str(e.value) == "not ready"
        assert [c["type"] for c in fake_plugins.calls()] == ["fake-a"]


class TestTimeouts:
    def test_hung_plugin_times_out_and_is_really_gone(self, fake_plugins, tmp_path):
        runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "c"), backend="exec", timeout=0.5)
        with pytest.raises(PluginTimeoutError, match="timed out"):
            runtime.add_network_list(net(fake_plugins, fake_plugins.plugin("fake-a", ADD={"sleep": 60})), RT)
        assert fake_plugins.pids() and not any(alive(p) for p in fake_plugins.pids())


class TestValidate:
    def test_collects_every_problem(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), {"type": "absent"}, version="0.2.0")
        with pytest.raises(MultiError) as e:
            runtime.validate_network_list(n)
        assert len(e.value.errors) == 2
        assert "does not support config version" in str(e.value.errors[0])

    def test_returns_capabilities(self, runtime, fake_plugins):
        plugin = fake_plugins.plugin("fake-a") | {"capabilities": {"portMappings": True, "x": False}}
        assert runtime.validate_network_list(net(fake_plugins, plugin)) == ["portMappings"]


class TestCachedAccessors:
    def test_cached_config_restores_args_and_capabilities(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        rt = RuntimeConf("ctr1", "/run/netns/x", args=[("A", "1")], capability_args={"portMappings": [1]})
        runtime.add_network_list(n, rt)
        data, new_rt = runtime.get_network_list_cached_config(n, RuntimeConf("ctr1", "/other"))
        assert data == n.bytes and new_rt.args == (("A", "1"),) and new_rt.capability_args == {"portMappings": [1]}
        assert new_rt.netns == "/other"

    def test_cached_result_converted_to_list_version(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), version="0.4.0")
        runtime.add_network_list(n, RT)
        assert runtime.get_network_list_cached_result(n, RT).cni_version == "0.4.0"

    def test_cached_result_version_is_read_with_gos_struct_rule_as_libcni_decodes_it(
        self, runtime, fake_plugins, tmp_path
    ):
        # libcni's DecodeVersion unmarshals into a struct: "CNIVersion" is the version.
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), version="1.0.0")
        runtime.cache.write(
            CachedAttachment("ctr1", n.name, "eth0", result={"CNIVersion": "0.2.0", "ip4": {"ip": "198.18.0.2/24"}})
        )
        result = runtime.get_network_list_cached_result(n, RT)
        assert [str(ip.address) for ip in result.ips] == ["198.18.0.2/24"]

    def test_cached_result_without_a_version_is_0_1_0_as_in_libcni(self, runtime, fake_plugins):
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), version="1.0.0")
        runtime.cache.write(CachedAttachment("ctr1", n.name, "eth0", result={"ip4": {"ip": "198.18.0.2/24"}}))
        assert [str(ip.address) for ip in runtime.get_network_list_cached_result(n, RT).ips] == ["198.18.0.2/24"]


class Recorder(Plugin):
    type = "fake-a"

    def __init__(self):
        self.seen = []

    def add(self, request):
        self.seen.append((request.command, dict(request.config), request.env()))
        return {"cniVersion": request.cni_version, "ips": [{"address": "198.18.0.2/24"}]}

    def delete(self, request):
        self.seen.append((request.command, dict(request.config), request.env()))


class TestBackends:
    def test_inprocess_sees_the_same_request_as_exec(self, fake_plugins, tmp_path, monkeypatch):
        recorder = Recorder()
        monkeypatch.setattr("pycni.backends.builtin_plugin", lambda t: recorder if t == "fake-a" else None)
        n = net(fake_plugins, fake_plugins.plugin("fake-a") | {"capabilities": {"portMappings": True}})
        rt = RuntimeConf("ctr1", "/run/netns/x", capability_args={"portMappings": [{"hostPort": 80}]})
        Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "a"), backend="exec").add_network_list(n, rt)
        Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "b"), backend="inprocess").add_network_list(n, rt)
        exec_call = fake_plugins.calls()[0]
        assert recorder.seen[0][1] == exec_call["stdin"]
        assert recorder.seen[0][2] == {k: exec_call["env"][k] for k in recorder.seen[0][2]}

    def test_an_exec_d_plugin_gets_the_runtime_s_explicit_state_dir_in_its_env(
        self, fake_plugins, tmp_path, monkeypatch
    ):
        monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "from-env"))
        n = net(fake_plugins, fake_plugins.plugin("fake-a"))
        explicit = str(tmp_path / "explicit")
        runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "c"), state_dir=explicit, backend="exec")
        runtime.add_network_list(n, RT)
        runtime.delete_network_list(n, RT)
        Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "d"), backend="exec").add_network_list(n, RT)
        seen = [c["env"]["PYCNI_STATE_DIR"] for c in fake_plugins.calls()]
        assert seen == [explicit, explicit, str(tmp_path / "from-env")]

    def test_auto_prefers_builtin_else_exec(self, fake_plugins, tmp_path, monkeypatch):
        recorder = Recorder()
        monkeypatch.setattr("pycni.backends.builtin_plugin", lambda t: recorder if t == "fake-a" else None)
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b"))
        Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "c"), backend="auto").add_network_list(n, RT)
        assert [s[0] for s in recorder.seen] == ["ADD"]
        assert [c["type"] for c in fake_plugins.calls()] == ["fake-b"]

    def test_inprocess_refuses_unknown_types(self, fake_plugins, tmp_path):
        runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "c"), backend="inprocess")
        with pytest.raises(PluginNotFoundError, match="not built in"):
            runtime.add_network_list(net(fake_plugins, {"type": "nothing-like-this"}), RT)

    @pytest.mark.parametrize("backend", ["inprocess", "exec"])
    def test_a_crashing_plugin_fails_with_the_same_error_999_in_process_and_execd(
        self, backend, fake_plugins, tmp_path, monkeypatch
    ):
        env = crashing.register(tmp_path / "crashing")
        monkeypatch.setattr("pycni.backends.builtin_plugin", lambda t: crashing.CrashingPlugin())
        monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
        monkeypatch.setenv("PYCNI_DAEMON", "off")  # the shim runs the exec'd skel itself
        runtime = Runtime([str(tmp_path / "crashing" / "bin")], cache_dir=str(tmp_path / "c"), backend=backend)
        with pytest.raises(PluginError) as e:
            runtime.add_network_list(net(fake_plugins, {"type": crashing.TYPE}), RT)
        context = 'plugin type="crashing" failed (add): '
        assert e.value.to_json() == {**crashing.ERROR, "msg": context + crashing.ERROR["msg"]}

    @pytest.mark.parametrize("step", ["validate", "add", "delegate"])
    def test_a_crash_in_any_step_of_an_inprocess_plugin_is_error_999(self, step, fake_plugins, tmp_path, monkeypatch):
        class CrashyIpam(Plugin):
            def add(self, request):
                raise KeyError("oops")

        class Crashy(CrashyIpam):
            def validate(self, request):
                if step == "validate":
                    raise KeyError("oops")

            def add(self, request):
                return delegate(request, "crashy-ipam") if step == "delegate" else super().add(request)

        monkeypatch.setattr("pycni.backends.builtin_plugin", lambda t: Crashy())
        monkeypatch.setattr("pycni.sdk.plugin.builtin_plugin", lambda t: CrashyIpam())
        runtime = Runtime([], cache_dir=str(tmp_path / "c"), backend="inprocess")
        with pytest.raises(PluginError) as e:
            runtime.add_network_list(net(fake_plugins, {"type": "x"}), RT)
        assert (e.value.code, e.value.msg, e.value.details) == (999, "'oops'", "")

    def test_backend_from_environment(self, monkeypatch, tmp_path):
        monkeypatch.setenv("PYCNI_BACKEND", "exec")
        assert Runtime([], cache_dir=str(tmp_path)).backend.name == "exec"
        with pytest.raises(InvalidArgumentError):
            Runtime([], cache_dir=str(tmp_path), backend="warp")


class TestLocking:
    def test_operations_on_one_container_serialise_across_threads(self, runtime, fake_plugins):
        slow = net(fake_plugins, fake_plugins.plugin("fake-a", ADD={"sleep": 0.4}))
        fast = net(fake_plugins, fake_plugins.plugin("fake-b"), name="net2")
        done: dict[str, float] = {}
        start = time.monotonic()

        def run(n, rt, key):
            runtime.add_network_list(n, rt)
            done[key] = time.monotonic() - start

        t1 = threading.Thread(target=run, args=(slow, RT, "slow"))
        t1.start()
        time.sleep(0.1)
        t2 = threading.Thread(target=run, args=(fast, RT, "same"))
        t3 = threading.Thread(target=run, args=(fast, RuntimeConf("other"), "other"))
        t2.start()
        t3.start()
        for t in (t1, t2, t3):
            t.join(10)
        assert done["other"] < done["slow"] <= done["same"]


class Collector(Plugin):
    type = "fake-a"

    def __init__(self):
        self.gc_calls = []

    def add(self, request):
        return {"cniVersion": request.cni_version, "ips": [{"address": "198.18.0.2/24"}]}

    def gc(self, request):
        self.gc_calls.append(dict(request.config))
        dry = request.config.get("pycni.dev/dry-run", False)
        return GCReport(("lease 198.18.0.9 of ghost/eth0" + (" (would)" if dry else ""),))


class TestReconcile:
    @pytest.fixture
    def setup(self, fake_plugins, tmp_path, monkeypatch):
        collector = Collector()
        monkeypatch.setattr("pycni.backends.builtin_plugin", lambda t: collector if t == "fake-a" else None)
        runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "c"), backend="auto")
        n = net(fake_plugins, fake_plugins.plugin("fake-a"), fake_plugins.plugin("fake-b"), version="0.4.0")
        alive, leftover = tmp_path / "alive-netns", tmp_path / "netns-file-left-after-reboot"
        alive.write_text("")
        leftover.write_text("")
        # only a real namespace counts (the kernel test proves is_netns itself)
        monkeypatch.setattr("pycni.netns.is_netns", lambda path: path == str(alive))
        runtime.add_network_list(n, RuntimeConf("alive", str(alive)))
        runtime.add_network_list(n, RuntimeConf("dead", str(leftover)))
        return runtime, n, collector

    def test_attachments_whose_netns_is_gone_are_deleted_and_plugins_gc_the_rest(self, setup, fake_plugins):
        runtime, n, collector = setup
        report = runtime.reconcile_network_list(n)
        assert [a.container_id for a in runtime.get_cached_attachments()] == ["alive"]
        assert report.stale_attachments[0].startswith("dead/eth0")
        dels = [c["env"]["CNI_CONTAINERID"] for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
        assert dels == ["dead"]
        assert len(collector.gc_calls) == 1 and collector.gc_calls[0]["cniVersion"] == "1.1.0"
        assert collector.gc_calls[0]["cni.dev/valid-attachments"] == [{"containerID": "alive", "ifname": "eth0"}]
        assert report.collected == ("fake-a: lease 198.18.0.9 of ghost/eth0",)
        assert report.skipped == ("fake-b: config version '0.4.0' predates GC",)

    def test_dry_run_changes_nothing(self, setup, fake_plugins):
        runtime, n, collector = setup
        before = fake_plugins.calls()
        report = runtime.reconcile_network_list(n, dry_run=True)
        assert fake_plugins.calls() == before
        assert sorted(a.container_id for a in runtime.get_cached_attachments()) == ["alive", "dead"]
        assert collector.gc_calls[0]["pycni.dev/dry-run"] is True
        assert report.collected == ("fake-a: lease 198.18.0.9 of ghost/eth0 (would)",) and report.dry_run


@pytest.mark.parametrize("timeout", [float("nan"), -1.0, 0, float("inf")])
def test_the_runtime_refuses_a_timeout_that_is_not_a_finite_positive_number(tmp_path, timeout):
    with pytest.raises(InvalidArgumentError, match="invalid plugin timeout"):
        Runtime([], cache_dir=str(tmp_path), backend="exec", timeout=timeout)

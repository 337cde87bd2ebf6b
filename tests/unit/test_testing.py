"""pycni.testing.MockBackend drives the Runtime and the go-cni client without exec or kernel."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pycni.client import CNI, with_conf_list_bytes
from pycni.config import NetworkConfigList, conflist_from_bytes
from pycni.errors import CNIError, ErrorCode, PluginError
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.sdk import GCAttachment
from pycni.testing import MockBackend, PluginCall

RT = RuntimeConf(container_id="ctr1", netns="/run/netns/mock-ctr1", ifname="eth0", args=[("K", "V")])


def conflist(*types: str, version: str = "1.1.0", name: str = "mocknet") -> bytes:
    return json.dumps({"cniVersion": version, "name": name, "plugins": [{"type": t} for t in types]}).encode()


def chain(*types: str, version: str = "1.1.0") -> NetworkConfigList:
    return conflist_from_bytes(conflist(*types, version=version))


def ipam_then_passthrough(call: PluginCall) -> dict[str, Any] | None:
    """``bridge`` makes a result; every other plugin adds nothing to the previous one."""
    if call.command != "ADD":
        return None
    if call.plugin_type == "bridge":
        return {
            "cniVersion": call.cni_version,
            "interfaces": [{"name": call.ifname, "sandbox": call.netns}],
            "ips": [{"address": "198.18.0.2/24", "gateway": "198.18.0.1", "interface": 0}],
        }
    return call.prev_result


@pytest.fixture
def runtime_with(tmp_path):
    def make(backend: MockBackend) -> Runtime:
        return Runtime((), cache_dir=str(tmp_path / "cache"), backend=backend)

    return make


def commands(backend: MockBackend) -> list[tuple[str, str]]:
    return [(c.command, c.plugin_type) for c in backend.calls]


class TestThroughRuntime:
    def test_add_runs_plugins_in_order_chaining_prev_result_and_records_env(self, runtime_with):
        backend = MockBackend(ipam_then_passthrough)
        result = runtime_with(backend).add_network_list(chain("bridge", "portmap", "firewall"), RT)
        assert commands(backend) == [("ADD", "bridge"), ("ADD", "portmap"), ("ADD", "firewall")]
        first, *rest = backend.calls
        assert first.prev_result is None
        assert all(c.prev_result == result.to_json() for c in rest)
        assert first.config["name"] == "mocknet" and first.cni_version == "1.1.0"
        assert first.env["CNI_COMMAND"] == "ADD" and first.env["CNI_ARGS"] == "K=V"
        assert (first.container_id, first.netns, first.ifname) == ("ctr1", "/run/netns/mock-ctr1", "eth0")
        assert [str(ip.address) for ip in result.ips] == ["198.18.0.2/24"]

    def test_delete_runs_in_reverse_with_the_cached_result(self, runtime_with):
        backend = MockBackend(ipam_then_passthrough)
        runtime = runtime_with(backend)
        added = runtime.add_network_list(chain("bridge", "portmap"), RT)
        backend.calls.clear()
        runtime.delete_network_list(chain("bridge", "portmap"), RT)
        assert commands(backend) == [("DEL", "portmap"), ("DEL", "bridge")]
        assert all(c.prev_result == added.to_json() for c in backend.calls)
        backend.calls.clear()
        runtime.delete_network_list(chain("bridge", "portmap"), RT)  # the cache entry is gone
        assert [c.prev_result for c in backend.calls] == [None, None]

    def test_check_runs_forward_with_the_cached_result(self, runtime_with):
        backend = MockBackend(ipam_then_passthrough)
        runtime = runtime_with(backend)
        added = runtime.add_network_list(chain("bridge", "portmap"), RT)
        backend.calls.clear()
        runtime.check_network_list(chain("bridge", "portmap"), RT)
        assert commands(backend) == [("CHECK", "bridge"), ("CHECK", "portmap")]
        assert all(c.prev_result == added.to_json() for c in backend.calls)

    def test_gc_deletes_stale_attachments_then_sends_gc_with_the_valid_ones(self, runtime_with):
        backend = MockBackend(ipam_then_passthrough)
        runtime = runtime_with(backend)
        for ctr in ("keep", "stale"):
            runtime.add_network_list(chain("bridge", "portmap"), RuntimeConf(ctr, f"/run/netns/{ctr}", "eth0"))
        backend.calls.clear()
        runtime.gc_network_list(chain("bridge", "portmap"), [GCAttachment("keep", "eth0")])
        assert commands(backend) == [("DEL", "portmap"), ("DEL", "bridge"), ("GC", "bridge"), ("GC", "portmap")]
        assert {c.container_id for c in backend.calls[:2]} == {"stale"}
        valid = [{"containerID": "keep", "ifname": "eth0"}]
        assert all(c.config["cni.dev/valid-attachments"] == valid for c in backend.calls[2:])

    def test_status_asks_every_plugin_from_1_1_0_only(self, runtime_with):
        backend = MockBackend()
        runtime_with(backend).get_status_network_list(chain("bridge", "portmap"))
        assert commands(backend) == [("STATUS", "bridge"), ("STATUS", "portmap")]
        backend.calls.clear()
        runtime_with(backend).get_status_network_list(chain("bridge", version="1.0.0"))
        assert backend.calls == []

    def test_a_handlers_cni_error_stops_the_chain_as_a_plugin_error_with_its_code(self, runtime_with):
        def failing(call: PluginCall) -> dict[str, Any] | None:
            if call.plugin_type == "portmap":
                raise CNIError("no ports left", "all 3 taken", code=ErrorCode.TRY_AGAIN_LATER)
            return ipam_then_passthrough(call)

        backend = MockBackend(failing)
        with pytest.raises(PluginError) as e:
            runtime_with(backend).add_network_list(chain("bridge", "portmap", "firewall"), RT, rollback=True)
        assert e.value.code == ErrorCode.TRY_AGAIN_LATER and e.value.plugin == "portmap"
        assert "no ports left" in str(e.value) and e.value.details == "all 3 taken"
        assert commands(backend) == [("ADD", "bridge"), ("ADD", "portmap"), ("DEL", "portmap"), ("DEL", "bridge")]

    def test_the_default_handler_passes_results_through(self, runtime_with):
        result = runtime_with(MockBackend()).add_network_list(chain("loopback", "tuning"), RT)
        assert result.to_json() == {"cniVersion": "1.1.0"}

    def test_version_checks_use_the_backends_versions(self, runtime_with):
        runtime = runtime_with(MockBackend(versions=("0.4.0", "1.0.0")))
        assert runtime.get_version_info("bridge").supported_versions == ("0.4.0", "1.0.0")
        with pytest.raises(CNIError, match='does not support config version "1.1.0"'):
            runtime.validate_network_list(chain("bridge"))

    def test_the_handler_cannot_alias_the_runtimes_objects(self, runtime_with):
        shared: dict[str, Any] = {"cniVersion": "1.1.0", "dns": {"nameservers": ["198.18.0.53"]}}
        backend = MockBackend(lambda call: shared if call.command == "ADD" else None)
        runtime_with(backend).add_network_list(chain("bridge", "portmap"), RT)
        backend.calls[1].config["prevResult"]["dns"]["nameservers"].append("mutated")
        assert shared["dns"]["nameservers"] == ["198.18.0.53"]


class TestThroughClient:
    @pytest.fixture
    def cni(self, tmp_path):
        backend = MockBackend(ipam_then_passthrough)
        client = CNI(
            plugin_dirs=(), conf_dir=str(tmp_path / "net.d"), cache_dir=str(tmp_path / "cache"), backend=backend
        )
        client.load(with_conf_list_bytes(conflist("bridge", "portmap")))
        return client, backend

    def test_setup_check_remove_and_status(self, cni):
        client, backend = cni
        result = client.setup("ctr1", "/run/netns/mock-ctr1")
        assert [str(c.ip) for c in result.interfaces["eth0"].ip_configs] == ["198.18.0.2"]
        client.check("ctr1", "/run/netns/mock-ctr1")
        client.remove("ctr1", "/run/netns/mock-ctr1")
        client.status()
        assert commands(backend) == [
            ("ADD", "bridge"),
            ("ADD", "portmap"),
            ("CHECK", "bridge"),
            ("CHECK", "portmap"),
            ("DEL", "portmap"),
            ("DEL", "bridge"),
            ("STATUS", "bridge"),
            ("STATUS", "portmap"),
        ]
        assert {c.ifname for c in backend.calls if c.command != "STATUS"} == {"eth0"}

    def test_a_failing_plugin_surfaces_with_its_code(self, cni):
        client, backend = cni
        backend.handler = lambda call: (_ for _ in ()).throw(CNIError("down", code=ErrorCode.PLUGIN_NOT_AVAILABLE))
        with pytest.raises(PluginError) as e:
            client.status()
        assert e.value.code == ErrorCode.PLUGIN_NOT_AVAILABLE and e.value.plugin == "bridge"

"""NetworkConfigurator against a fake go-cni client: Nomad's TestSetup plus retries, CHECK, teardown."""

from __future__ import annotations

import logging
import threading
import time
from ipaddress import ip_address
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pycni import client
from pycni.errors import CNIError, ErrorCode, PluginError
from pycni.gocni_result import GoCNIIPConfig, GoCNIResult, InterfaceConfig
from pycni.nomad.cleanup import CleanupReport
from pycni.nomad.configurator import NetworkConfigurator
from pycni.nomad.conflist import NomadBridgeConfig, bridge_conflist
from pycni.nomad.errors import CheckFailedError, CleanupError, InitError, SetupError, TransparentProxyError
from pycni.nomad.models import Allocation, Node
from pycni.nomad.status import AllocNetworkStatus, DNSConfig
from pycni.types import DNS

from .conftest import MOCK_ALLOC_ID, group, mock_connect_alloc

SPEC_PATH = "/var/run/docker/netns/nonsense-ns"
NODE = Node(
    attributes={"unique.consul.dns.addr": "192.168.1.117", "consul.dns.port": "8600"},
    meta={"connect.transparent_proxy.default_outbound_port": "15001", "connect.transparent_proxy.default_uid": "101"},
)
WORKLOAD = {
    "IgnoreUnknown": "true",
    "NOMAD_ALLOC_ID": MOCK_ALLOC_ID,
    "NOMAD_GROUP_NAME": "web",
    "NOMAD_JOB_ID": "mock-service",
    "NOMAD_NAMESPACE": "default",
    "NOMAD_REGION": "global",
}
MOCK_RESULT = GoCNIResult(
    interfaces={"eth0": InterfaceConfig(ip_configs=(GoCNIIPConfig(ip_address("99.99.99.99")),))}, dns=(DNS(),)
)


class FakeCNI:
    """Nomad's mockCNIPlugin: scripted setup/check errors, every call recorded with its options."""

    def __init__(
        self,
        setup_errors: tuple[str, ...] = (),
        check_errors: tuple[CNIError, ...] = (),
        remove_error: CNIError | None = None,
        status_error: CNIError | None = None,
        result: GoCNIResult = MOCK_RESULT,
    ) -> None:
        self.setup_errors = setup_errors
        self.check_errors = check_errors
        self.remove_error = remove_error
        self.status_error = status_error
        self.result = result
        self.loaded: list[tuple[Any, ...]] = []
        self.calls: list[tuple[str, str, str, dict[str, Any], dict[str, str]]] = []

    def status(self) -> None:
        if self.status_error is not None:
            raise self.status_error
        if not self.loaded:
            raise client.NotInitializedError("cni plugin not initialized")

    def load(self, *opts: Any) -> None:
        self.loaded.append(opts)

    def _record(self, verb: str, container_id: str, path: str, ns_opts: tuple[Any, ...]) -> int:
        ns = SimpleNamespace(capability_args={}, args={})
        for opt in ns_opts:
            opt(ns)
        self.calls.append((verb, container_id, path, ns.capability_args, ns.args))
        return sum(1 for c in self.calls if c[0] == verb)

    def setup(self, container_id: str, path: str, *ns_opts: Any) -> GoCNIResult:
        n = self._record("setup", container_id, path, ns_opts)
        if n <= len(self.setup_errors):
            raise PluginError(f"uh oh ({n}): {self.setup_errors[n - 1]}", code=11)
        return self.result

    def check(self, container_id: str, path: str, *ns_opts: Any) -> None:
        n = self._record("check", container_id, path, ns_opts)
        if n <= len(self.check_errors):
            raise self.check_errors[n - 1]

    def remove(self, container_id: str, path: str, *ns_opts: Any) -> None:
        self._record("remove", container_id, path, ns_opts)
        if self.remove_error is not None:
            raise self.remove_error

    def verbs(self) -> list[str]:
        return [c[0] for c in self.calls]


class FixedRng:
    def __init__(self, *values: int) -> None:
        self.values = list(values)
        self.asked: list[int] = []

    def randrange(self, stop: int) -> int:
        self.asked.append(stop)
        return self.values.pop(0)


def configurator(
    cni: FakeCNI, node: Node = NODE, sleeps: list[float] | None = None, rng: Any = None, **kw: Any
) -> NetworkConfigurator:
    record = sleeps if sleeps is not None else []
    return NetworkConfigurator(
        cni,
        bridge_conflist(NomadBridgeConfig().with_defaults()),
        node,
        sleep=record.append,
        rng=rng or FixedRng(0, 0, 0),
        **kw,
    )


def alloc_with(mod: Any = None) -> Allocation:
    doc = mock_connect_alloc()
    if mod is not None:
        mod(doc)
    return Allocation.from_json(doc)


def _cni_args(doc: dict[str, Any]) -> None:
    group(doc)["Networks"] = [{"CNI": {"Args": {"first_arg": "example", "new_arg": "example_2"}}}]


def _bad_ids(doc: dict[str, Any]) -> None:
    doc["Job"]["ID"] = "this;does;not;work"
    doc["Namespace"] = "no;chance"


def _args_and_tproxy(doc: dict[str, Any]) -> None:
    tg = group(doc)
    tg["Networks"] = [
        {
            "CNI": {"Args": {"extra_arg": "example"}},
            "DNS": {},
            "ReservedPorts": [{"Label": "http", "Value": 9002, "To": 9002, "HostNetwork": "default"}],
        }
    ]
    tg["Services"][0]["PortLabel"] = "http"
    tg["Services"][0]["Connect"]["SidecarService"]["Proxy"] = {"TransparentProxy": {}}


DEFAULT_STATUS = AllocNetworkStatus(interface_name="eth0", address="99.99.99.99")


@pytest.mark.parametrize(
    ("mod", "setup_errors", "expect_status", "expect_args"),
    [
        pytest.param(None, (), DEFAULT_STATUS, WORKLOAD, id="defaults"),
        pytest.param(None, ("sad day",), DEFAULT_STATUS, WORKLOAD, id="error once and succeed on retry"),
        pytest.param(
            _cni_args,
            (),
            DEFAULT_STATUS,
            {**WORKLOAD, "first_arg": "example", "new_arg": "example_2"},
            id="with cni args",
        ),
        pytest.param(
            _bad_ids,
            (),
            DEFAULT_STATUS,
            {k: v for k, v in WORKLOAD.items() if k not in ("NOMAD_JOB_ID", "NOMAD_NAMESPACE")},
            id="cni workload with invalid job id and namespace",
        ),
        pytest.param(
            _args_and_tproxy,
            (),
            AllocNetworkStatus("eth0", "99.99.99.99", "", DNSConfig(("192.168.1.117",), (), ())),
            {
                **WORKLOAD,
                "extra_arg": "example",
                "CONSUL_IPTABLES_CONFIG": '{"ConsulDNSIP":"192.168.1.117","ConsulDNSPort":8600,"ProxyUserID":"101",'
                '"ProxyInboundPort":9999,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["9002"],'
                '"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":null,'
                '"NetNS":"/var/run/docker/netns/nonsense-ns","IptablesProvider":null}',
            },
            id="with args and tproxy",
        ),
    ],
)
def test_nomad_setup_table(
    mod: Any, setup_errors: tuple[str, ...], expect_status: AllocNetworkStatus, expect_args: dict[str, str]
) -> None:
    cni = FakeCNI(setup_errors=setup_errors)
    status = configurator(cni).setup(alloc_with(mod), SPEC_PATH, created=True)
    assert status == expect_status
    assert cni.verbs() == ["setup"] * (len(setup_errors) + 1)
    verb, container_id, path, caps, args = cni.calls[-1]
    assert (container_id, path) == (MOCK_ALLOC_ID, SPEC_PATH)
    assert args == expect_args
    assert caps == {
        "portMappings": [
            {"hostPort": 9999, "containerPort": 9999, "protocol": "tcp"},
            {"hostPort": 9999, "containerPort": 9999, "protocol": "udp"},
        ]
    }


def test_too_many_errors_report_the_first_after_three_attempts_and_two_sleeps(caplog: pytest.LogCaptureFixture) -> None:
    cni = FakeCNI(setup_errors=("sad day", "sad again", "the last straw"))
    sleeps: list[float] = []
    rng = FixedRng(250, 999)
    with caplog.at_level(logging.WARNING, logger="pycni.nomad"):
        with pytest.raises(SetupError) as info:
            configurator(cni, sleeps=sleeps, rng=rng).setup(alloc_with(), SPEC_PATH, created=True)
    assert str(info.value) == "failed to configure network: uh oh (1): sad day"
    assert info.value.code == 11 and isinstance(info.value.cause, PluginError)
    assert cni.verbs() == ["setup"] * 3
    assert sleeps == [1.25, 1.999]  # 1 s + U[0, 1000) ms, only between attempts
    assert rng.asked == [1000, 1000]
    attempts = [r.getMessage() for r in caplog.records if "failed to configure network" in r.getMessage()]
    assert [m.split("(attempt ")[1][0] for m in attempts] == ["1", "2", "3"]


def test_one_failure_sleeps_once() -> None:
    sleeps: list[float] = []
    configurator(FakeCNI(setup_errors=("x",)), sleeps=sleeps, rng=FixedRng(0)).setup(alloc_with(), SPEC_PATH, True)
    assert sleeps == [1.0]


def test_non_cni_errors_are_not_retried() -> None:
    class Broken(FakeCNI):
        def setup(self, container_id: str, path: str, *ns_opts: Any) -> GoCNIResult:
            raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        configurator(Broken()).setup(alloc_with(), SPEC_PATH, True)


def test_config_is_loaded_lazily_once() -> None:
    cni = FakeCNI()
    conf = configurator(cni)
    assert cni.loaded == []
    conf.setup(alloc_with(), SPEC_PATH, True)
    conf.setup(alloc_with(), SPEC_PATH, True)
    assert len(cni.loaded) == 1 and len(cni.loaded[0]) == 1


def test_load_option_is_the_conflist() -> None:
    cni = FakeCNI()
    configurator(cni).setup(alloc_with(), SPEC_PATH, True)
    real = client.CNI(cache_dir="/nonexistent")
    real.load(*cni.loaded[0])
    assert [n.config.name for n in real.networks()] == ["nomad"]


def test_status_failure_is_wrapped_on_setup_and_raw_on_teardown() -> None:
    error = PluginError('plugin type="bridge" failed (status): boom', code=50)
    with pytest.raises(InitError) as info:
        configurator(FakeCNI(status_error=error)).setup(alloc_with(), SPEC_PATH, True)
    assert str(info.value) == 'cni not initialized: plugin type="bridge" failed (status): boom'
    assert info.value.code == 50
    with pytest.raises(PluginError):
        configurator(FakeCNI(status_error=error)).teardown(alloc_with(), SPEC_PATH)


def test_load_failure_is_wrapped_on_setup() -> None:
    class BadLoad(FakeCNI):
        def load(self, *opts: Any) -> None:
            raise client.LoadError("cni config load failed: x: failed to load cni config")

    with pytest.raises(InitError, match="^cni not initialized: cni config load failed"):
        configurator(BadLoad()).setup(alloc_with(), SPEC_PATH, True)


# -- restore: existing namespace -------------------------------------------------------------------


def _node(version: str | None) -> Node:
    attrs = dict(NODE.attributes)
    if version is not None:
        attrs["plugins.cni.version.bridge"] = version
    return Node(attributes=attrs, meta=NODE.meta)


@pytest.mark.parametrize("version", [None, "", "unknown", "v1.2.0", "1.2.9", "1.4.0-rc1"])
def test_existing_namespace_is_not_checked_with_old_or_unknown_bridge(version: str | None) -> None:
    cni = FakeCNI()
    assert configurator(cni, node=_node(version)).setup(alloc_with(), SPEC_PATH, created=False) is None
    assert cni.verbs() == []


@pytest.mark.parametrize("version", ["1.3.0", "v1.4.0", "2.0"])
def test_existing_namespace_is_checked_with_the_setup_options(version: str) -> None:
    cni = FakeCNI()
    assert configurator(cni, node=_node(version)).setup(alloc_with(_cni_args), SPEC_PATH, created=False) is None
    assert cni.verbs() == ["check"]
    _, container_id, path, caps, args = cni.calls[0]
    assert (container_id, path) == (MOCK_ALLOC_ID, SPEC_PATH)
    assert args == {**WORKLOAD, "first_arg": "example", "new_arg": "example_2"}
    assert len(caps["portMappings"]) == 2


def test_failed_check_is_a_distinct_check_failed_error() -> None:
    cause = PluginError('plugin type="bridge" failed (check): expected IP', code=ErrorCode.INVALID_NETNS)
    cni = FakeCNI(check_errors=(cause,))
    with pytest.raises(CheckFailedError) as info:
        configurator(cni, node=_node("v1.4.0")).setup(alloc_with(), SPEC_PATH, created=False)
    assert str(info.value) == (
        'network namespace already exists but was misconfigured: plugin type="bridge" failed (check): expected IP'
    )
    assert info.value.cause is cause and info.value.code == ErrorCode.INVALID_NETNS
    assert not isinstance(info.value, SetupError)


def test_tproxy_errors_surface_even_on_restore() -> None:
    node = Node(attributes={"plugins.cni.version.bridge": "v1.4.0"}, meta={})
    with pytest.raises(TransparentProxyError):
        configurator(FakeCNI(), node=node).setup(alloc_with(_args_and_tproxy), SPEC_PATH, created=False)


def test_no_consul_dns_override_without_dns_ip() -> None:
    node = Node(attributes={}, meta=NODE.meta)
    status = configurator(FakeCNI(), node=node).setup(alloc_with(_args_and_tproxy), SPEC_PATH, True)
    assert status is not None and status.dns is None


def test_status_errors_are_not_retried() -> None:
    empty = GoCNIResult(interfaces={"eth0": InterfaceConfig()})
    cni = FakeCNI(result=empty)
    with pytest.raises(CNIError, match="no interface with an address"):
        configurator(cni).setup(alloc_with(), SPEC_PATH, True)
    assert cni.verbs() == ["setup"]


@pytest.mark.parametrize(("ignore", "host_ip"), [(True, None), (False, "10.0.0.5")])
def test_port_map_host_ip_follows_the_client_setting(ignore: bool, host_ip: str | None) -> None:
    def ports(doc: dict[str, Any]) -> None:
        doc["AllocatedResources"]["Shared"]["Ports"] = [
            {"Label": "http", "Value": 25000, "To": 8080, "HostIP": "10.0.0.5"}
        ]

    cni = FakeCNI()
    configurator(cni, ignore_port_mapping_host_ip=ignore).setup(alloc_with(ports), SPEC_PATH, True)
    entry = cni.calls[0][3]["portMappings"][0]
    assert entry.get("hostIP") == host_ip


def test_setups_are_serialised_process_wide() -> None:
    active, peak = [0], [0]
    lock = threading.Lock()

    class Slow(FakeCNI):
        def setup(self, container_id: str, path: str, *ns_opts: Any) -> GoCNIResult:
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.02)
            with lock:
                active[0] -= 1
            return MOCK_RESULT

    confs = [configurator(Slow()) for _ in range(4)]
    threads = [threading.Thread(target=c.setup, args=(alloc_with(), SPEC_PATH, True)) for c in confs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1


# -- teardown -----------------------------------------------------------------------------------------


def test_teardown_removes_with_port_maps_and_no_args() -> None:
    cni = FakeCNI()
    assert configurator(cni).teardown(alloc_with(_cni_args), SPEC_PATH) is None
    assert cni.verbs() == ["remove"]
    _, container_id, path, caps, args = cni.calls[0]
    assert (container_id, path, args) == (MOCK_ALLOC_ID, SPEC_PATH, {})
    assert [e["protocol"] for e in caps["portMappings"]] == ["tcp", "udp"]


def test_failed_remove_falls_back_to_forced_cleanup_of_the_network() -> None:
    seen: list[tuple[str, str]] = []

    def cleanup(network: str, alloc_id: str) -> CleanupReport:
        seen.append((network, alloc_id))
        return CleanupReport(network, alloc_id, ("ip nat chain CNI-x (2 rules)",))

    cni = FakeCNI(remove_error=PluginError("netns gone"))
    report = configurator(cni, cleanup=cleanup).teardown(alloc_with(), SPEC_PATH)
    assert seen == [("nomad", MOCK_ALLOC_ID)]
    assert report is not None and report.removed == ("ip nat chain CNI-x (2 rules)",)


def test_forced_cleanup_failure_propagates() -> None:
    def cleanup(network: str, alloc_id: str) -> CleanupReport:
        raise CleanupError(f"failed to cleanup iptables rules for alloc {alloc_id}")

    with pytest.raises(CleanupError):
        configurator(FakeCNI(remove_error=PluginError("x")), cleanup=cleanup).teardown(alloc_with(), SPEC_PATH)


def test_cni_mode_cleanup_uses_the_configured_network_name(tmp_path: Path) -> None:
    (tmp_path / "10-mynet.conflist").write_text('{"cniVersion":"1.0.0","name":"mynet","plugins":[{"type":"bridge"}]}')
    seen: list[str] = []

    def cleanup(network: str, alloc_id: str) -> CleanupReport:
        seen.append(network)
        return CleanupReport(network, alloc_id)

    conf = NetworkConfigurator(FakeCNI(remove_error=PluginError("x")), (str(tmp_path), "mynet"), NODE, cleanup=cleanup)
    conf.teardown(alloc_with(), SPEC_PATH)
    assert seen == ["mynet"]

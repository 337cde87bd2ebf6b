"""Decoding Nomad API JSON into the configurator's models: Go's encoding/json rules, clear errors."""

from __future__ import annotations

from typing import Any

import pytest

from pycni.errors import CNIError, ErrorCode
from pycni.nomad.errors import DecodeError
from pycni.nomad.models import Allocation, Node

from .conftest import FIXTURES, group, mock_connect_alloc


def test_connect_fixture_decodes_the_fields_the_configurator_reads(tproxy_alloc: Allocation) -> None:
    tg = tproxy_alloc.group
    assert (tproxy_alloc.id, tproxy_alloc.namespace, tproxy_alloc.task_group) == (
        "5b6a4d3e-9f0c-2a7e-bb1d-7c0e4f2a9d31",
        "default",
        "api",
    )
    assert (tproxy_alloc.job.id, tproxy_alloc.job.region) == ("countdash", "global")
    assert [p.label for p in tg.networks[0].dynamic_ports] == ["connect-proxy-count-api", "svc_count-api_ck_4ea1c3"]
    assert tg.networks[0].dynamic_ports[0].to == -1
    tproxy = tg.services[0].transparent_proxy
    assert tproxy is not None
    assert tproxy.exclude_outbound_ports == (8500, 443)
    assert tproxy.exclude_inbound_ports == ("metrics", "9999")
    assert tg.services[0].proxy.expose.paths[0].listener_port == "svc_count-api_ck_4ea1c3"  # type: ignore[union-attr]
    assert [(p.label, p.value, p.to, p.host_ip) for p in tproxy_alloc.shared.ports][1] == (
        "connect-proxy-count-api",
        28734,
        -1,
        "10.0.2.15",
    )
    assert tg.has_transparent_proxy


def test_bridge_fixture_decodes_cni_args(bridge_alloc: Allocation) -> None:
    network = bridge_alloc.group.networks[0]
    assert network.cni is not None
    assert dict(network.cni.args) == {"K8S_POD_NAMESPACE": "web", "cni.dev/owner": "shop"}
    assert not bridge_alloc.group.has_transparent_proxy


def test_legacy_fixture_has_networks_but_no_ports(legacy_alloc: Allocation) -> None:
    assert legacy_alloc.shared.ports == ()
    assert [p.label for p in legacy_alloc.shared.networks[0].dynamic_ports] == ["stats"]


def test_node_fixture_decodes_attributes_and_meta(node: Node) -> None:
    assert node.attributes["plugins.cni.version.bridge"] == "v1.4.0"
    assert node.meta["connect.transparent_proxy.default_uid"] == "101"


def test_unknown_keys_are_ignored() -> None:
    doc = mock_connect_alloc()
    doc["Surprise"] = {"deeply": [{"nested": [1, 2, {"x": None}]}]}
    group(doc)["Networks"][0]["FutureField"] = [1, "two"]
    assert Allocation.from_json(doc).group.networks[0].mode == "bridge"


def test_keys_match_case_insensitively_and_the_last_match_wins() -> None:
    doc = mock_connect_alloc()
    doc["id"] = "lower"
    assert Allocation.from_json(doc).id == "lower"  # "id" comes after "ID" in document order
    doc = {"id": "first", **mock_connect_alloc()}
    assert Allocation.from_json(doc).id == mock_connect_alloc()["ID"]


def test_null_reads_as_the_go_zero_value() -> None:
    doc = mock_connect_alloc()
    doc["Namespace"] = None
    group(doc)["Networks"][0].update({"ReservedPorts": None, "CNI": None, "Mode": None})
    doc["AllocatedResources"] = None
    alloc = Allocation.from_json(doc)
    assert alloc.namespace == ""
    assert alloc.group.networks[0].reserved_ports == ()
    assert alloc.group.networks[0].cni is None
    assert alloc.shared.ports == () and alloc.shared.networks == ()


def test_null_element_of_a_value_slice_is_a_zero_port() -> None:
    doc = mock_connect_alloc()
    group(doc)["Networks"][0]["ReservedPorts"] = [None]
    port = Allocation.from_json(doc).group.networks[0].reserved_ports[0]
    assert (port.label, port.value, port.to) == ("", 0, 0)


def test_nil_slice_and_empty_slice_stay_distinct_for_tproxy_lists() -> None:
    doc = mock_connect_alloc()
    group(doc)["Services"][0]["Connect"]["SidecarService"] = {
        "Proxy": {"TransparentProxy": {"ExcludeOutboundCIDRs": [], "ExcludeUIDs": None}}
    }
    tproxy = Allocation.from_json(doc).group.services[0].transparent_proxy
    assert tproxy is not None
    assert tproxy.exclude_outbound_cidrs == ()
    assert tproxy.exclude_uids is None


def test_a_lone_surrogate_becomes_the_replacement_character_as_in_go() -> None:
    doc = mock_connect_alloc()
    doc["Namespace"] = "a\ud800b"
    assert Allocation.from_json(doc).namespace == "a\ufffdb"


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


NETWORK = ("Job", "TaskGroups", 0, "Networks", 0)


def _with_tproxy(**fields: Any) -> dict[str, Any]:
    doc = mock_connect_alloc()
    group(doc)["Services"][0]["Connect"]["SidecarService"] = {"Proxy": {"TransparentProxy": fields}}
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            _set(mock_connect_alloc(), (*NETWORK, "DynamicPorts"), [{"Label": "a", "Value": "x"}]),
            'Job.TaskGroups[0].Networks[0].DynamicPorts[0].Value: expected an integer, got "x"',
        ),
        (
            _set(mock_connect_alloc(), (*NETWORK, "ReservedPorts"), [{"To": 1.5}]),
            "Job.TaskGroups[0].Networks[0].ReservedPorts[0].To: expected an integer, got 1.5",
        ),
        (
            _set(mock_connect_alloc(), (*NETWORK, "ReservedPorts"), [{"To": True}]),
            "Job.TaskGroups[0].Networks[0].ReservedPorts[0].To: expected an integer, got true",
        ),
        (
            _set(mock_connect_alloc(), (*NETWORK, "ReservedPorts"), [{"Value": 2**63}]),
            "Job.TaskGroups[0].Networks[0].ReservedPorts[0].Value: integer 9223372036854775808 out of range "
            "[-9223372036854775808, 9223372036854775807]",
        ),
        (
            _with_tproxy(OutboundPort=65536),
            "Job.TaskGroups[0].Services[0].Connect.SidecarService.Proxy.TransparentProxy.OutboundPort: "
            "integer 65536 out of range [0, 65535]",
        ),
        (
            _with_tproxy(ExcludeOutboundPorts=[443, -1]),
            "Job.TaskGroups[0].Services[0].Connect.SidecarService.Proxy.TransparentProxy.ExcludeOutboundPorts[1]: "
            "integer -1 out of range [0, 65535]",
        ),
        (
            _with_tproxy(NoDNS="yes"),
            "Job.TaskGroups[0].Services[0].Connect.SidecarService.Proxy.TransparentProxy.NoDNS: "
            'expected a boolean, got "yes"',
        ),
        (
            _set(mock_connect_alloc(), (*NETWORK, "CNI"), {"Args": {"k": 1}}),
            'Job.TaskGroups[0].Networks[0].CNI.Args["k"]: expected a string, got 1',
        ),
        (_set(mock_connect_alloc(), ("Job", "TaskGroups"), {}), "Job.TaskGroups: expected an array, got an object"),
        (
            _set(mock_connect_alloc(), ("Job", "TaskGroups", 0, "Networks"), [None]),
            "Job.TaskGroups[0].Networks[0]: expected an object, got null",
        ),
        (_set(mock_connect_alloc(), ("ID",), ["x"]), "ID: expected a string, got an array"),
        (_set(mock_connect_alloc(), ("Job",), None), "Job: missing: the allocation must embed its job"),
        (_set(mock_connect_alloc(), ("TaskGroup",), "db"), 'TaskGroup: no task group "db" in Job.TaskGroups'),
        ([], "expected an object, got an array"),
    ],
)
def test_wrong_types_name_the_field_path(doc: Any, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        Allocation.from_json(doc)
    assert str(info.value) == message
    assert info.value.code == ErrorCode.DECODING_FAILURE


def test_node_maps_must_hold_strings() -> None:
    with pytest.raises(DecodeError) as info:
        Node.from_json({"Meta": {"connect.transparent_proxy.default_uid": 101}})
    assert str(info.value) == 'Meta["connect.transparent_proxy.default_uid"]: expected a string, got 101'


@pytest.mark.parametrize("text", [b"", b"{", b"\xff", b"[1e999]", b"NaN", b"1" * 5000])
def test_unparsable_json_is_a_decode_error(text: bytes) -> None:
    with pytest.raises(CNIError, match="^allocation is not valid JSON: "):
        Allocation.loads(text)


def test_loads_reads_bytes() -> None:
    assert Allocation.loads((FIXTURES / "bridge_ports_alloc.json").read_bytes()).group.name == "frontend"


def test_every_model_field_declares_the_go_field_it_is_decoded_from() -> None:
    import attrs

    from pycni.nomad import models

    for name in models.__all__:
        cls = getattr(models, name)
        if attrs.has(cls):
            for field in attrs.fields(cls):
                go_name, decode = field.metadata["pycni.go"]
                assert go_name[:1].isupper() and callable(decode), (name, field.name)
    # A model below the allocation decodes on its own too, with the zero value for null.
    assert models.Port.from_json(None) == models.Port()
    with pytest.raises(DecodeError, match=r"^ReservedPorts\[0\]\.Label: expected a string, got 1$"):
        models.NetworkResource.from_json({"ReservedPorts": [{"Label": 1}]})

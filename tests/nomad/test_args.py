"""CNI args (Nomad's addCustomCNIArgs, addNomadWorkloadCNIArgs and Setup's assembly)."""

from __future__ import annotations

import json
import logging

import pytest

from pycni.nomad.args import add_custom_cni_args, add_nomad_workload_cni_args, cni_args
from pycni.nomad.models import Allocation, NetworkResource, Node
from pycni.nomad.ports import port_mappings
from pycni.nomad.tproxy import transparent_proxy_config

from .conftest import MOCK_ALLOC_ID, group, mock_connect_alloc

MOCK_WORKLOAD = {
    "NOMAD_ALLOC_ID": MOCK_ALLOC_ID,
    "NOMAD_GROUP_NAME": "web",
    "NOMAD_JOB_ID": "mock-service",
    "NOMAD_NAMESPACE": "default",
    "NOMAD_REGION": "global",
}


def test_add_custom_cni_args_subtests_share_one_map() -> None:
    # Nomad's TestCNI_addCustomCNIArgs: both subtests mutate the same map.
    args = {"default": "yup"}
    add_custom_cni_args([NetworkResource(mode="bridge")], args)
    assert args == {"default": "yup"}
    with_args = NetworkResource.from_json({"CNI": {"Args": {"first_arg": "example", "new_arg": "example_2"}}})
    add_custom_cni_args([with_args], args)
    assert args == {"default": "yup", "first_arg": "example", "new_arg": "example_2"}


def test_later_networks_overwrite_and_may_override_ignore_unknown() -> None:
    doc = mock_connect_alloc()
    group(doc)["Networks"] = [
        {"CNI": {"Args": {"a": "1", "IgnoreUnknown": "false"}}},
        {"Mode": "bridge"},
        {"CNI": {"Args": {"a": "2"}}},
    ]
    args = cni_args(Allocation.from_json(doc))
    assert args["IgnoreUnknown"] == "false"
    assert args["a"] == "2"


def test_defaults_are_ignore_unknown_and_the_workload_identity() -> None:
    assert cni_args(Allocation.from_json(mock_connect_alloc())) == {"IgnoreUnknown": "true", **MOCK_WORKLOAD}


def test_workload_args_overwrite_custom_ones() -> None:
    doc = mock_connect_alloc()
    group(doc)["Networks"] = [{"CNI": {"Args": {"NOMAD_ALLOC_ID": "spoofed", "extra": "x"}}}]
    args = cni_args(Allocation.from_json(doc))
    assert args["NOMAD_ALLOC_ID"] == MOCK_ALLOC_ID and args["extra"] == "x"


def test_values_with_semicolons_are_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # Nomad's TestSetup "cni workload with invalid job id and namespace".
    doc = mock_connect_alloc()
    doc["Job"]["ID"] = "this;does;not;work"
    doc["Namespace"] = "no;chance"
    with caplog.at_level(logging.WARNING, logger="pycni.nomad"):
        args = cni_args(Allocation.from_json(doc))
    assert args == {
        "IgnoreUnknown": "true",
        "NOMAD_ALLOC_ID": MOCK_ALLOC_ID,
        "NOMAD_GROUP_NAME": "web",
        "NOMAD_REGION": "global",
    }
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and all("semicolon" in m for m in warned)
    assert any("NOMAD_JOB_ID" in m for m in warned) and any("NOMAD_NAMESPACE" in m for m in warned)


def test_a_skipped_workload_key_leaves_a_custom_value_of_that_name() -> None:
    doc = mock_connect_alloc()
    doc["Namespace"] = "a;b"
    group(doc)["Networks"] = [{"CNI": {"Args": {"NOMAD_NAMESPACE": "custom"}}}]
    assert cni_args(Allocation.from_json(doc))["NOMAD_NAMESPACE"] == "custom"


def test_empty_values_are_kept_and_equals_signs_are_not_checked() -> None:
    doc = mock_connect_alloc()
    doc["Job"]["Region"] = ""
    doc["Namespace"] = "a=b"
    args: dict[str, str] = {}
    add_nomad_workload_cni_args(Allocation.from_json(doc), args)
    assert args["NOMAD_REGION"] == "" and args["NOMAD_NAMESPACE"] == "a=b"


def test_custom_args_are_not_validated() -> None:
    doc = mock_connect_alloc()
    group(doc)["Networks"] = [{"CNI": {"Args": {"k;x": "v=w;z"}}}]
    assert cni_args(Allocation.from_json(doc))["k;x"] == "v=w;z"


def test_with_args_and_tproxy() -> None:
    # Nomad's TestSetup "with args and tproxy".
    doc = mock_connect_alloc()
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
    alloc = Allocation.from_json(doc)
    node = Node(
        attributes={"unique.consul.dns.addr": "192.168.1.117", "consul.dns.port": "8600"},
        meta={
            "connect.transparent_proxy.default_outbound_port": "15001",
            "connect.transparent_proxy.default_uid": "101",
        },
    )
    spec_path = "/var/run/docker/netns/nonsense-ns"
    tproxy = transparent_proxy_config(alloc, node, spec_path, port_mappings(alloc, True))
    assert cni_args(alloc, tproxy) == {
        "IgnoreUnknown": "true",
        "extra_arg": "example",
        "CONSUL_IPTABLES_CONFIG": '{"ConsulDNSIP":"192.168.1.117","ConsulDNSPort":8600,"ProxyUserID":"101",'
        '"ProxyInboundPort":9999,"ProxyOutboundPort":15001,"ExcludeInboundPorts":["9002"],'
        '"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":null,'
        '"NetNS":"/var/run/docker/netns/nonsense-ns","IptablesProvider":null}',
        **MOCK_WORKLOAD,
    }
    assert json.loads(cni_args(alloc, tproxy)["CONSUL_IPTABLES_CONFIG"])["IptablesProvider"] is None

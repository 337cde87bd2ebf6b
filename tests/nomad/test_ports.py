"""Port maps (Nomad's getPortMapping): two entries per port, tcp then udp, legacy vs current form."""

from __future__ import annotations

from typing import Any

import pytest

from pycni.nomad.models import Allocation
from pycni.nomad.ports import PortMapping, port_mappings

from .conftest import mock_connect_alloc


def _alloc(shared: dict[str, Any]) -> Allocation:
    doc = mock_connect_alloc()
    doc["AllocatedResources"] = {"Shared": shared}
    return Allocation.from_json(doc)


def _tuples(alloc: Allocation, ignore_host_ip: bool = False) -> list[tuple[str, int, int, str, str]]:
    maps = port_mappings(alloc, ignore_host_ip)
    return [(label, p.host_port, p.container_port, p.protocol, p.host_ip) for label, p in zip(maps.port_labels, maps)]


@pytest.mark.parametrize(
    ("ignore", "host_ip"),
    [(False, "10.0.0.5"), (True, "")],
)
def test_current_form_carries_host_ip_unless_ignored(ignore: bool, host_ip: str) -> None:
    alloc = _alloc({"Ports": [{"Label": "http", "Value": 25000, "To": 8080, "HostIP": "10.0.0.5"}]})
    assert _tuples(alloc, ignore) == [
        ("http", 25000, 8080, "tcp", host_ip),
        ("http", 25000, 8080, "udp", host_ip),
    ]


@pytest.mark.parametrize("to", [0, -1, -5])
def test_to_below_one_means_same_as_host_port(to: int) -> None:
    alloc = _alloc({"Ports": [{"Label": "db", "Value": 5432, "To": to}]})
    assert _tuples(alloc) == [("db", 5432, 5432, "tcp", ""), ("db", 5432, 5432, "udp", "")]


def test_legacy_networks_form_from_mock_connect_alloc() -> None:
    maps = port_mappings(Allocation.from_json(mock_connect_alloc()), False)
    assert [(p.host_port, p.container_port, p.protocol) for p in maps] == [(9999, 9999, "tcp"), (9999, 9999, "udp")]
    found = maps.get("connect-proxy-testconnect")
    assert found is not None and found.host_port == 9999


def test_legacy_form_lists_dynamic_before_reserved_and_never_sets_host_ip() -> None:
    alloc = _alloc(
        {
            "Networks": [
                {
                    "IP": "10.0.0.1",
                    "ReservedPorts": [
                        {"Label": "http", "Value": 9002, "To": 9002},
                        {"Label": "health", "Value": 9001, "To": 9000},
                    ],
                    "DynamicPorts": [{"Label": "connect-proxy-testconnect", "Value": 25018, "To": 25018}],
                }
            ],
            "Ports": [],
        }
    )
    maps = port_mappings(alloc, ignore_host_ip=False)
    assert [(label, p.protocol) for label, p in zip(maps.port_labels, maps)] == [
        ("connect-proxy-testconnect", "tcp"),
        ("connect-proxy-testconnect", "udp"),
        ("http", "tcp"),
        ("http", "udp"),
        ("health", "tcp"),
        ("health", "udp"),
    ]
    assert all(p.host_ip == "" for p in maps)
    assert maps.get("health").container_port == 9000  # type: ignore[union-attr]


def test_legacy_form_is_used_only_when_ports_are_empty(bridge_alloc: Allocation) -> None:
    # Shared.Ports and Shared.Networks both present: Ports wins, in its own order, with host IPs.
    assert _tuples(bridge_alloc)[::2] == [
        ("https", 8443, 443, "tcp", "192.168.56.11"),
        ("http", 23456, 80, "tcp", "192.168.56.11"),
        ("admin", 29871, 29871, "tcp", "192.168.56.11"),
    ]


def test_legacy_fixture(legacy_alloc: Allocation) -> None:
    assert _tuples(legacy_alloc)[::2] == [("stats", 27001, 9121, "tcp", ""), ("db", 6379, 6379, "tcp", "")]


def test_no_ports_and_no_networks_is_an_empty_list() -> None:
    maps = port_mappings(_alloc({}), False)
    assert maps.ports == () and len(maps) == 0 and maps.capability() == []


def test_label_lookup_returns_the_udp_entry_and_the_last_duplicate() -> None:
    alloc = _alloc({"Ports": [{"Label": "x", "Value": 1000, "To": 1}, {"Label": "x", "Value": 2000, "To": 2}]})
    maps = port_mappings(alloc, False)
    assert maps.get("x") == PortMapping(2000, 2, "udp")
    assert maps.get("x") is maps.ports[3]
    assert maps.get("missing") is None


def test_port_numbers_wrap_like_gos_int32_conversion() -> None:
    alloc = _alloc({"Ports": [{"Label": "big", "Value": 2**32 + 80, "To": 2**31}]})
    assert _tuples(alloc)[0][1:3] == (80, -(2**31))


def test_capability_entries_use_cni_keys_and_host_ip_only_when_set() -> None:
    alloc = _alloc(
        {"Ports": [{"Label": "a", "Value": 1, "To": 2, "HostIP": "192.0.2.1"}, {"Label": "b", "Value": 3, "To": 4}]}
    )
    assert port_mappings(alloc, False).capability() == [
        {"hostPort": 1, "containerPort": 2, "protocol": "tcp", "hostIP": "192.0.2.1"},
        {"hostPort": 1, "containerPort": 2, "protocol": "udp", "hostIP": "192.0.2.1"},
        {"hostPort": 3, "containerPort": 4, "protocol": "tcp"},
        {"hostPort": 3, "containerPort": 4, "protocol": "udp"},
    ]

"""Fixtures for the Nomad configurator tests: Nomad API JSON documents and Nomad's mock alloc."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pycni.nomad.models import Allocation, Node

FIXTURES = Path(__file__).with_name("fixtures")

MOCK_ALLOC_ID = "7cd08c6c-86c8-0bfa-f7ca-338466447711"


def fixture_json(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def mock_connect_alloc() -> dict[str, Any]:
    """Nomad's ``mock.ConnectAlloc()`` (as the API would serialise it), with TestSetup's fixed IDs."""
    return {
        "ID": MOCK_ALLOC_ID,
        "Namespace": "default",
        "TaskGroup": "web",
        "Job": {
            "ID": "mock-service",
            "Region": "global",
            "TaskGroups": [
                {
                    "Name": "web",
                    "Networks": [{"Mode": "bridge"}],
                    "Services": [{"Name": "testconnect", "PortLabel": "9999", "Connect": {"SidecarService": {}}}],
                }
            ],
        },
        "AllocatedResources": {
            "Shared": {
                "DiskMB": 150,
                "Networks": [
                    {
                        "Mode": "bridge",
                        "IP": "10.0.0.1",
                        "DynamicPorts": [{"Label": "connect-proxy-testconnect", "Value": 9999, "To": 9999}],
                    }
                ],
            }
        },
    }


def group(alloc: dict[str, Any]) -> dict[str, Any]:
    return alloc["Job"]["TaskGroups"][0]


@pytest.fixture
def mock_alloc() -> dict[str, Any]:
    return mock_connect_alloc()


@pytest.fixture
def tproxy_alloc() -> Allocation:
    return Allocation.from_json(fixture_json("connect_tproxy_alloc.json"))


@pytest.fixture
def bridge_alloc() -> Allocation:
    return Allocation.from_json(fixture_json("bridge_ports_alloc.json"))


@pytest.fixture
def legacy_alloc() -> Allocation:
    return Allocation.from_json(fixture_json("legacy_networks_alloc.json"))


@pytest.fixture
def node_json() -> dict[str, Any]:
    return copy.deepcopy(fixture_json("node.json"))


@pytest.fixture
def node(node_json: dict[str, Any]) -> Node:
    return Node.from_json(node_json)

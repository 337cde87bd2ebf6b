"""The one ``portMappings`` entry: what go-cni/Nomad emit is what the portmap plugin decodes."""

from __future__ import annotations

from typing import Any

import pytest

from pycni import client, nomad
from pycni.errors import CNIError, ErrorCode
from pycni.types import PortMapping
from pycni_plugins import portmap


def test_client_nomad_and_plugin_share_one_class() -> None:
    assert client.PortMapping is nomad.PortMapping is PortMapping
    config = {"runtimeConfig": {"portMappings": [PortMapping(8080, 80, "udp", "192.0.2.1").to_json()]}}
    assert portmap.parse_mappings(config) == [PortMapping(8080, 80, "udp", "192.0.2.1")]


def test_to_json_emits_host_ip_only_when_set() -> None:
    assert PortMapping(80, 8080).to_json() == {"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}
    assert PortMapping(80, 8080, host_ip="::1").to_json()["hostIP"] == "::1"


def test_from_json_matches_go_field_names_and_lowers_the_protocol() -> None:
    decoded = PortMapping.from_json({"HostPort": 1, "CONTAINERPORT": 2, "Protocol": "UDP", "hostip": "::"})
    assert decoded == PortMapping(1, 2, "udp", "::")
    assert PortMapping.from_json({"hostPort": 1, "containerPort": 2, "protocol": None}).protocol == "tcp"


def test_from_json_takes_the_later_of_two_keys_reaching_a_field_as_go_does() -> None:
    from pycni._json import loads

    assert PortMapping.from_json({"hostPort": 1, "HOSTPORT": 3, "containerPort": 2}).host_port == 3
    repeated = loads('{"hostPort": 1, "HostPort": 5, "hostPort": 4, "containerPort": 2, "extra": 0}')
    assert PortMapping.from_json(repeated) == PortMapping(4, 2)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ([], "invalid port mapping"),
        ({"hostPort": 1, "containerPort": 0}, "Invalid container port number: 0"),
        ({"hostPort": 65536, "containerPort": 1}, "Invalid host port number: 65536"),
        ({"hostPort": True, "containerPort": 1}, "Invalid host port number: True"),
        ({"hostPort": 1, "containerPort": 1, "protocol": "icmp"}, 'unknown protocol "icmp"'),
        ({"hostPort": 1, "containerPort": 1, "hostIP": 7}, 'invalid host ip "7" provided for port 1'),
    ],
)
def test_from_json_refuses_bad_entries_with_code_999(entry: Any, message: str) -> None:
    with pytest.raises(CNIError, match=message) as caught:
        PortMapping.from_json(entry)
    assert caught.value.code == ErrorCode.INTERNAL

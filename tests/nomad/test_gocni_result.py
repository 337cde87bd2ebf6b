"""go-cni's createResult as the configurator consumes it (go-cni cni_test.go, the Result parts)."""

from __future__ import annotations

from typing import Any

import pytest

from pycni.errors import ResultError
from pycni.gocni_result import GoCNIResult
from pycni.nomad.errors import StatusError
from pycni.nomad.status import alloc_net_status
from pycni.types import parse_result


def create_result(*results: dict[str, Any], prefix: str = "eth") -> GoCNIResult:
    return GoCNIResult.from_results([parse_result(r) for r in results], default_ifname=f"{prefix}0")


def ips(res: GoCNIResult, name: str) -> list[str]:
    return [str(c.ip) for c in res.interfaces[name].ip_configs]


def test_type020_results_without_interfaces_all_land_on_the_default_interface() -> None:
    res = create_result(
        {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.1/24"}},
        {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}},
    )
    assert ips(res, "eth0") == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.parametrize("version", ["0.3.1", "1.0.0"])
def test_type040_and_type100_ips_land_on_their_interface(version: str) -> None:
    def network(name: str, address: str, gateway: str) -> dict[str, Any]:
        ip: dict[str, Any] = {"interface": 0, "address": address, "gateway": gateway}
        if version == "0.3.1":
            ip["version"] = "4"
        return {"cniVersion": version, "interfaces": [{"name": name}], "ips": [ip]}

    res = create_result(network("eth0", "10.0.0.1/24", "10.0.0.255"), network("eth1", "10.0.0.2/24", "10.0.0.2"))
    assert ips(res, "eth0") == ["10.0.0.1"]
    assert ips(res, "eth1") == ["10.0.0.2"]
    assert [str(c.gateway) for c in res.interfaces["eth0"].ip_configs] == ["10.0.0.255"]


def test_type120_loopback_then_primary_network() -> None:
    lo = {"cniVersion": "0.3.1", "interfaces": [{"name": "lo"}], "ips": [{"interface": 0, "address": "127.0.0.1/8"}]}
    primary = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0"}],
        "ips": [{"interface": 0, "address": "10.88.0.1/16", "gateway": "10.88.0.1"}],
    }
    res = create_result(lo, primary)
    assert ips(res, "eth0") == ["10.88.0.1"]
    assert ips(res, "lo") == ["127.0.0.1"]
    # No sandbox on either: the fallback pass picks the first by name, "eth0".
    assert alloc_net_status(res).interface_name == "eth0"


def test_default_interface_is_always_present_and_dns_has_one_entry_per_network() -> None:
    res = create_result({"cniVersion": "1.0.0"}, {"cniVersion": "1.0.0", "dns": {"nameservers": ["1.1.1.1"]}})
    assert "eth0" in res.interfaces and res.interfaces["eth0"].ip_configs == ()
    assert len(res.dns) == 2 and not res.dns[0].nameservers
    # Nomad reads only the first entry: no DNS although the second network has servers.
    with pytest.raises(StatusError, match="no interface with an address"):
        alloc_net_status(res)


def test_later_interface_of_the_same_name_replaces_the_earlier_one() -> None:
    first = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0"}],
        "ips": [{"interface": 0, "address": "10.0.0.1/24"}],
    }
    second = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}]}
    res = create_result(first, second)
    assert res.interfaces["eth0"].ip_configs == () and res.interfaces["eth0"].sandbox == "/x"


def test_interface_index_equal_to_the_count_is_an_invalid_result() -> None:
    bad = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}], "ips": [{"interface": 1, "address": "10.0.0.1/24"}]}
    with pytest.raises(ResultError):
        create_result(bad)

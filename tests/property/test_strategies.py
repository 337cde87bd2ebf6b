"""pycni.testing.strategies gives what it says: valid values are accepted by pycni's own parsers and
plugins, hostile ones are rejected cleanly, and the module explains itself without hypothesis."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycni.config import conf_from_bytes, conflist_from_bytes
from pycni.errors import CNIError, ConfigError, ResultError
from pycni.sdk import PluginRequest, builtin_plugin, parse_cni_args
from pycni.testing import strategies as cs
from pycni.types import parse_result

SETTINGS = settings(max_examples=100, deadline=None, database=None)
TEST_NETS = [ipaddress.ip_network("198.18.0.0/15"), ipaddress.ip_network("fd00:18::/48")]


@SETTINGS
@given(st.data())
def test_results_of_a_version_parse_back_at_that_version(data):
    version = data.draw(st.sampled_from(cs.VERSIONS))
    result = data.draw(cs.results(version=version))
    assert result.cni_version == version
    assert parse_result(json.dumps(result.to_json()).encode()) == result


def test_results_of_an_unknown_version_are_refused():
    with pytest.raises(ValueError, match="unknown CNI version '9.9.9'"):
        cs.results(version="9.9.9")


@SETTINGS
@given(st.data())
def test_attachment_results_are_valid_and_inside_the_test_subnets(data):
    version = data.draw(st.sampled_from(cs.VERSIONS))
    result = data.draw(cs.attachment_results(version, ifname="net1", sandbox="/run/netns/x"))
    parsed = parse_result(json.dumps(result.to_json()).encode())
    assert parsed.cni_version == version
    ips = [ip.address.ip for ip in parsed.ips] if hasattr(parsed, "ips") else []
    ips += [c.ip.ip for c in (getattr(parsed, "ip4", None), getattr(parsed, "ip6", None)) if c is not None]
    assert ips and all(any(ip in net for net in TEST_NETS) for ip in ips)


@SETTINGS
@given(cs.network_configs(prev_result=True, data_dir="/tmp/never-used"))
def test_network_configs_parse_and_pass_the_builtin_plugins_validation(conf):
    net = conf_from_bytes(json.dumps(conf).encode())
    assert net.raw == conf
    plugin = builtin_plugin(conf["type"])
    if plugin is not None:  # validation changes nothing: safe to run here
        plugin.validate(PluginRequest("ADD", conf, "cid", "/run/netns/x", "eth0"))


@SETTINGS
@given(cs.conflists(data_dir="/tmp/never-used"))
def test_conflists_parse_with_every_plugin_kept(doc):
    net = conflist_from_bytes(json.dumps(doc).encode())
    assert (net.cni_version, net.name) == (doc["cniVersion"], doc["name"])
    assert [p.raw["type"] for p in net.plugins] == [p["type"] for p in doc["plugins"]]


@SETTINGS
@given(st.data())
def test_every_family_gives_addresses_of_each_family_within_has(data):
    within = data.draw(st.sampled_from([TEST_NETS[:1], TEST_NETS[1:], TEST_NETS]))
    wanted = {n.version for n in within}
    plugin_type = data.draw(st.sampled_from(["bridge", "ptp", "macvlan", "static"]))
    conf = data.draw(cs.network_configs(plugin_type, within=within, every_family=True))
    ipam = conf["ipam"]
    found = [r["subnet"] for rs in ipam.get("ranges", []) for r in rs] + [
        a["address"] for a in ipam.get("addresses", [])
    ]
    assert sorted(ipaddress.ip_interface(a).version for a in found) == sorted(wanted)
    result = data.draw(cs.attachment_results(within=within, every_family=True))
    addresses = (
        [c.ip for c in (result.ip4, result.ip6) if c] if hasattr(result, "ip4") else [i.address for i in result.ips]
    )
    assert sorted(a.version for a in addresses) == sorted(wanted)


@SETTINGS
@given(cs.hostile_bytes(cs.results().map(lambda r: r.to_json())))
def test_hostile_bytes_of_results_are_rejected_or_parse_to_a_result(data):
    assert isinstance(data, bytes)
    try:
        parse_result(data)
    except ResultError as e:
        assert e.code == 6


def test_hostile_bytes_cover_bad_utf8_deep_nesting_duplicates_and_huge_numbers():
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(cs.hostile_bytes(st.just({"cniVersion": "1.0.0", "ips": [{"address": "198.18.0.2/24"}]})))
    def collect(data):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            seen.add("utf8")
        if b"[[[[[[[[" in data or b'{"a":{"a":{"a":' in data:
            seen.add("nesting")
        if data.count(b'"cniVersion"') == 2:
            seen.add("duplicate")
        if b"0" * 300 in data or b"9" * 300 in data or b"e400" in data:
            seen.add("huge")

    collect()
    assert seen == {"utf8", "nesting", "duplicate", "huge"}


@SETTINGS
@given(cs.mutated(cs.conflists()))
def test_mutated_conflists_parse_or_raise_config_error(doc):
    try:
        conflist_from_bytes(json.dumps(doc).encode())
    except ConfigError:
        pass


@SETTINGS
@given(cs.hostile_bytes(cs.conflists()))
def test_hostile_conflist_bytes_parse_or_raise_config_error(data):
    try:
        conflist_from_bytes(data)
    except ConfigError:
        pass


def test_mutations_replace_remove_and_push_indexes_out_of_range():
    base = {"ips": [{"address": "198.18.0.2/24", "interface": 1}], "x": "y"}
    kinds: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(cs.mutations(base, max_mutations=1))
    def collect(doc):
        if isinstance(doc, dict) and "x" not in doc:
            kinds.add("removed")
        ips = doc.get("ips") if isinstance(doc, dict) else None
        if isinstance(ips, list) and ips and isinstance(ips[0], dict) and ips[0].get("interface") in (-1, 2**31, 2**63):
            kinds.add("index")
        if isinstance(doc, dict) and len(doc) > 2:
            kinds.add("added")

    collect()
    assert kinds == {"removed", "index", "added"}


@SETTINGS
@given(cs.cni_environments("ADD", netns="/run/netns/x"))
def test_valid_environments_are_what_a_runtime_sets(env):
    assert env["CNI_COMMAND"] == "ADD" and env["CNI_NETNS"] == "/run/netns/x"
    assert 0 < len(env["CNI_IFNAME"]) <= 15 and "/" not in env["CNI_CONTAINERID"]
    if "CNI_ARGS" in env:
        parse_cni_args(env["CNI_ARGS"])


@settings(max_examples=30, deadline=None, database=None)
@given(cs.cni_environments("ADD", hostile=True))
def test_hostile_environments_can_still_be_passed_to_a_process(env):
    assert all("\x00" not in v for v in env.values())
    out = subprocess.run(["env"], env=env, capture_output=True, check=True).stdout  # would raise on NUL/surrogates
    assert all(f"{k}=".encode() in out for k in env)


@SETTINGS
@given(cs.capability_args())
def test_capability_args_are_what_the_builtin_plugins_accept(caps):
    assert set(caps) <= {"portMappings", "ipRanges", "bandwidth", "dns"}
    for mapping in caps.get("portMappings", []):
        assert 1 <= mapping["hostPort"] <= 65535 and mapping["protocol"] in ("tcp", "udp", "sctp")
    portmap = builtin_plugin("portmap")
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "portmap", "runtimeConfig": caps}
    try:
        portmap.validate(PluginRequest("ADD", conf, "cid", "/run/netns/x", "eth0"))
    except CNIError as e:  # only a host IP the container's family lacks is refused without a prevResult
        assert "hostIP" in str(e) or "prevResult" in str(e), e
    bandwidth = builtin_plugin("bandwidth")
    if bandwidth is not None and "bandwidth" in caps:
        prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "veth0"}, {"name": "eth0", "sandbox": "/x"}]}
        conf = {"cniVersion": "1.0.0", "name": "n", "type": "bandwidth", "prevResult": prev, "runtimeConfig": caps}
        bandwidth.validate(PluginRequest("ADD", conf, "cid", "/run/netns/x", "eth0"))
    for ranges in caps.get("ipRanges", []):
        assert all(
            any(
                ipaddress.ip_network(r["subnet"]).subnet_of(n)
                for n in TEST_NETS
                if n.version == ipaddress.ip_network(r["subnet"]).version
            )
            for r in ranges
        )


@pytest.mark.parametrize("module", ["pycni.testing.strategies", "pycni.strategies"])
def test_import_without_hypothesis_says_how_to_install_it(module):
    code = f"import sys; sys.modules['hypothesis'] = None\nimport {module}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert (
        "ImportError: pycni.testing.strategies needs hypothesis, which is not installed: pip install 'pycni[fuzz]'"
        in proc.stderr
    )


def test_the_first_published_path_is_the_same_module():
    import pycni.strategies

    assert pycni.strategies.__all__ == cs.__all__
    assert all(getattr(pycni.strategies, name) is getattr(cs, name) for name in cs.__all__)

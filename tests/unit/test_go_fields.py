"""Go's struct-field matching (exact key, else case-folded; maps exact), one rule at every site
where Go decodes into a struct: runtime configs and results, Nomad's models, the plugins."""

from __future__ import annotations

import pytest

from pycni._json import GoFields, go_field, loads
from pycni.nomad.models import Allocation
from pycni.sdk import PluginRequest
from pycni_plugins import bridge, host_local, portmap
from pycni_plugins.consul_tproxy import decode_config
from tests.nomad.conftest import group, mock_connect_alloc

LONG_S, KELVIN = "\u017f", "\u212a"  # fold onto "s" and "k" in Go; nothing else non-ASCII reaches ASCII


def test_exact_name_first_then_the_first_field_equal_under_folding():
    fields = GoFields("ip", "IP", "name")
    assert [fields.lookup(k) for k in ("IP", "ip", "Ip", "NAME", f"na{KELVIN}e", "other", 5)] == [
        "IP",
        "ip",
        "ip",
        "name",
        None,
        None,
        None,
    ]
    assert GoFields("kind").lookup(f"{KELVIN}ind") == "kind"
    assert GoFields("search").lookup(f"{LONG_S}earch") == "search"


@pytest.mark.parametrize("key", ["Ho\ufb06Network", "Addre\u00df", "\u0130d"])
def test_unicode_case_folding_beyond_gos_simple_folds_matches_nothing(key):
    # Python's casefold maps the st ligature to "st", sharp s to "ss"; Go's EqualFold does not.
    assert GoFields("HostNetwork", "Address", "id").lookup(key) is None


def test_a_later_key_for_the_same_field_wins_repeated_or_differently_cased():
    assert go_field(loads(b'{"name": "a", "Name": "b"}'), "name") == "b"
    assert go_field(loads(b'{"name": "a", "name": "b"}'), "name") == "b"
    assert GoFields("name").pick(loads(b'{"Name": "a", "name": "b"}')) == {"name": "b"}


def test_nomad_models_fold_as_go_not_as_python_casefold():
    doc = mock_connect_alloc()
    group(doc)["Networks"][0]["DynamicPorts"] = [{"Label": "a", "Value": 1, "Ho\ufb06Network": "x"}]
    assert Allocation.from_json(doc).group.networks[0].dynamic_ports[0].host_network == ""
    group(doc)["Networks"][0]["DynamicPorts"] = [{"Label": "a", "Value": 1, f"Ho{LONG_S}tNetwork": "x"}]
    assert Allocation.from_json(doc).group.networks[0].dynamic_ports[0].host_network == "x"


def request(config):
    return PluginRequest("ADD", config, container_id="c1", netns="/run/netns/x", ifname="eth0")


def test_plugin_request_reads_the_netconf_fields_as_a_go_plugin_does():
    req = request({"CNIVersion": "1.0.0", "Name": "n", "PrevResult": {"a": 1}, "RuntimeConfig": {"b": 2}})
    assert (req.cni_version, req.network_name, req.prev_result, req.runtime_config) == (
        "1.0.0",
        "n",
        {"a": 1},
        {"b": 2},
    )


def test_host_local_folds_the_long_s_as_go(tmp_path):
    config = {"cniVersion": "1.0.0", "name": "n", "type": "bridge"}
    config["ipam"] = {"type": "host-local", "dataDir": str(tmp_path), f"{LONG_S}ubnet": "198.18.0.0/24"}
    conf = host_local.load_config(request(config))
    assert [str(r.subnet) for rs in conf.range_sets for r in rs] == ["198.18.0.0/24"]


def test_portmap_mappings_and_their_runtime_config_fold_as_go():
    config = {"RuntimeConfig": {"PortMappings": [{f"ho{LONG_S}tPort": 8080, "containerPort": 80}]}}
    assert [(m.host_port, m.container_port) for m in portmap.parse_mappings(config)] == [(8080, 80)]


def test_portmap_options_and_the_mappings_its_plugin_reads_fold_as_go():
    from pycni.errors import CNIError, ErrorCode

    def validate(**config: object) -> None:
        portmap.PortmapPlugin().validate(request({"cniVersion": "1.0.0", "name": "n", "type": "portmap", **config}))

    with pytest.raises(CNIError, match="MasqMarkBit must be between 0 and 31"):
        validate(MarkMasqBit=32)
    with pytest.raises(CNIError, match="Cannot specify externalSetMarkChain and markMasqBit"):
        validate(markmasqbit=3, ExternalSetMarkChain="X")
    for key, value in (("ExternalSetMarkChain", "X"), ("ConditionsV4", ["x"]), (f"condition{LONG_S}V6", ["x"])):
        with pytest.raises(CNIError, match="is not supported by pycni's nftables portmap") as raised:
            validate(**{key: value})
        assert raised.value.code == ErrorCode.UNSUPPORTED_FIELD
    validate(**loads(b'{"markMasqBit": 32, "MarkMasqBit": 31}'))  # the later key wins
    with pytest.raises(CNIError, match="failed to parse config: invalid port mapping"):
        validate(RuntimeConfig={"portMappings": [1]})
    validate(runtimeConfig=[{"portMappings": [1]}])  # not an object: read as no mappings
    with pytest.raises(CNIError, match="duplicate port mapping"):
        maps = b'[{"hostPort": 1, "containerPort": 2}, {"HostPort": 1, "containerPort": 3}]'
        validate(**loads(b'{"runtimeConfig": {}, "runtimeconfig": {"portMappings": ' + maps + b"}}"))


def test_bridge_dns_folds_as_go():
    conf = bridge.load_config(
        request({"cniVersion": "1.0.0", "name": "n", "type": "bridge", "DNS": {"nameservers": ["198.18.0.1"]}})
    )
    assert conf.dns is not None and conf.dns.nameservers == ("198.18.0.1",)
    repeated = loads(b'{"cniVersion": "1.0.0", "name": "n", "dns": {"domain": "a"}, "Dns": {"domain": "b"}}')
    assert bridge.load_config(request(repeated)).dns.domain == "b"  # type: ignore[union-attr]


def test_consul_tproxy_config_folds_the_long_s_as_go():
    assert decode_config(f'{{"ExcludeUID{LONG_S}": ["7"]}}').exclude_uids == ("7",)


def test_reference_plugin_config_fields_fold_as_go():
    conf = bridge.load_config(request({"cniVersion": "1.0.0", "name": "n", "type": "bridge", "IsGateway": True}))
    assert conf.is_gateway


def test_the_reader_decodes_like_go_and_names_the_struct_field():
    from pycni._json import GoReader, GoValueError

    f = GoReader(loads(b'{"MTU": 1500, "name": "a\\ud800", "up": null, "ips": null}'), "NetConf")
    assert (f.integer("mtu"), f.string("name"), f.flag("up", True), f.array("ips")) == (1500, "a\ufffd", True, [])
    for doc, read, go, problem in [
        (
            b'{"mtu": "1"}',
            lambda r: r.integer("mtu"),
            "string into Go struct field NetConf.mtu of type int",
            "a string",
        ),
        (b'{"mtu": 1.0}', lambda r: r.integer("mtu"), "number into Go struct field NetConf.mtu of type int", "1.0"),
        (b'{"up": 1}', lambda r: r.flag("up"), "number into Go struct field NetConf.up of type bool", "a number"),
        (b'{"m": []}', lambda r: r.mapping("m"), "array into Go struct field NetConf.m of type object", "an array"),
    ]:
        with pytest.raises(GoValueError) as info:
            read(GoReader(loads(doc), "NetConf"))
        assert info.value.go_message() == f"json: cannot unmarshal {go}"
        assert info.value.problem().endswith(f"got {problem}")
    with pytest.raises(GoValueError) as info:
        GoReader({"mtu": 2**63}, "NetConf").integer("mtu")
    assert (
        info.value.go_message() == f"json: cannot unmarshal number {2**63} into Go struct field NetConf.mtu of type int"
    )
    assert info.value.problem() == f"integer {2**63} out of range"

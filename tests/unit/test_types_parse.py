"""parse_result(): libcni's version fixup, Go's decoding rules, and errors that say what and where."""

from __future__ import annotations

import json
from ipaddress import ip_address, ip_interface

import pytest

from pycni.errors import ErrorCode, ResultError
from pycni.types import (
    DNS,
    Interface,
    IPConfig,
    IPConfig020,
    IPConfig040,
    Result,
    Result020,
    Result040,
    Route,
    parse_result,
)

V4 = '{"version": "4", "address": "1.2.3.4/24"}'


# --- version fixup (invoke/exec.go fixupResultVersion + create.Create) -----------------------


@pytest.mark.parametrize(
    ("stdout", "config_version", "model", "version"),
    [
        pytest.param('{"ips": [' + V4 + "]}", "0.3.1", Result040, "0.3.1", id="missing-takes-config-version"),
        pytest.param('{"cniVersion": "", "ips": [' + V4 + "]}", "0.3.1", Result040, "0.3.1", id="empty-takes-config"),
        pytest.param('{"cniVersion": 5}', "1.0.0", Result, "1.0.0", id="non-string-takes-config"),
        pytest.param('{"cniVersion": null}', "0.2.0", Result020, "0.2.0", id="null-takes-config"),
        pytest.param('{"some": "version-info"}', "", Result020, "0.1.0", id="both-empty-means-0.1.0"),
        pytest.param("null", "1.1.0", Result, "1.1.0", id="null-stdout-is-empty-object"),
        pytest.param('{"cniVersion": "1.0.0"}', "0.4.0", Result, "1.0.0", id="other-known-version-kept-as-is"),
        pytest.param('{"cniVersion": "0.2.0"}', "1.1.0", Result020, "0.2.0", id="older-version-kept-as-is"),
        pytest.param("{}", None, Result020, "0.1.0", id="no-config-missing-means-0.1.0"),
        pytest.param('{"cniVersion": ""}', None, Result020, "0.1.0", id="no-config-empty-means-0.1.0"),
    ],
)
def test_version_fixup_follows_libcni(stdout, config_version, model, version):
    result = parse_result(stdout, config_version=config_version)
    assert type(result) is model
    assert result.cni_version == version


@pytest.mark.parametrize(
    ("version", "model"),
    [
        ("0.1.0", Result020),
        ("0.2.0", Result020),
        ("0.3.0", Result040),
        ("0.3.1", Result040),
        ("0.4.0", Result040),
        ("1.0.0", Result),
        ("1.1.0", Result),
    ],
)
def test_each_known_version_decodes_into_its_model(version, model):
    result = parse_result(json.dumps({"cniVersion": version}))
    assert type(result) is model and result.cni_version == version


def test_without_config_version_the_version_key_matches_like_gos_decode_version():
    result = parse_result({"CNIVersion": "1.0.0", "ips": [{"address": "10.0.0.2/8"}]})
    assert (result.cni_version, len(result.ips)) == ("1.0.0", 1)


def test_plugin_output_version_key_is_read_from_a_map_exactly_as_libcni_fixup_does():
    assert parse_result({"CNIVersion": "0.4.0"}, config_version="1.0.0").cni_version == "1.0.0"


@pytest.mark.parametrize("version", ["9.9.9", "1.0", "v1.0.0", "1.0.0 ", "1.2.0"])
def test_unknown_result_version_is_unsupported(version):
    with pytest.raises(ResultError, match=f'^unsupported CNI result version "{version}"$') as info:
        parse_result(json.dumps({"cniVersion": version}))
    assert info.value.code == ErrorCode.DECODING_FAILURE


def test_unknown_config_version_is_unsupported_when_the_result_has_none():
    with pytest.raises(ResultError, match='^unsupported CNI result version "2.0.0"$'):
        parse_result(b"{}", config_version="2.0.0")


def test_non_string_version_without_config_version_is_an_error():
    with pytest.raises(ResultError, match="^invalid result: cniVersion: expected a string, got an array$"):
        parse_result('{"cniVersion": []}')


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b'{"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]}', id="bytes"),
        pytest.param('{"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]}', id="str"),
        pytest.param(bytearray(b'{"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]}'), id="bytearray"),
        pytest.param(memoryview(b'{"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]}'), id="memoryview"),
        pytest.param({"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]}, id="decoded"),
        pytest.param(b' \r\n\t{"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]}\n', id="json-whitespace"),
    ],
)
def test_accepts_bytes_text_and_decoded_json(data):
    assert parse_result(data) == Result("1.0.0", ips=[IPConfig(ip_interface("10.1.2.3/24"))])


# --- Go's decoding rules ---------------------------------------------------------------------


def one(doc: dict) -> Result:
    result = parse_result({"cniVersion": "1.1.0", **doc})
    assert isinstance(result, Result)
    return result


def test_null_and_missing_fields_are_zero_values():
    result = one(
        {
            "interfaces": [{"name": None, "mac": None, "mtu": None}],
            "ips": [{"address": "10.0.0.2/8", "gateway": None, "interface": None}],
            "routes": [{"dst": "0.0.0.0/0", "gw": None, "table": None, "scope": None, "mtu": None}],
            "dns": None,
        }
    )
    assert result == Result(
        "1.1.0",
        interfaces=[Interface("")],
        ips=[IPConfig(ip_interface("10.0.0.2/8"))],
        routes=[Route(ip_interface("0.0.0.0/0"))],
    )
    assert one({"interfaces": None, "ips": None, "routes": None}) == Result("1.1.0")


def test_empty_gateway_string_means_no_gateway():
    assert one({"ips": [{"address": "10.0.0.2/8", "gateway": ""}]}).ips[0].gateway is None


def test_null_string_list_entries_become_empty_strings():
    assert one({"dns": {"nameservers": ["1.1.1.1", None]}}).dns == DNS(["1.1.1.1", ""])


def test_interface_index_absent_differs_from_zero_and_may_be_negative():
    ips = one(
        {
            "ips": [
                {"address": "10.0.0.2/8"},
                {"address": "10.0.0.3/8", "interface": 0},
                {"address": "10.0.0.4/8", "interface": -1},
            ]
        }
    ).ips
    assert [ip.interface for ip in ips] == [None, 0, -1]


def test_go_int_fields_accept_the_int64_range():
    route = one(
        {"routes": [{"dst": "0.0.0.0/0", "mtu": -(2**63), "priority": 2**63 - 1, "table": 0, "scope": 0}]}
    ).routes[0]
    assert (route.mtu, route.priority, route.table, route.scope) == (-(2**63), 2**63 - 1, 0, 0)


def test_unknown_keys_are_ignored_whatever_their_value():
    assert one({"extra": [1, {"x": None}], "ips": [{"address": "10.0.0.2/8", "weird": True}]}) == one(
        {"ips": [{"address": "10.0.0.2/8"}]}
    )


def test_keys_match_fields_case_insensitively_as_in_go():
    result = parse_result(
        '{"cniVersion": "1.1.0", "IPS": [{"Address": "10.0.0.2/8", "GATEWAY": "10.0.0.1"}],'
        ' "Routes": [{"DST": "0.0.0.0/0", "\u017fcope": 253}],'  # ſ folds to s in Go
        ' "interfaces": [{"NAME": "eth0", "socketpath": "/s", "PCIID": "p", "MTU": 9000}]}'
    )
    assert result == Result(
        "1.1.0",
        interfaces=[Interface("eth0", mtu=9000, socket_path="/s", pci_id="p")],
        ips=[IPConfig(ip_interface("10.0.0.2/8"), ip_address("10.0.0.1"))],
        routes=[Route(ip_interface("0.0.0.0/0"), scope=253)],
    )


def test_decoded_input_with_non_string_keys_ignores_them():
    doc = {"cniVersion": "1.0.0", 1: "x", None: [], "ips": [{"address": "10.0.0.2/8", 2.5: {}}]}
    assert parse_result(doc) == Result("1.0.0", ips=[IPConfig(ip_interface("10.0.0.2/8"))])


def test_case_folded_key_later_in_the_object_wins_like_go():
    assert one({"interfaces": [{"name": "first", "Name": "second"}]}).interfaces[0].name == "second"


# libcni decodes plugin output into Go structs, which decode a repeated key's values in turn.
def test_repeated_interfaces_key_merges_its_elements_like_go():
    result = parse_result(
        b'{"cniVersion": "1.0.0", "interfaces": [{"name": "a", "mac": "m"}], "interfaces": [{"name": "b"}]}'
    )
    assert result.interfaces == (Interface("b", mac="m"),)


def test_repeated_dns_key_merges_its_members_like_go():
    result = parse_result(b'{"cniVersion": "1.0.0", "dns": {"domain": "d", "search": ["x"]}, "dns": {"search": ["y"]}}')
    assert result.dns == DNS(domain="d", search=("y",))


def test_repeated_ips_key_replaces_each_ip_whole_as_its_go_unmarshaler_does():
    result = parse_result(
        b'{"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/8", "gateway": "10.0.0.1"}],'
        b' "ips": [{"address": "10.0.0.3/8"}]}'
    )
    assert result.ips == (IPConfig(ip_interface("10.0.0.3/8")),)


def test_repeated_key_null_keeps_a_struct_and_clears_a_slice_like_go():
    result = parse_result(
        b'{"cniVersion": "1.0.0", "dns": {"domain": "d"}, "dns": null,'
        b' "interfaces": [{"name": "a"}], "interfaces": null}'
    )
    assert (result.dns, result.interfaces) == (DNS(domain="d"), ())


@pytest.mark.parametrize(
    "doc",
    [
        b'{"cniVersion": "1.0.0", "routes": {}, "routes": []}',
        b'{"cniVersion": "1.0.0", "interfaces": [5], "interfaces": [{"name": "a"}]}',
        b'{"cniVersion": "1.0.0", "ips": [5], "ips": [{"address": "10.0.0.2/8"}]}',
        b'{"cniVersion": "0.4.0", "dns": {"domain": 1}, "DNS": {"domain": "d"}}',
    ],
)
def test_repeated_key_with_clashing_types_fails_like_go(doc):
    with pytest.raises(ResultError, match="clashing types"):
        parse_result(doc)


@pytest.mark.parametrize(
    ("cidr", "canonical"),
    [
        ("10.1.2.3/24", "10.1.2.3/24"),
        ("10.1.2.3/024", "10.1.2.3/24"),  # Go's dtoi takes leading zeros in the prefix
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("FD00::1:2/64", "fd00::1:2/64"),
        ("::ffff:1.2.3.4/120", "1.2.3.4/24"),  # IPv4-mapped is IPv4 (Go To4), prefix - 96
        ("::ffff:102:304/100", "1.2.3.4/4"),
        ("::ffff:1.2.3.4/64", "1.2.3.4/0"),
        ("1::1.2.3.4/64", "1::102:304/64"),
    ],
)
def test_cidrs_parse_like_go_net_parsecidr(cidr, canonical):
    assert str(one({"ips": [{"address": cidr}]}).ips[0].address) == canonical


@pytest.mark.parametrize(("gateway", "canonical"), [("::ffff:10.0.0.1", "10.0.0.1"), ("FE80::A", "fe80::a")])
def test_gateways_parse_like_go_net_parseip(gateway, canonical):
    assert str(one({"ips": [{"address": "10.0.0.2/8", "gateway": gateway}]}).ips[0].gateway) == canonical


def test_lone_surrogate_escapes_become_replacement_characters_as_in_go():
    result = parse_result(b'{"cniVersion": "1.0.0", "interfaces": [{"name": "a\\ud800b"}]}')
    assert result.interfaces[0].name == "a\ufffdb"


def test_0_4_0_interfaces_ignore_1_1_fields_even_invalid_ones():
    result = parse_result({"cniVersion": "0.4.0", "interfaces": [{"name": "x", "mtu": "garbage", "pciID": 7}]})
    assert result == Result040("0.4.0", interfaces=[Interface("x")])


def test_0_4_0_ip_without_version_is_kept_with_an_empty_version():
    # The reference loopback plugin prints 1.x-shaped ips under cniVersion 0.3.x/0.4.0.
    loopback = {
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": "/run/netns/x"}],
        "ips": [{"interface": 0, "address": "127.0.0.1/8"}, {"interface": 0, "address": "::1/128"}],
    }
    result = parse_result(json.dumps(loopback))
    assert result.ips == (
        IPConfig040("", ip_interface("127.0.0.1/8"), interface=0),
        IPConfig040("", ip_interface("::1/128"), interface=0),
    )


def test_0_2_0_routes_keep_every_go_route_field():
    result = parse_result(
        '{"cniVersion": "0.2.0", "ip6": null,'
        ' "ip4": {"ip": "10.0.0.2/8", "routes": [{"dst": "0.0.0.0/0", "mtu": 1400, "scope": 0}]}}'
    )
    assert result == Result020(
        "0.2.0",
        ip4=IPConfig020(ip_interface("10.0.0.2/8"), routes=[Route(ip_interface("0.0.0.0/0"), mtu=1400, scope=0)]),
    )


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "failed to unmarshal raw result: unexpected end of JSON input"),
        ("  \n", "failed to unmarshal raw result: unexpected end of JSON input"),
        (b"\xff{}", "failed to unmarshal raw result: invalid UTF-8 at byte 0"),
        (b"[1]", "failed to unmarshal raw result: expected a JSON object, got an array"),
        ('"1.0.0"', "failed to unmarshal raw result: expected a JSON object, got a string"),
        ("{} {}", "failed to unmarshal raw result: Extra data at line 1 column 4"),
        ('{"x": NaN}', "failed to unmarshal raw result: invalid number literal NaN"),
        ('{"x": -Infinity}', "failed to unmarshal raw result: invalid number literal -Infinity"),
        ('{"x": 1e400}', "failed to unmarshal raw result: number 1e400 out of range"),
        ('{"x": -' + "9" * 400 + "}", "failed to unmarshal raw result: number -" + "9" * 39 + " out of range"),
        ('{"x": ' + "9" * 5000 + "}", "failed to unmarshal raw result: number " + "9" * 40 + " out of range"),
        ("[" * 50_000, "failed to unmarshal raw result: JSON nested too deeply"),
        ('{"cniVersion": "1.0.0", "routes": ["x"]}', "invalid result: routes[0]: expected an object, got a string"),
        ('{"cniVersion": "1.0.0", "routes": [null]}', "invalid result: routes[0]: expected an object, got null"),
        ('{"cniVersion": "1.0.0", "routes": {}}', "invalid result: routes: expected an array, got an object"),
        (
            '{"cniVersion": "1.0.0", "routes": [{"gw": "1.1.1.1"}]}',
            "invalid result: routes[0].dst: required field is missing",
        ),
        (
            '{"cniVersion": "1.0.0", "routes": [{"dst": null}]}',
            "invalid result: routes[0].dst: expected a CIDR string, got null",
        ),
        (
            '{"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/24"}, {"address": "10.0.0.300/24"}]}',
            'invalid result: ips[1].address: invalid CIDR address "10.0.0.300/24"',
        ),
        (
            '{"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/24", "gateway": "10.0.0.1/24"}]}',
            'invalid result: ips[0].gateway: invalid IP address "10.0.0.1/24"',
        ),
        (
            '{"cniVersion": "1.0.0", "ips": [{"address": 5}]}',
            "invalid result: ips[0].address: expected a CIDR string, got a number",
        ),
        (
            '{"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/24", "gateway": true}]}',
            "invalid result: ips[0].gateway: expected an IP address string, got a boolean",
        ),
        (
            '{"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/24", "interface": "0"}]}',
            "invalid result: ips[0].interface: expected an integer, got a string",
        ),
        (
            '{"cniVersion": "1.1.0", "interfaces": [{"name": "a", "mtu": 1.0}]}',
            "invalid result: interfaces[0].mtu: expected an integer, got 1.0",
        ),
        (
            '{"cniVersion": "1.1.0", "interfaces": [{"name": "a", "mtu": 1e3}]}',
            "invalid result: interfaces[0].mtu: expected an integer, got 1000.0",
        ),
        (
            '{"cniVersion": "1.1.0", "interfaces": [{"name": "a", "mtu": 9223372036854775808}]}',
            "invalid result: interfaces[0].mtu: integer 9223372036854775808 out of range",
        ),
        (
            '{"cniVersion": "1.1.0", "interfaces": [{"name": false}]}',
            "invalid result: interfaces[0].name: expected a string, got a boolean",
        ),
        ('{"cniVersion": "1.1.0", "dns": []}', "invalid result: dns: expected an object, got an array"),
        (
            '{"cniVersion": "1.1.0", "dns": {"search": ["a", 1]}}',
            "invalid result: dns.search[1]: expected a string, got a number",
        ),
        (
            '{"cniVersion": "1.1.0", "dns": {"domain": {}}}',
            "invalid result: dns.domain: expected a string, got an object",
        ),
        (
            '{"cniVersion": "0.4.0", "ips": [{"version": 4, "address": "10.0.0.1/8"}]}',
            "invalid result: ips[0].version: expected a string, got a number",
        ),
        ('{"cniVersion": "0.2.0", "ip4": []}', "invalid result: ip4: expected an object, got an array"),
        ('{"cniVersion": "0.2.0", "ip6": {"gateway": "::1"}}', "invalid result: ip6.ip: required field is missing"),
        (
            '{"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/8", "routes": [{"dst": "10.0.0.0/33"}]}}',
            'invalid result: ip4.routes[0].dst: invalid CIDR address "10.0.0.0/33"',
        ),
    ],
)
def test_malformed_results_name_what_is_wrong_and_where(data, message):
    with pytest.raises(ResultError) as info:
        parse_result(data)
    assert str(info.value) == message
    assert info.value.code == ErrorCode.DECODING_FAILURE


@pytest.mark.parametrize(
    "cidr",
    [
        "10.0.0.1",  # no prefix
        "10.0.0.1/",
        "10.0.0.1/33",
        "010.0.0.1/8",  # leading zero octet
        "10.0.0.01/8",
        "10.0.0.1/255.0.0.0",  # netmask form
        "10.0.0.1/+8",
        "10.0.0.1/-8",
        "10.0.0.1/2_4",
        "10.0.0.1/\u0662\u0664",  # non-ASCII digits
        "10.0.0.1/8 ",
        " 10.0.0.1/8",
        "10.0.0/8",
        "10.0.0.0.1/8",
        "fe80::1%eth0/64",  # zone
        "fe80::1/129",
        "::ffff:1.2.3.4/129",
        "::ffff:01.2.3.4/120",
        "1:2:3:4:5:6:7:8::/64",
        "1::2::3/64",
        "12345::/64",
        "",
        "/",
        "10.0.0.1/" + "9" * 5000,
        "x" * 10_000,
    ],
)
def test_invalid_cidrs_are_rejected_like_go(cidr):
    with pytest.raises(ResultError, match=r"^invalid result: ips\[0\]\.address: invalid CIDR address "):
        parse_result({"cniVersion": "1.0.0", "ips": [{"address": cidr}]})


@pytest.mark.parametrize("gateway", ["10.0.0.1/24", "fe80::1%eth0", "010.0.0.1", "1.2.3", "::g", " 10.0.0.1"])
def test_invalid_gateways_are_rejected_like_go(gateway):
    with pytest.raises(ResultError, match=r"^invalid result: ips\[0\]\.gateway: invalid IP address "):
        parse_result({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/8", "gateway": gateway}]})


def test_error_messages_quote_long_or_odd_values_safely():
    with pytest.raises(ResultError) as info:
        parse_result({"cniVersion": "1.0.0", "ips": [{"address": "\ud800" + "x" * 500}]})
    message = str(info.value)
    assert len(message) < 200 and message.isascii()
    message.encode("utf-8")


def test_decoded_input_with_huge_int_reports_range_without_crashing():
    with pytest.raises(ResultError, match="integer with 16610 bits out of range"):
        parse_result({"cniVersion": "1.0.0", "routes": [{"dst": "0.0.0.0/0", "mtu": 10**5000}]})


# --- from_json on the models -----------------------------------------------------------------


def test_result_from_json_takes_the_version_as_written():
    assert Result.from_json({"ips": [{"address": "10.0.0.2/8"}]}) == Result(
        "", ips=[IPConfig(ip_interface("10.0.0.2/8"))]
    )
    assert Result040.from_json({"cniVersion": "0.3.0"}) == Result040("0.3.0")
    assert Result020.from_json({"cniVersion": "0.1.0"}) == Result020("0.1.0")


@pytest.mark.parametrize(
    ("model", "doc", "message"),
    [
        (Result, {"cniVersion": "0.4.0"}, 'invalid result: cniVersion: version "0.4.0" is not one of 1.0.0, 1.1.0'),
        (Result040, {"cniVersion": 4}, "invalid result: cniVersion: expected a string, got a number"),
        (Result020, [], "invalid result: expected an object, got an array"),
        (Route, {"dst": "x"}, 'invalid route: dst: invalid CIDR address "x"'),
        (DNS, {"options": "x"}, "invalid dns: options: expected an array, got a string"),
        (Interface, "eth0", "invalid interface: expected an object, got a string"),
        (IPConfig, {}, "invalid ip config: address: required field is missing"),
        (
            IPConfig040,
            {"address": "10.0.0.2/8", "interface": True},
            "invalid ip config: interface: expected an integer, got a boolean",
        ),
        (
            IPConfig020,
            {"ip": "10.0.0.2/8", "routes": [1]},
            "invalid ip config: routes[0]: expected an object, got a number",
        ),
    ],
)
def test_model_from_json_errors_are_result_errors(model, doc, message):
    with pytest.raises(ResultError) as info:
        model.from_json(doc)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "model",
    [
        Result("1.1.0", ips=[IPConfig(ip_interface("10.0.0.2/8"), interface=0)], dns=DNS(domain="d")),
        Result040("0.4.0", ips=[IPConfig040("4", ip_interface("10.0.0.2/8"))]),
        Result020("0.2.0", ip6=IPConfig020(ip_interface("fd00::2/64"), ip_address("fd00::1"))),
        Interface("eth0", "m", 1500, "/ns", "/s", "p"),
        Route(ip_interface("10.0.0.0/8"), ip_address("10.0.0.1"), 1, 2, 3, 0, 0),
        DNS(["a"], "b", ["c"], ["d"]),
    ],
)
def test_model_from_json_inverts_to_json(model):
    assert type(model).from_json(model.to_json()) == model


# Kept stricter than libcni on purpose (README, results): Go would hand on "<nil>" or panic.
@pytest.mark.parametrize(
    "doc",
    [
        b'{"cniVersion": "1.0.0", "interfaces": [{"name": "\xff"}]}',
        b'{"cniVersion": "1.0.0", "interfaces": [null]}',
        b'{"cniVersion": "1.0.0", "ips": [null]}',
        b'{"cniVersion": "1.0.0", "routes": [{"gw": "10.0.0.1"}]}',
        b'{"cniVersion": "1.0.0", "ips": [{"address": ""}]}',
        b'{"cniVersion": "0.2.0", "ip4": {"ip": ""}}',
    ],
)
def test_what_libcni_would_pass_on_as_nil_is_refused_on_purpose(doc):
    with pytest.raises(ResultError):
        parse_result(doc)


def test_integers_beyond_2_to_the_53_stay_exact_on_purpose():
    big = 2**53 + 1
    result = parse_result(f'{{"cniVersion": "1.1.0", "routes": [{{"dst": "0.0.0.0/0", "mtu": {big}}}]}}')
    assert result.routes[0].mtu == big

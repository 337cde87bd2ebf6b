"""Properties: results survive their own JSON, and conversions lose only what libcni loses."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pycni.testing.strategies import any_results, current_results, results_020, results_040, short_interfaces
from pycni.types import IPConfig, Result, Route, convert, parse_result

SETTINGS = settings(max_examples=200, deadline=None, database=None)


@SETTINGS
@given(any_results, st.booleans())
def test_parse_of_to_json_round_trips_in_every_version(result, ascii_only):
    text = json.dumps(result.to_json(), ensure_ascii=ascii_only)
    assert parse_result(text.encode("utf-8")) == result
    assert type(result).from_json(result.to_json()) == result


@SETTINGS
@given(results_020(convertible=True), st.sampled_from(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]))
def test_0_2_0_up_and_back_down_is_lossless(result, up):
    assert convert(convert(result, up), result.cni_version) == result


@SETTINGS
@given(results_040(consistent_labels=True), st.sampled_from(Result.VERSIONS))
def test_0_4_0_up_to_1_x_and_back_is_lossless(result, up):
    assert convert(convert(result, up), result.cni_version) == result


@SETTINGS
@given(current_results(interfaces=short_interfaces), st.sampled_from(["0.3.0", "0.3.1", "0.4.0"]))
def test_1_x_through_0_4_0_is_lossless_without_1_1_interface_fields(result, down):
    assert convert(convert(result, down), result.cni_version) == result


@SETTINGS
@given(current_results(), st.sampled_from(["0.1.0", "0.2.0"]))
def test_1_x_through_0_2_0_keeps_first_ip_per_family_and_their_routes(result, down):
    first = {}
    for ip in result.ips:
        first.setdefault(ip.address.version, ip)
    if not first:
        return  # covered by the unit test for "no valid IP addresses"
    back = convert(convert(result, down), result.cni_version)
    assert back.ips == tuple(IPConfig(first[v].address, first[v].gateway) for v in (4, 6) if v in first)
    kept = [Route(r.dst, r.gw) for v in (4, 6) if v in first for r in result.routes if r.dst.version == v]
    assert back.routes == tuple(kept)
    assert back.dns == result.dns and back.interfaces == ()

"""Properties: whatever a plugin prints, parse_result raises ResultError or returns a usable model."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pycni.errors import ResultError
from pycni.testing.strategies import json_values, mutated_results, text_field_mutations
from pycni.types import convert, parse_result

SETTINGS = settings(max_examples=200, deadline=None, database=None)

VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
config_versions = st.none() | st.sampled_from(["", "9.9.9", *VERSIONS])


def parse_or_reject(data, config_version):
    """Only ResultError may escape; anything accepted re-emits, re-parses identically and converts."""
    try:
        result = parse_result(data, config_version=config_version)
    except ResultError as e:
        assert e.code == 6 and str(e)
        return
    check_usable(result)


def check_usable(result):
    emitted = json.dumps(result.to_json(), ensure_ascii=False).encode("utf-8")
    assert parse_result(emitted) == result
    for version in VERSIONS:
        try:
            json.dumps(convert(result, version).to_json())
        except ResultError as e:
            assert str(e) == "cannot convert: no valid IP addresses"


@SETTINGS
@given(json_values, config_versions)
def test_arbitrary_decoded_json_never_raises_anything_but_result_error(value, config_version):
    parse_or_reject(value, config_version)


@SETTINGS
@given(json_values, config_versions)
def test_arbitrary_json_text_never_raises_anything_but_result_error(value, config_version):
    parse_or_reject(json.dumps(value), config_version)


@SETTINGS
@given(st.binary(max_size=200), config_versions)
def test_arbitrary_bytes_never_raise_anything_but_result_error(data, config_version):
    parse_or_reject(data, config_version)


@SETTINGS
@given(st.text(max_size=200), config_versions)
def test_arbitrary_text_never_raises_anything_but_result_error(data, config_version):
    parse_or_reject(data, config_version)


@SETTINGS
@given(mutated_results(), config_versions, st.booleans())
def test_mutated_results_never_raise_anything_but_result_error(doc, config_version, as_text):
    parse_or_reject(json.dumps(doc) if as_text else doc, config_version)


@SETTINGS
@given(mutated_results(), st.integers(0, 200))
def test_truncated_results_never_raise_anything_but_result_error(doc, cut):
    data = json.dumps(doc).encode("utf-8")
    parse_or_reject(data[: len(data) - cut], None)


@SETTINGS
@given(text_field_mutations(), st.booleans())
def test_any_string_in_a_text_field_is_accepted_and_re_emits_as_utf8(doc, as_text):
    check_usable(parse_result(json.dumps(doc) if as_text else doc))

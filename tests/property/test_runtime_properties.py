"""Property tests for the runtime's parsers and formats: configs, CNI_ARGS, cache entries, errors."""

from __future__ import annotations

import json
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from pycni import _json
from pycni.cache import CachedAttachment
from pycni.config import conf_from_bytes, conflist_from_bytes
from pycni.errors import CNIError, ConfigError, InvalidArgumentError, ResultError
from pycni.runtime_conf import format_cni_args
from pycni.sdk import parse_cni_args

SETTINGS = settings(max_examples=300, deadline=None, database=None)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=25,
)
names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,20}", fullmatch=True)


def conflist_like():
    plugin = st.fixed_dictionaries({"type": st.one_of(st.text(max_size=8), json_values)}, optional={"x": json_values})
    return st.fixed_dictionaries(
        {},
        optional={
            "name": st.one_of(names, json_values),
            "cniVersion": st.one_of(st.sampled_from(["0.4.0", "1.0.0", "1.1.0", ""]), json_values),
            "cniVersions": st.one_of(st.lists(st.sampled_from(["0.4.0", "1.1.0", "9.9.9", "x"])), json_values),
            "plugins": st.one_of(st.lists(plugin, max_size=3), json_values),
            "disableCheck": st.one_of(st.sampled_from([True, "TRUE", "false", "no"]), json_values),
            "loadOnlyInlinedPlugins": st.one_of(st.booleans(), json_values),
        },
    )


@SETTINGS
@given(st.one_of(conflist_like(), json_values))
def test_any_json_config_parses_or_raises_config_error(doc):
    data = json.dumps(doc).encode()
    for parse in (conflist_from_bytes, conf_from_bytes):
        try:
            parse(data)
        except ConfigError:
            pass


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes_config_parses_or_raises_config_error(data):
    try:
        conflist_from_bytes(data)
    except ConfigError:
        pass


@SETTINGS
@given(conflist_like())
def test_accepted_lists_keep_plugin_objects_exactly(doc):
    try:
        net = conflist_from_bytes(json.dumps(doc).encode())
    except ConfigError:
        return
    if "plugins" in doc:
        assert [dict(p.raw) for p in net.plugins] == doc["plugins"]


arg_key = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=10)
arg_value = st.text(
    alphabet=string.printable.replace(";", "").replace("=", "").replace("\x0b", ""), min_size=1, max_size=10
)


@SETTINGS
@given(st.lists(st.tuples(arg_key, arg_value), max_size=6))
def test_cni_args_round_trip(pairs):
    assert parse_cni_args(format_cni_args(pairs)) == pairs


@SETTINGS
@given(st.text(max_size=40))
def test_cni_args_parser_never_crashes(text):
    try:
        parse_cni_args(text)
    except InvalidArgumentError:
        pass


@SETTINGS
@given(
    cid=names,
    network=names,
    ifname=st.from_regex(r"[a-z][a-z0-9]{0,14}", fullmatch=True),
    config=st.binary(max_size=64),
    netns=st.text(max_size=30),
    args=st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=3),
    caps=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    result=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_cache_entries_round_trip_through_go_compatible_json(cid, network, ifname, config, netns, args, caps, result):
    entry = CachedAttachment(cid, network, ifname, config, netns, tuple(args), caps, result or None)
    decoded = CachedAttachment.from_json(_json.loads(entry.to_bytes()))
    assert decoded == entry


@SETTINGS
@given(code=st.integers(0, 2**32 - 1), msg=st.text(), details=st.text())
def test_error_results_round_trip(code, msg, details):
    error = CNIError(msg, details, code=code)
    again = CNIError.from_json(json.loads(json.dumps(error.to_json())))
    assert (again.code, again.msg, again.details) == (code, msg, details)


@SETTINGS
@given(json_values)
def test_error_result_parser_only_raises_result_error(value):
    try:
        CNIError.from_json(value)
    except ResultError:
        pass

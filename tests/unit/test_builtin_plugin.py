"""Looking up in-process plugins by CNI type."""

from __future__ import annotations

from pycni.sdk import builtin_plugin
from pycni.sdk import plugin as sdk_plugin


def test_an_unknown_type_is_none_and_not_remembered():
    """A daemon looks up whatever type its callers send: only real entry points may be cached."""
    before = sdk_plugin._load.cache_info().currsize
    for i in range(100):
        assert builtin_plugin(f"no-such-plugin-{i}-" + "x" * 200) is None
    assert sdk_plugin._load.cache_info().currsize == before


def test_a_known_type_is_loaded_once():
    assert builtin_plugin("loopback") is builtin_plugin("loopback") is not None

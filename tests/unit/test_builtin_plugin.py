"""Looking up in-process plugins by CNI type."""

from __future__ import annotations

import pytest

from pycni.errors import CNIError, ErrorCode
from pycni.sdk import PluginRequest, builtin_plugin
from pycni.sdk import plugin as sdk_plugin


def test_an_unknown_type_is_none_and_not_remembered():
    """A daemon looks up whatever type its callers send: only real entry points may be cached."""
    before = sdk_plugin._load.cache_info().currsize
    for i in range(100):
        assert builtin_plugin(f"no-such-plugin-{i}-" + "x" * 200) is None
    assert sdk_plugin._load.cache_info().currsize == before


def test_a_known_type_is_loaded_once():
    assert builtin_plugin("loopback") is builtin_plugin("loopback") is not None


class _Minimal(sdk_plugin.Plugin):
    type = "minimal"


def test_an_unimplemented_add_fails_and_the_other_commands_succeed():
    """ADD has a result, so a plugin must implement it; DEL, CHECK, GC and STATUS that do
    nothing are correct answers (nothing to delete, check, collect; always ready)."""
    plugin = _Minimal()
    with pytest.raises(CNIError, match="'minimal' does not implement ADD") as raised:
        plugin.handle(PluginRequest("ADD", {"cniVersion": "1.1.0", "name": "n", "type": "minimal"}))
    assert raised.value.code == ErrorCode.INTERNAL
    for command in ("DEL", "CHECK", "GC", "STATUS"):
        assert plugin.handle(PluginRequest(command, {"cniVersion": "1.1.0", "name": "n", "type": "minimal"})) is None


def test_a_preset_registry_finds_the_plugins_without_scanning_the_installed_distributions(monkeypatch):
    """An installed shim's fallback knows every built-in's class from install time: looking one
    up (a chain's inner plugins, a bridge's host-local) reads no distribution's metadata."""

    def scan() -> None:
        raise AssertionError("the entry points were scanned")

    monkeypatch.setattr(sdk_plugin, "_entry_points", scan)
    try:
        sdk_plugin.preset_registry({"loopback": "pycni_plugins.loopback:LoopbackPlugin"})
        assert type(builtin_plugin("loopback")).__name__ == "LoopbackPlugin"
        assert builtin_plugin("bridge") is None
        assert list(sdk_plugin.builtin_plugins()) == ["loopback"]
    finally:
        sdk_plugin.preset_registry({})
        monkeypatch.undo()
    assert builtin_plugin("bridge") is not None

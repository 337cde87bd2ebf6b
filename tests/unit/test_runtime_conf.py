"""Request building (libcni buildOneConfig) and the CNI_* parameters."""

from __future__ import annotations

import pytest

from pycni.config import NetworkConfig
from pycni.errors import InvalidArgumentError
from pycni.runtime_conf import (
    RuntimeConf,
    build_config,
    build_request,
    format_cni_args,
)
from pycni.sdk import (
    DEFAULT_STATE_DIR,
    GCAttachment,
    PluginRequest,
    default_state_dir,
    validate_container_id,
    validate_ifname,
)


def plugin(**raw):
    return NetworkConfig(raw={"type": "portmap", **raw})


def test_name_and_version_overwrite_the_plugins_own():
    out = build_config(plugin(name="mine", cniVersion="0.1.0"), name="net", cni_version="1.1.0")
    assert (out["name"], out["cniVersion"]) == ("net", "1.1.0")


def test_runtime_config_is_enabled_capabilities_intersected_with_args_and_replaces_the_file():
    p = plugin(capabilities={"portMappings": True, "bandwidth": False, "dns": True}, runtimeConfig={"old": 1})
    out = build_config(p, name="n", cni_version="1.0.0", capability_args={"portMappings": [1], "bandwidth": {}, "x": 2})
    assert out["runtimeConfig"] == {"portMappings": [1]}


def test_runtime_config_kept_from_file_when_nothing_to_inject():
    out = build_config(plugin(runtimeConfig={"old": 1}), name="n", cni_version="1.0.0", capability_args={"a": 1})
    assert out["runtimeConfig"] == {"old": 1}


def test_prev_result_injected_only_when_given():
    assert "prevResult" not in build_config(plugin(), name="n", cni_version="1.0.0")
    out = build_config(plugin(), name="n", cni_version="1.0.0", prev_result={"cniVersion": "1.0.0"})
    assert out["prevResult"] == {"cniVersion": "1.0.0"}


def test_capabilities_kept_for_libcni_parity_unless_stripped():
    p = plugin(capabilities={"portMappings": True})
    assert "capabilities" in build_config(p, name="n", cni_version="1.0.0")
    assert "capabilities" not in build_config(p, name="n", cni_version="1.0.0", strip_capabilities=True)


def test_gc_sends_both_attachment_keys_and_no_runtime_config_or_prev_result():
    p = plugin(capabilities={"portMappings": True})
    out = build_config(
        p,
        name="n",
        cni_version="1.1.0",
        gc=True,
        valid_attachments=[GCAttachment("c1", "eth0")],
        prev_result={"x": 1},
        capability_args={"portMappings": []},
    )
    expected = [{"containerID": "c1", "ifname": "eth0"}]
    assert out["cni.dev/valid-attachments"] == expected and out["cni.dev/attachments"] == expected
    assert "runtimeConfig" not in out and "prevResult" not in out


def test_plugin_config_is_not_mutated():
    p = plugin(capabilities={"portMappings": True})
    build_config(p, name="n", cni_version="1.0.0", capability_args={"portMappings": []}, prev_result={})
    assert set(p.raw) == {"type", "capabilities"}


def test_request_env_always_has_six_vars_and_the_state_dir():
    req = build_request("GC", {"a": 1}, None, ["/a", "/b"], "/tmp/st")
    assert req.env() == {
        "CNI_COMMAND": "GC",
        "CNI_CONTAINERID": "",
        "CNI_NETNS": "",
        "CNI_IFNAME": "",
        "CNI_ARGS": "",
        "CNI_PATH": "/a:/b",
        "PYCNI_STATE_DIR": "/tmp/st",
    }
    rt = RuntimeConf("c", "/run/netns/x", "eth1", args=[("K", "V"), ("IgnoreUnknown", "1")])
    add = build_request("ADD", {}, rt, ["/a"], "/tmp/st")
    assert add.env()["CNI_ARGS"] == "K=V;IgnoreUnknown=1"
    assert add.state_dir == "/tmp/st"


def test_a_request_without_a_state_dir_takes_the_env_then_the_default(monkeypatch):
    monkeypatch.setenv("PYCNI_STATE_DIR", "/tmp/from-env")
    assert PluginRequest("ADD", {}).state_dir == "/tmp/from-env"
    monkeypatch.delenv("PYCNI_STATE_DIR")
    assert PluginRequest("ADD", {}).state_dir == DEFAULT_STATE_DIR == "/run/pycni"
    assert default_state_dir({"PYCNI_STATE_DIR": "/x"}) == "/x"
    assert default_state_dir({"PYCNI_STATE_DIR": ""}) == DEFAULT_STATE_DIR


def test_the_runtime_state_dir_is_explicit_or_the_env_default(monkeypatch):
    from pycni.runtime import Runtime

    monkeypatch.setenv("PYCNI_STATE_DIR", "/tmp/from-env")
    assert Runtime([], state_dir="/tmp/explicit", backend="inprocess").state_dir == "/tmp/explicit"
    assert Runtime([], backend="inprocess").state_dir == "/tmp/from-env"
    monkeypatch.delenv("PYCNI_STATE_DIR")
    assert Runtime([], backend="inprocess").state_dir == DEFAULT_STATE_DIR


@pytest.mark.parametrize("pair", [("a;b", "v"), ("k", "v;x"), ("", "v"), ("k=", "v"), ("k", "v\x00")])
def test_cni_args_that_would_corrupt_the_string_are_refused(pair):
    with pytest.raises(InvalidArgumentError):
        format_cni_args([pair])


@pytest.mark.parametrize("cid, code", [("", 3), ("-x", 4), ("a/b", 4), ("a b", 4), ("../x", 4), ("x\n", 4)])
def test_container_id_validation(cid, code):
    with pytest.raises(InvalidArgumentError) as e:
        validate_container_id(cid)
    assert e.value.code == code


@pytest.mark.parametrize(
    "name, message",
    [
        ("", "interface name is empty"),
        ("a" * 16, "interface name is too long"),
        (".", "interface name is . or .."),
        ("..", "interface name is . or .."),
        ("a/b", "contains / or : or whitespace"),
        ("a:b", "contains / or : or whitespace"),
        ("a b", "contains / or : or whitespace"),
        ("a\u00a0b", "contains / or : or whitespace"),
    ],
)
def test_ifname_validation(name, message):
    with pytest.raises(InvalidArgumentError, match=message) as e:
        validate_ifname(name)
    assert e.value.code == 4


def test_valid_names_pass():
    validate_container_id("Abc_1.2-3")
    validate_ifname("eth0")
    validate_ifname("a" * 15)

"""The chain plugin runs a folded list with the runtime's semantics (against scriptable fake
plugins, exec'd as inner plugins), and fold/unfold turn a conflist into that form and back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from pycni.chain import BEST_EFFORT_DEL_KEY, CHAIN_TYPE, fold, is_folded, unfold
from pycni.cli import cli
from pycni.config import conflist_from_bytes
from pycni.errors import CNIError, ConfigError, ErrorCode, MultiError
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.sdk import GCAttachment, PluginRequest, builtin_plugin
from pycni.version import SUPPORTED

RT = RuntimeConf(
    container_id="ctr1",
    netns="/run/netns/ctr1",
    ifname="eth0",
    args=[("K", "V"), ("IgnoreUnknown", "1")],
    capability_args={"portMappings": [{"hostPort": 8080, "containerPort": 80}], "bandwidth": {"ingressRate": 1}},
)


@pytest.fixture
def runtime(fake_plugins, tmp_path):
    return Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="auto")


def _list(fakes, **behaviour: Any) -> bytes:
    a = fakes.plugin("fake-a", **behaviour.get("a", {})) | {"capabilities": {"portMappings": True}}
    b = fakes.plugin("fake-b", **({"ADD": {"echo_prev": True}} | behaviour.get("b", {})))
    c = fakes.plugin("fake-c", **behaviour.get("c", {})) | {"capabilities": {"bandwidth": True, "mac": False}}
    return fakes.conflist(a, b, c, name="chainnet", version="1.1.0")


def _calls(fakes) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    calls = [(c["type"], c["env"], c["stdin"]) for c in fakes.calls()]
    fakes.log.unlink(missing_ok=True)
    return calls


def _every_command(runtime: Runtime, data: bytes) -> tuple[Any, Any]:
    net = conflist_from_bytes(data)
    result = runtime.add_network_list(net, RT).to_json()
    (cached,) = runtime.get_cached_attachments()
    runtime.check_network_list(net, RT)
    runtime.delete_network_list(net, RT)
    runtime.gc_network_list(net, [GCAttachment("other", "eth0")])
    runtime.get_status_network_list(net)
    return result, cached


def test_every_inner_plugin_gets_the_stdin_and_env_the_unfolded_list_gives_it(runtime, fake_plugins):
    unfolded = _list(fake_plugins)
    result, cached = _every_command(runtime, unfolded)
    expected = _calls(fake_plugins)
    folded_result, folded_cached = _every_command(runtime, fold(unfolded))

    assert _calls(fake_plugins) == expected
    assert [(t, env["CNI_COMMAND"]) for t, env, _ in expected] == [
        *[(t, "ADD") for t in ("fake-a", "fake-b", "fake-c")],
        *[(t, "CHECK") for t in ("fake-a", "fake-b", "fake-c")],
        *[(t, "DEL") for t in ("fake-c", "fake-b", "fake-a")],
        *[(t, "GC") for t in ("fake-a", "fake-b", "fake-c")],
        *[(t, "STATUS") for t in ("fake-a", "fake-b", "fake-c")],
    ]
    assert folded_result == result
    # One cache entry per network, as before: the folded file's bytes, the same result.
    assert (folded_cached.network, folded_cached.result) == (cached.network, cached.result)
    assert folded_cached.config == fold(unfolded)


def test_each_inner_plugin_gets_only_the_runtime_config_its_capabilities_enable(runtime, fake_plugins):
    runtime.add_network_list(conflist_from_bytes(fold(_list(fake_plugins))), RT)
    configs = {t: stdin.get("runtimeConfig") for t, _, stdin in _calls(fake_plugins)}
    assert configs == {
        "fake-a": {"portMappings": RT.capability_args["portMappings"]},
        "fake-b": None,
        "fake-c": {"bandwidth": RT.capability_args["bandwidth"]},
    }


@pytest.mark.parametrize("command", ["add", "gc"])
def test_capabilities_that_do_not_cover_the_inner_ones_fail_before_any_plugin_runs(runtime, fake_plugins, command):
    folded = json.loads(fold(_list(fake_plugins)))
    folded["plugins"][0]["capabilities"] = {"portMappings": True}
    net = conflist_from_bytes(json.dumps(folded))
    with pytest.raises(CNIError, match='missing "bandwidth" \\(plugin type="fake-c"\\)') as raised:
        if command == "add":
            runtime.add_network_list(net, RT)
        else:
            runtime.gc_network_list(net, [])
    assert raised.value.code == ErrorCode.INVALID_NETWORK_CONFIG
    assert _calls(fake_plugins) == []


def test_add_stops_at_the_first_inner_failure_with_its_code_and_plugin(runtime, fake_plugins):
    data = fold(_list(fake_plugins, b={"ADD": {"error": {"code": 107, "msg": "no"}}}))
    with pytest.raises(CNIError, match='plugin type="fake-b" failed \\(add\\): no') as raised:
        runtime.add_network_list(conflist_from_bytes(data), RT)
    assert raised.value.code == 107
    assert [t for t, _, _ in _calls(fake_plugins)] == ["fake-a", "fake-b"]
    assert runtime.get_cached_attachments() == []


FAILING_DEL = {"DEL": {"error": {"code": 108, "msg": "stuck"}}}


@pytest.mark.parametrize("best_effort", [False, True])
def test_inner_del_goes_on_after_a_failure_only_when_the_config_asks(runtime, fake_plugins, best_effort):
    data = fold(_list(fake_plugins, c=FAILING_DEL, b=FAILING_DEL))
    net = conflist_from_bytes(data)
    if best_effort:
        raw = json.loads(data)
        raw["plugins"][0][BEST_EFFORT_DEL_KEY] = True
        net = conflist_from_bytes(json.dumps(raw))
    with pytest.raises(CNIError) as raised:
        runtime.delete_network_list(net, RT)
    ran = [t for t, _, _ in _calls(fake_plugins)]
    if best_effort:
        assert ran == ["fake-c", "fake-b", "fake-a"]
        assert "fake-c" in raised.value.msg and "fake-b" in raised.value.msg
    else:
        assert ran == ["fake-c"]
        assert raised.value.code == 108


def test_the_chain_fails_without_an_inner_list_and_refuses_a_nested_chain(runtime, fake_plugins):
    chain = builtin_plugin(CHAIN_TYPE)
    assert chain is not None
    base = {"cniVersion": "1.1.0", "name": "n", "type": CHAIN_TYPE}
    for config, message in (
        (base, 'needs a non-empty "plugins" list'),
        (base | {"plugins": [{"type": CHAIN_TYPE, "plugins": [{"type": "x"}]}]}, "cannot hold another chain"),
        (base | {"plugins": [{"name": "no type"}]}, "inner plugins: failed to parse plugin config 0"),
    ):
        with pytest.raises(CNIError, match=message) as raised:
            chain.handle(PluginRequest("ADD", config, "c1", "", "eth0", path=(str(fake_plugins.dir),)))
        assert raised.value.code == ErrorCode.INVALID_NETWORK_CONFIG


def test_version_is_what_every_inner_plugin_supports(runtime, fake_plugins):
    chain = builtin_plugin(CHAIN_TYPE)
    assert chain is not None
    inner = {"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "static"}, {"type": "fake-a"}]}
    fakes_support = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]  # the fake plugin's answer
    answer = chain.handle(PluginRequest("VERSION", inner, path=(str(fake_plugins.dir),)))
    assert answer == {"cniVersion": "1.1.0", "supportedVersions": fakes_support}
    assert chain.handle(PluginRequest("VERSION", {}))["supportedVersions"] == list(SUPPORTED)
    # The runtime's validation asks a built-in plugin with its config: a folded list of fakes at
    # 0.2.0 is refused as the unfolded one is.
    old = json.loads(fold(_list(fake_plugins)))
    old["cniVersion"] = "0.2.0"
    with pytest.raises(MultiError, match='plugin pycni-chain does not support config version "0.2.0"'):
        runtime.validate_network_list(conflist_from_bytes(json.dumps(old)))


def test_fold_keeps_the_list_keys_and_unions_the_capabilities_and_unfold_reverses_it(fake_plugins):
    data = fake_plugins.conflist(
        {"type": "a", "capabilities": {"portMappings": True, "ips": False}},
        {"type": "b", "capabilities": {"bandwidth": True, "portMappings": True}},
        disableCheck=True,
        cniVersions=["1.0.0", "1.1.0"],
    )
    folded = json.loads(fold(data, best_effort_del=True))
    (chain,) = folded["plugins"]
    assert chain == {
        "type": CHAIN_TYPE,
        "capabilities": {"portMappings": True, "bandwidth": True},
        BEST_EFFORT_DEL_KEY: True,
        "plugins": json.loads(data)["plugins"],
    }
    assert {k: v for k, v in folded.items() if k != "plugins"} == {
        k: v for k, v in json.loads(data).items() if k != "plugins"
    }
    assert is_folded(folded) and not is_folded(json.loads(data))
    assert json.loads(unfold(fold(data))) == json.loads(data)
    with pytest.raises(ConfigError, match="folded already"):
        fold(fold(data))
    with pytest.raises(ConfigError, match="not folded"):
        unfold(data)


def test_fold_lists_a_single_plugin_conf():
    conf = b'{"cniVersion": "1.0.0", "name": "one", "type": "bridge", "capabilities": {"mac": true}}'
    folded = json.loads(fold(conf))
    assert folded["name"] == "one" and folded["cniVersion"] == "1.0.0"
    assert folded["plugins"] == [{"type": CHAIN_TYPE, "capabilities": {"mac": True}, "plugins": [json.loads(conf)]}]


def test_cli_folds_a_network_by_name_and_unfolds_a_file(tmp_path, fake_plugins):
    data = fake_plugins.conflist({"type": "a"}, {"type": "b"}, name="named")
    (tmp_path / "10-named.conflist").write_bytes(data)
    out = tmp_path / "folded.conflist"
    runner = CliRunner()
    folded = runner.invoke(cli, ["conf", "fold", "named", "--conf-dir", str(tmp_path), "-o", str(out)])
    assert folded.exit_code == 0, folded.output
    assert out.read_bytes() == fold(data)
    unfolded = runner.invoke(cli, ["conf", "unfold", str(out)])
    assert unfolded.exit_code == 0, unfolded.output
    assert json.loads(unfolded.output) == json.loads(data)
    nomad = runner.invoke(cli, ["nomad", "conflist", "--fold", "--subnet", "198.18.0.0/24"])
    assert nomad.exit_code == 0, nomad.output
    assert [p["type"] for p in json.loads(nomad.output)["plugins"][0]["plugins"]] == [
        "loopback",
        "bridge",
        "firewall",
        "portmap",
    ]


def test_a_dry_run_reconcile_asks_no_exec_d_inner_plugin_as_unfolded(runtime, fake_plugins):
    # An exec'd plugin cannot report without collecting: dry runs skip it, folded or not.
    unfolded = conflist_from_bytes(_list(fake_plugins))
    folded = conflist_from_bytes(fold(_list(fake_plugins)))
    assert runtime.reconcile_network_list(folded, dry_run=True).errors == ()
    assert runtime.reconcile_network_list(unfolded, dry_run=True).errors == ()
    assert _calls(fake_plugins) == []
    runtime.reconcile_network_list(folded)
    assert [(t, env["CNI_COMMAND"]) for t, env, _ in _calls(fake_plugins)] == [
        ("fake-a", "GC"),
        ("fake-b", "GC"),
        ("fake-c", "GC"),
    ]

"""Exec'ing plugins: lookup, env, error mapping, output caps, timeouts that leave nothing behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from pycni.errors import PluginError, PluginNotFoundError, PluginTimeoutError, ResultError
from pycni.sdk import PluginRequest
from pycni.sdk.invoke import decode_version_info, exec_plugin, exec_version, find_plugin
from tests.helpers.fake import alive


def request(fakes, command="ADD", **behaviour):
    config = fakes.plugin("fake-a", **behaviour) | {"name": "net", "cniVersion": "1.1.0"}
    return PluginRequest(
        command=command,
        config=config,
        container_id="c1",
        netns="/run/netns/x",
        ifname="eth0",
        args="A=1;B=2",
        path=(str(fakes.dir),),
    )


class TestFind:
    def test_first_directory_holding_a_regular_file_wins(self, tmp_path):
        a, b = tmp_path / "a", tmp_path / "b"
        a.mkdir()
        b.mkdir()
        (a / "bridge").mkdir()
        (b / "bridge").write_text("")
        assert find_plugin("bridge", [str(a), str(b)]) == str(b / "bridge")

    @pytest.mark.parametrize("name", ["", "../bridge", "a/b", ".", ".."])
    def test_refuses_empty_and_path_names(self, name, tmp_path):
        with pytest.raises(PluginNotFoundError):
            find_plugin(name, [str(tmp_path)])

    def test_missing_plugin_names_every_dir(self, tmp_path):
        with pytest.raises(PluginNotFoundError, match=r'failed to find plugin "nope" in path \[/x /y\]'):
            find_plugin("nope", ["/x", "/y"])

    def test_no_paths(self):
        with pytest.raises(PluginNotFoundError, match="no paths provided"):
            find_plugin("x", [])


class TestExec:
    def test_env_has_callers_environment_and_all_six_cni_vars(self, fake_plugins, monkeypatch):
        monkeypatch.setenv("FAKE_MARKER", "kept")
        monkeypatch.setenv("CNI_IFNAME", "overridden")
        exec_plugin("fake-a", request(fake_plugins, "DEL"))
        env = fake_plugins.calls()[0]["env"]
        assert env["FAKE_MARKER"] == "kept"
        assert env == env | {
            "CNI_COMMAND": "DEL",
            "CNI_CONTAINERID": "c1",
            "CNI_NETNS": "/run/netns/x",
            "CNI_IFNAME": "eth0",
            "CNI_ARGS": "A=1;B=2",
            "CNI_PATH": str(fake_plugins.dir),
        }

    def test_stdin_is_the_request_config(self, fake_plugins):
        req = request(fake_plugins, "CHECK")
        exec_plugin("fake-a", req)
        assert fake_plugins.calls()[0]["stdin"] == dict(req.config)

    def test_add_returns_decoded_stdout(self, fake_plugins):
        out = exec_plugin("fake-a", request(fake_plugins, ADD={"result": {"cniVersion": "1.1.0", "x": 1}}))
        assert out == {"cniVersion": "1.1.0", "x": 1}

    def test_del_ignores_stdout(self, fake_plugins):
        assert exec_plugin("fake-a", request(fake_plugins, "DEL", DEL={"stdout": "garbage"})) is None

    def test_error_json_keeps_code_msg_details_and_stderr(self, fake_plugins):
        req = request(fake_plugins, ADD={"error": {"code": 7, "msg": "bad", "details": "why"}, "stderr": "log"})
        with pytest.raises(PluginError) as e:
            exec_plugin("fake-a", req)
        assert (e.value.code, e.value.msg, e.value.details) == (7, "bad", "why")
        assert e.value.exit_status == 1 and e.value.plugin == "fake-a"

    def test_nonzero_exit_with_stderr_only(self, fake_plugins):
        with pytest.raises(PluginError, match=r'netplugin failed: "boom": exit status 3') as e:
            exec_plugin("fake-a", request(fake_plugins, ADD={"stdout": "", "stderr": "boom", "exit": 3}))
        assert e.value.stderr == "boom" and e.value.exit_status == 3

    def test_nonzero_exit_without_output(self, fake_plugins):
        with pytest.raises(PluginError, match="netplugin failed with no error message: exit status 2"):
            exec_plugin("fake-a", request(fake_plugins, ADD={"stdout": "", "exit": 2}))

    def test_killed_by_signal_is_reported(self, fake_plugins):
        with pytest.raises(PluginError, match="signal: segv") as e:
            exec_plugin("fake-a", request(fake_plugins, ADD={"kill": int(signal.SIGSEGV)}))
        assert e.value.exit_status == -signal.SIGSEGV

    def test_garbage_stdout_on_failure(self, fake_plugins):
        with pytest.raises(PluginError, match='error parsing its diagnostic message "not json') as e:
            exec_plugin("fake-a", request(fake_plugins, ADD={"stdout": "not json", "exit": 1}))
        assert e.value.code == 0

    @pytest.mark.parametrize("stdout", ["", "[1,2]", "{bad"])
    def test_add_with_empty_or_invalid_stdout_is_a_result_error(self, fake_plugins, stdout):
        with pytest.raises(ResultError, match="failed to unmarshal raw result"):
            exec_plugin("fake-a", request(fake_plugins, ADD={"stdout": stdout}))

    def test_output_is_capped(self, fake_plugins, monkeypatch):
        monkeypatch.setattr("pycni.sdk.invoke.MAX_OUTPUT", 1 << 20)
        with pytest.raises(PluginError, match="more than"):
            exec_plugin("fake-a", request(fake_plugins, ADD={"big": 8 << 20}))

    def test_timeout_kills_the_plugin_and_says_so(self, fake_plugins):
        start = time.monotonic()
        with pytest.raises(PluginTimeoutError, match="timed out after 0.5s"):
            exec_plugin("fake-a", request(fake_plugins, ADD={"sleep": 60}), timeout=0.5)
        assert time.monotonic() - start < 5
        assert fake_plugins.pids() and not any(alive(p) for p in fake_plugins.pids())

    def test_child_keeping_pipes_open_cannot_hang_the_runtime(self, fake_plugins):
        start = time.monotonic()
        with pytest.raises(PluginError, match="kept its output open"):
            exec_plugin("fake-a", request(fake_plugins, ADD={"holder": 60}), timeout=30)
        assert time.monotonic() - start < 5
        time.sleep(0.2)
        assert len(fake_plugins.pids()) == 2 and not any(alive(p) for p in fake_plugins.pids())

    def test_text_file_busy_is_retried(self, fake_plugins):
        path = fake_plugins.dir / "fake-a"
        writer = os.open(path, os.O_WRONLY)
        threading.Timer(0.3, os.close, [writer]).start()
        assert exec_plugin("fake-a", request(fake_plugins, "DEL")) is None


class TestVersion:
    def test_version_uses_libcni_dummy_env(self, fake_plugins):
        fakes = fake_plugins
        info = exec_version("fake-a", [str(fakes.dir)])
        assert info.cni_version == "1.1.0" and "1.0.0" in info.supported_versions

    def test_old_plugin_without_version_supports_0_1_0(self, fake_plugins, tmp_path):
        script = fake_plugins.dir / "old"
        script.write_text('#!/bin/sh\necho \'{"code":4,"msg":"unknown CNI_COMMAND: VERSION"}\'\nexit 1\n')
        script.chmod(0o755)
        assert exec_version("old", [str(fake_plugins.dir)]).supported_versions == ("0.1.0",)

    @pytest.mark.parametrize(
        "data, expected",
        [
            (b'{"cniVersion":"0.2.0"}', ("0.1.0", "0.2.0")),
            (b'{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}', ("1.0.0",)),
        ],
    )
    def test_decode(self, data, expected):
        assert decode_version_info(data).supported_versions == expected

    @pytest.mark.parametrize(
        "data, message",
        [
            (b"nope", "decoding version info"),
            (b"{}", "missing field cniVersion"),
            (b'{"cniVersion":"1.0.0"}', "missing field supportedVersions"),
        ],
    )
    def test_decode_errors(self, data, message):
        with pytest.raises(ResultError, match=message):
            decode_version_info(data)


def test_request_stdin_round_trips():
    req = PluginRequest(command="ADD", config={"a": 2**70, "b": [1, "x"]})
    assert json.loads(req.stdin()) == {"a": 2**70, "b": [1, "x"]}

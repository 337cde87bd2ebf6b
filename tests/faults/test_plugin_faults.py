"""Faulty plugins: whatever a plugin does, the runtime answers with a clear error in bounded time,
leaves no process behind and no partial cache file, and with rollback DELs what had run."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pycni.config import conflist_from_bytes
from pycni.errors import MultiError, PluginError, PluginTimeoutError, ResultError
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from tests.helpers.fake import alive

RT = RuntimeConf(container_id="faulty", netns="/run/netns/faulty", ifname="eth0")
TIMEOUT = 2.0

FAULTS = {
    "crash": ({"kill": int(signal.SIGSEGV)}, PluginError, "signal: segv"),
    "garbage exit": ({"stdout": "\x00\xffnot json", "exit": 3}, PluginError, "error parsing its diagnostic message"),
    "garbage success": ({"stdout": "{{{{"}, ResultError, "failed to unmarshal raw result"),
    "megabytes": ({"big": 64 << 20}, PluginError, "wrote more than"),
    "never answers": ({"sleep": 3600}, PluginTimeoutError, "timed out"),
    "child keeps pipes": ({"holder": 3600}, PluginError, "kept its output open"),
    "stderr only": ({"stdout": "", "stderr": "kaboom", "exit": 1}, PluginError, 'netplugin failed: "kaboom"'),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_faulty_third_plugin_is_a_clear_error_and_rollback_deletes_what_ran(fault, fake_plugins, tmp_path):
    behaviour, error, message = FAULTS[fault]
    runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="exec", timeout=TIMEOUT)
    network = conflist_from_bytes(
        fake_plugins.conflist(
            fake_plugins.plugin("fake-a"),
            fake_plugins.plugin("fake-b"),
            fake_plugins.plugin("fake-c", ADD=behaviour, DEL={}),
        )
    )
    start = time.monotonic()
    with pytest.raises(error, match=message) as raised:
        runtime.add_network_list(network, RT, rollback=True)
    # the timeout plus the SIGTERM grace, and nothing more
    assert time.monotonic() - start < TIMEOUT + 3
    assert str(raised.value).startswith('plugin type="fake-c" failed (add): ')

    order = [(c["type"], c["env"]["CNI_COMMAND"]) for c in fake_plugins.calls()]
    assert order[-3:] == [("fake-c", "DEL"), ("fake-b", "DEL"), ("fake-a", "DEL")]
    time.sleep(0.1)
    assert not [p for p in fake_plugins.pids() if alive(p)], "a plugin process outlived the call"
    results = tmp_path / "cache" / "results"
    assert not results.exists() or os.listdir(results) == [], "no cache file, partial or whole"


def test_plugin_killed_mid_write_of_its_output(fake_plugins, tmp_path):
    runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="exec", timeout=TIMEOUT)
    network = conflist_from_bytes(fake_plugins.conflist(fake_plugins.plugin("fake-a", ADD={"stdout": '{"cniVer'})))
    with pytest.raises(ResultError):
        runtime.add_network_list(network, RT)
    assert not (tmp_path / "cache" / "results").exists() or not os.listdir(tmp_path / "cache" / "results")


def test_failing_del_keeps_cache_and_best_effort_still_runs_every_plugin(fake_plugins, tmp_path):
    runtime = Runtime([str(fake_plugins.dir)], cache_dir=str(tmp_path / "cache"), backend="exec", timeout=TIMEOUT)
    network = conflist_from_bytes(
        fake_plugins.conflist(
            fake_plugins.plugin("fake-a"),
            fake_plugins.plugin("fake-b", DEL={"sleep": 3600}),
            fake_plugins.plugin("fake-c", DEL={"kill": int(signal.SIGKILL)}),
        )
    )
    runtime.add_network_list(network, RT)
    with pytest.raises(MultiError) as raised:
        runtime.delete_network_list(network, RT, best_effort=True)
    assert [type(e) for e in raised.value.errors] == [PluginError, PluginTimeoutError]
    dels = [c["type"] for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
    assert dels == ["fake-c", "fake-b", "fake-a"]
    assert runtime.cache.read("testnet", "faulty", "eth0") is not None, "kept for a retry"
    time.sleep(0.1)
    assert not [p for p in fake_plugins.pids() if alive(p)]

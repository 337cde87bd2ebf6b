"""pycni.sdk.logs, the CLI's --log-level, the daemon's log lines and its sd_notify (no kernel)."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pycni.cli import cli
from pycni.sdk import PluginRequest, logs
from pycni_plugins.serve import logs as serve_logs
from pycni_plugins.serve.sockets import notify_ready

REQUEST = PluginRequest("ADD", {"name": "net 1"}, "c1", "/run/netns/x", "eth0")


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    """Each test's handler and levels undone (the test runner's logging is left as found)."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    for name in (*logs.LOGGERS, "pycni.serve"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def _journal_env(stream: io.TextIOBase) -> dict[str, str]:
    st = os.fstat(stream.fileno())
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def test_text_lines_carry_the_attachment_and_quote_a_value_that_could_forge_a_field() -> None:
    stream = io.StringIO()
    logs.configure(logging.DEBUG, stream=stream, env={})
    with logs.invocation("bridge", REQUEST):
        logging.getLogger("pycni_plugins.kernel").debug("link add %s", "veth0")
    logging.getLogger("pycni.runtime").debug("outside")
    first, second = stream.getvalue().splitlines()
    stamp, rest = first.split(" ", 1)
    assert stamp.endswith("Z") and "T" in stamp
    assert rest == (
        'DEBUG pycni_plugins.kernel: link add veth0 network="net 1" container=c1 ifname=eth0 plugin=bridge command=ADD'
    )
    assert second.endswith(" DEBUG pycni.runtime: outside")


def test_json_lines_have_time_level_logger_message_and_the_attachment() -> None:
    stream = io.StringIO()
    logs.configure(logging.INFO, fmt="json", stream=stream, env={})
    with logs.invocation("portmap", REQUEST):
        logging.getLogger("pycni_plugins.portmap").info("mapped %d", 8080)
        logging.getLogger("pycni_plugins.portmap").debug("below the level")
    (line,) = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line.pop("time").endswith("Z")
    assert line == {
        "level": "info",
        "logger": "pycni_plugins.portmap",
        "message": "mapped 8080",
        "network": "net 1",
        "container": "c1",
        "ifname": "eth0",
        "plugin": "portmap",
        "command": "ADD",
    }


def test_on_the_journal_text_lines_have_no_timestamp_but_the_syslog_priority(tmp_path: Path) -> None:
    with open(tmp_path / "journal", "w") as stream:
        logs.configure(logging.DEBUG, stream=stream, env=_journal_env(stream))
        logging.getLogger("pycni.cache").warning("careful")
        logging.getLogger("pycni.cache").debug("detail")
    assert (tmp_path / "journal").read_text().splitlines() == [
        "<4>WARNING pycni.cache: careful",
        "<7>DEBUG pycni.cache: detail",
    ]


def test_a_journal_stream_inherited_by_a_redirected_stderr_keeps_the_timestamps(tmp_path: Path) -> None:
    with open(tmp_path / "journal", "w") as journal, open(tmp_path / "file", "w") as stream:
        logs.configure(logging.DEBUG, stream=stream, env=_journal_env(journal))
        logging.getLogger("pycni.cache").warning("careful")
    assert (tmp_path / "file").read_text().split(" ", 1)[1] == "WARNING pycni.cache: careful\n"
    assert not logs.under_systemd(io.StringIO(), {"JOURNAL_STREAM": "1:2", "INVOCATION_ID": "x"})


def test_the_level_comes_from_the_environment_and_an_unknown_one_warns_and_means_warning() -> None:
    stream = io.StringIO()
    logs.configure(stream=stream, env={"PYCNI_LOG_LEVEL": "INFO"})
    assert logging.getLogger("pycni_plugins.bridge").getEffectiveLevel() == logging.INFO
    logs.configure(stream=stream, env={"PYCNI_LOG_LEVEL": "loud"})
    assert logging.getLogger("pycni").getEffectiveLevel() == logging.WARNING
    warning = "WARNING pycni: $PYCNI_LOG_LEVEL: unknown log level 'loud' (one of debug, info, warning, error, "
    assert stream.getvalue().endswith(warning + "critical); using warning\n")
    assert logging.getLogger("pyroute2").getEffectiveLevel() == logging.WARNING  # not ours


def test_the_cli_log_level_sets_pycni_loggers_and_passes_the_level_to_exec_d_plugins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYCNI_LOG_LEVEL", "error")  # restored afterwards: the CLI sets it
    result = CliRunner().invoke(cli, ["--log-level", "DEBUG", "conf", "list", "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert logging.getLogger("pycni").level == logging.DEBUG
    assert os.environ["PYCNI_LOG_LEVEL"] == "debug"


def test_the_cli_takes_a_numeric_level_as_the_plugins_and_the_daemon_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYCNI_LOG_LEVEL", "20")  # what parse_level accepts for exec'd plugins
    result = CliRunner().invoke(cli, ["conf", "list", "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert logging.getLogger("pycni").level == logging.INFO


def test_the_cli_refuses_an_unknown_log_level() -> None:
    result = CliRunner().invoke(cli, ["--log-level", "loud", "version"])
    assert result.exit_code == 2 and "Invalid value for '--log-level'" in result.output


def test_the_daemon_s_own_lines_on_the_journal_have_their_priority_and_no_timestamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(tmp_path / "journal", "w") as stream:
        monkeypatch.setattr(os, "environ", {**os.environ, **_journal_env(stream)})
        with serve_logs.logging_to(stream):
            serve_logs.log.info("serving on /x")
            logging.getLogger("pycni_plugins.kernel").debug("not at the default level")
    assert (tmp_path / "journal").read_text() == "<6>pycni serve: serving on /x\n"


def test_notify_ready_sends_ready_and_unsets_the_variable(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(path)
        environ = {"NOTIFY_SOCKET": path}
        assert notify_ready(environ) is True
        assert receiver.recv(64) == b"READY=1"
    assert environ == {}
    assert notify_ready({}) is False


def test_notify_ready_to_a_socket_nobody_reads_warns_and_goes_on(tmp_path: Path) -> None:
    stream = io.StringIO()
    logs.configure(stream=stream, env={})
    assert notify_ready({"NOTIFY_SOCKET": str(tmp_path / "absent")}) is False
    assert "WARNING pycni.serve: cannot notify systemd on" in stream.getvalue()


def test_the_default_stream_is_stderr_as_it_is_at_each_record(monkeypatch: pytest.MonkeyPatch) -> None:
    logs.configure(logging.INFO, env={})
    for _ in range(2):  # a new stderr each time, as a test runner swaps it
        stream = io.StringIO()
        monkeypatch.setattr("sys.stderr", stream)
        logging.getLogger("pycni.runtime").info("hello")
        assert stream.getvalue().endswith(" INFO pycni.runtime: hello\n")

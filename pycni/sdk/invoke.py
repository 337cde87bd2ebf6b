"""Exec'ing a plugin binary: find it, run it with env + stdin, decode what it says.

Go's ``pkg/invoke``: the runtime execs the plugins of a chain with it, and a plugin execs its
delegate (an IPAM binary) with it, so it lives in the SDK both stand on.

Beyond libcni: output is capped, a timeout kills the plugin's whole process group (SIGTERM,
then SIGKILL) and closes its pipes, a child that keeps the pipes open after the plugin exited
cannot hang the runtime, and every failure carries stderr and the exit status or signal.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypedDict

import attrs

from .. import _json
from ..errors import CNIError, ErrorCode, PluginError, PluginNotFoundError, PluginTimeoutError, ResultError
from .request import PluginRequest

__all__ = [
    "find_plugin",
    "exec_plugin",
    "exec_version",
    "plugin_failure",
    "raw_exec",
    "inheriting",
    "decode_version_info",
    "VersionInfo",
    "ExecOutcome",
    "MAX_OUTPUT",
    "PARENT_PID_ENV",
]

log = logging.getLogger("pycni.plugin")

#: Set by pycni for every plugin it execs: the PID of the process that exec'd it, so an installed
#: pycni plugin can tell at start-up that its runtime died before it got going.
PARENT_PID_ENV = "PYCNI_PARENT_PID"
MAX_OUTPUT = 16 * 1024 * 1024
TERM_GRACE = 1.0
PIPE_GRACE = 0.5
BUSY_RETRIES = 6
VERSION_STDIN = b'{"cniVersion":"1.1.0"}'


@attrs.frozen
class VersionInfo:
    cni_version: str
    supported_versions: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"cniVersion": self.cni_version, "supportedVersions": list(self.supported_versions)}


@attrs.frozen
class ExecOutcome:
    """What a finished plugin process left: its output and how it ended."""

    stdout: bytes
    stderr: bytes
    returncode: int
    duration: float


def find_plugin(plugin_type: str, paths: Sequence[str]) -> str:
    """The first ``<dir>/<type>`` that is a regular file (following symlinks), as libcni looks."""
    if not plugin_type:
        raise PluginNotFoundError("no plugin name provided")
    if "/" in plugin_type or "\x00" in plugin_type or plugin_type in (".", ".."):
        raise PluginNotFoundError(f"invalid plugin name: {plugin_type}")
    dirs = [d for d in paths if d]
    if not dirs:
        raise PluginNotFoundError("no paths provided", plugin=plugin_type, code=ErrorCode.INVALID_ENVIRONMENT_VARIABLES)
    for directory in dirs:
        candidate = os.path.join(directory, plugin_type)
        try:
            if os.path.isfile(candidate):
                return candidate
        except (OSError, ValueError):
            continue
    raise PluginNotFoundError(f'failed to find plugin "{plugin_type}" in path [{" ".join(dirs)}]', plugin=plugin_type)


_inherit = threading.local()


@contextlib.contextmanager
def inheriting(fds: Iterable[int | None]) -> Iterator[None]:
    """Plugins this thread execs inside the block inherit ``fds`` (the runtime's lock fds)."""
    saved = getattr(_inherit, "fds", ())
    _inherit.fds = saved + tuple(fd for fd in fds if fd is not None)
    try:
        yield
    finally:
        _inherit.fds = saved


def raw_exec(
    executable: str,
    stdin: bytes,
    env: Mapping[str, str],
    *,
    timeout: float | None = None,
    max_output: int | None = None,
) -> ExecOutcome:
    """Run ``executable`` in its own process group; never hangs past ``timeout`` (+ kill grace).

    Raises :class:`PluginTimeoutError` when the deadline passes and :class:`PluginError` when the
    output exceeds ``max_output`` or a leftover child keeps the pipes open after the plugin exited.
    """
    limit = MAX_OUTPUT if max_output is None else max_output
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    proc = _spawn(executable, env, deadline)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # all piped
    out, err = bytearray(), bytearray()
    failure: PluginError | None = None
    sel = selectors.DefaultSelector()
    try:
        pending = memoryview(stdin)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        exited_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            wait = 0.05 if exited_at is None else max(0.0, exited_at + PIPE_GRACE - now)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            if exited_at is not None and now >= exited_at + PIPE_GRACE:
                failure = PluginError(
                    f"plugin {executable} exited but a process it started kept its output open",
                    "the plugin's process group was killed",
                )
                break
            if deadline is not None and now >= deadline:
                failure = PluginTimeoutError(
                    f"plugin {executable} timed out after {timeout:g}s and was killed", stderr=_text(err)
                )
                break
            for key, _ in sel.select(wait):
                if key.fileobj is proc.stdin:
                    try:
                        pending = pending[os.write(proc.stdin.fileno(), pending[:65536]) :]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(key.data) > limit:
                    failure = PluginError(f"plugin {executable} wrote more than {limit} bytes of output")
                    break
            if failure is not None:
                break
    finally:
        sel.close()
        if failure is not None or proc.poll() is None:
            _kill_group(proc)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
        proc.wait()
    if failure is not None:
        raise failure
    return ExecOutcome(bytes(out), bytes(err), proc.returncode, time.monotonic() - start)


def _spawn(executable: str, env: Mapping[str, str], deadline: float | None) -> subprocess.Popen[bytes]:
    for attempt in range(BUSY_RETRIES):
        try:
            return subprocess.Popen(
                [executable],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**env, PARENT_PID_ENV: str(os.getpid())},
                close_fds=True,
                pass_fds=getattr(_inherit, "fds", ()),
                start_new_session=True,
            )
        except OSError as e:
            busy = e.errno == errno.ETXTBSY
            if busy and attempt + 1 < BUSY_RETRIES and (deadline is None or time.monotonic() + 1 < deadline):
                time.sleep(1.0)
                continue
            raise PluginError(f"netplugin failed with no error message: fork/exec {executable}: {e.strerror}") from None
    raise AssertionError("unreachable")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the plugin's process group, then SIGKILL whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(TERM_GRACE)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _text(data: bytes | bytearray, limit: int = 4096) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[:limit] + "…"


def _exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal: {signal.Signals(-returncode).name.lower().removeprefix('sig')}"
        except ValueError:
            return f"signal: {-returncode}"
    return f"exit status {returncode}"


class _ExitInfo(TypedDict):
    stderr: str
    exit_status: int


def plugin_failure(outcome: ExecOutcome) -> PluginError:
    """Map a non-zero exit to an error the way libcni's ``pluginErr`` does (plus exit info)."""
    stderr = _text(outcome.stderr)
    common = _ExitInfo(stderr=stderr, exit_status=outcome.returncode)
    if outcome.stdout.strip():
        try:
            decoded = _json.loads(outcome.stdout)
            base = CNIError.from_json(decoded)
        except (_json.JSONDecodeFailure, ResultError) as e:
            return PluginError(
                f'netplugin failed but error parsing its diagnostic message "{_text(outcome.stdout, 512)}": {e}',
                **common,
            )
        return PluginError(base.msg, base.details, code=base.code, **common)
    if stderr:
        return PluginError(f'netplugin failed: "{stderr}": {_exit_text(outcome.returncode)}', **common)
    return PluginError(f"netplugin failed with no error message: {_exit_text(outcome.returncode)}", **common)


def exec_plugin(
    plugin_type: str,
    request: PluginRequest,
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    executable: str | None = None,
) -> dict[str, Any] | None:
    """Exec the plugin for ``request``; ADD returns its decoded JSON output, others ``None``.

    The environment is the caller's (or ``env``) with all six ``CNI_*`` set.
    """
    path = executable or find_plugin(plugin_type, request.path)
    full_env = dict(os.environ if env is None else env)
    full_env.update(request.env())
    try:
        outcome = raw_exec(path, request.stdin(), full_env, timeout=timeout)
    except CNIError as e:
        e.plugin = plugin_type
        raise
    if outcome.returncode != 0:
        failure = plugin_failure(outcome)
        failure.plugin = plugin_type
        raise failure
    if outcome.stderr:
        log.info("plugin %s (%s) stderr: %s", plugin_type, request.command, _text(outcome.stderr))
    if request.command != "ADD":
        return None
    try:
        decoded = _json.loads(outcome.stdout)
    except _json.JSONDecodeFailure as e:
        raise ResultError(f"failed to unmarshal raw result: {e}", plugin=plugin_type) from None
    if decoded is None:
        decoded = {}
    if not isinstance(decoded, dict):
        raise ResultError("failed to unmarshal raw result: expected a JSON object", plugin=plugin_type)
    return decoded


def decode_version_info(data: bytes) -> VersionInfo:
    """libcni's ``PluginDecoder``: legacy 0.2.0 plugins may omit ``supportedVersions``."""
    try:
        decoded = _json.loads(data)
    except _json.JSONDecodeFailure as e:
        raise ResultError(f"decoding version info: {e}") from None
    if not isinstance(decoded, dict):
        raise ResultError("decoding version info: expected a JSON object")
    version = decoded.get("cniVersion")
    if not isinstance(version, str) or not version:
        raise ResultError("decoding version info: missing field cniVersion")
    supported = decoded.get("supportedVersions")
    if not supported:
        if version == "0.2.0":
            return VersionInfo(version, ("0.1.0", "0.2.0"))
        raise ResultError("decoding version info: missing field supportedVersions")
    if not isinstance(supported, list) or not all(isinstance(v, str) for v in supported):
        raise ResultError("decoding version info: supportedVersions must be a list of strings")
    return VersionInfo(version, tuple(supported))


def exec_version(plugin_type: str, paths: Sequence[str], *, timeout: float | None = None) -> VersionInfo:
    """VERSION with libcni's dummy env; an old plugin that does not know VERSION supports 0.1.0."""
    path = find_plugin(plugin_type, paths)
    env = dict(os.environ)
    env.update(
        CNI_COMMAND="VERSION", CNI_CONTAINERID="", CNI_NETNS="dummy", CNI_IFNAME="dummy", CNI_ARGS="", CNI_PATH="dummy"
    )
    outcome = raw_exec(path, VERSION_STDIN, env, timeout=timeout)
    if outcome.returncode != 0:
        failure = plugin_failure(outcome)
        if failure.msg == "unknown CNI_COMMAND: VERSION":
            return VersionInfo("0.1.0", ("0.1.0",))
        failure.plugin = plugin_type
        raise failure
    return decode_version_info(outcome.stdout)

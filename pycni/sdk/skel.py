"""Run a built-in plugin as a standard exec'd CNI plugin (Go's ``pkg/skel``, observable parts).

``CNI_*`` env + stdin become the same :class:`~.request.PluginRequest` the in-process path
uses, so both paths are one code path inside the plugin. Output as Go's skel prints it:

* a result: ``MarshalIndent`` with 4 spaces and no trailing newline; 1.x results with their
  keys sorted (containernetworking/cni 1.3 re-marshals them through a map), older ones in
  struct order; Go's HTML-safe escaping of ``<``, ``>`` and ``&``;
* VERSION: compact JSON and a newline;
* an error: ``{"code", "msg", "details"?}`` indented on stdout, exit status 1. Env checks and
  codes: missing variables (4), container ID (3 missing, 4 invalid), network name (7),
  interface name (4), undecodable config (6), unknown command (4); the plugin's own netns passed
  as ``CNI_NETNS`` is refused before anything changes (:meth:`.plugin.Plugin.handle`).

GC prints nothing on success (a built-in plugin's report of what it collected is for the
in-process runtime only). An installed plugin dies with the process that exec'd it (at once
under pycni, within 20 ms under another runtime), and one whose runtime died while it was
starting stops before changing anything: a runtime killed mid-ADD must not leave its plugin
running on, racing the DEL that recovers from the crash.

Usage: ``python -m pycni.sdk.skel <type>`` or :func:`main` from a generated script
(:mod:`pycni_plugins.install`).
"""

from __future__ import annotations

import importlib
import io
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn, TextIO

from .. import _json
from .._json import dumps_compact_ascii, go_escape, go_field
from ..errors import CNIError, ErrorCode
from .invoke import PARENT_PID_ENV
from .logs import LEVEL_ENV, configure
from .plugin import Plugin, builtin_plugin, internal_errors, preset_registry
from .request import PluginRequest, default_state_dir
from .validate import NAME_PATTERN, validate_attachment_key, validate_container_id

__all__ = ["run", "respond", "error_output", "main"]

_REQUIRED = (
    ("CNI_COMMAND", ("ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION")),
    ("CNI_CONTAINERID", ("ADD", "CHECK", "DEL")),
    ("CNI_NETNS", ("ADD", "CHECK")),
    ("CNI_IFNAME", ("ADD", "CHECK", "DEL")),
    ("CNI_PATH", ("ADD", "CHECK", "DEL", "GC", "STATUS")),
)


def _error(msg: str, code: int, details: str = "") -> CNIError:
    return CNIError(msg, details, code=code)


def _dump(obj: Any, *, sort: bool) -> str:
    return go_escape(json.dumps(obj, indent=4, sort_keys=sort, ensure_ascii=False))


def _request(env: Mapping[str, str], stdin: bytes) -> PluginRequest:
    command = env.get("CNI_COMMAND", "")
    missing = [name for name, cmds in _REQUIRED if (command in cmds or name == "CNI_COMMAND") and not env.get(name)]
    if missing:
        raise _error(f"required env variables [{','.join(missing)}] missing", ErrorCode.INVALID_ENVIRONMENT_VARIABLES)
    config: Any = {}
    if command == "VERSION":
        # Only a plugin that reads it (the chain's inner list) looks; a runtime's dummy or
        # garbage stdin is no error for VERSION.
        try:
            config = _json.loads(stdin)
        except _json.JSONDecodeFailure:
            pass
        if not isinstance(config, dict):
            config = {}
    else:
        try:
            config = _json.loads(stdin)
        except _json.JSONDecodeFailure as e:
            raise _error(f"error unmarshall network config: {e}", ErrorCode.DECODING_FAILURE) from None
        if not isinstance(config, dict):
            raise _error("error unmarshall network config: not a JSON object", ErrorCode.DECODING_FAILURE)
        if command in ("ADD", "CHECK", "DEL"):
            cid = env.get("CNI_CONTAINERID", "")
            validate_container_id(cid)
            name = go_field(config, "name")
            if not isinstance(name, str) or not name:
                raise _error("missing network name", ErrorCode.INVALID_NETWORK_CONFIG)
            if not NAME_PATTERN.fullmatch(name):
                raise _error("invalid characters found in network name", ErrorCode.INVALID_NETWORK_CONFIG, name)
            validate_attachment_key(name, cid, env.get("CNI_IFNAME", ""))
    path = tuple(p for p in env.get("CNI_PATH", "").split(":") if p)
    return PluginRequest(
        command=command,
        config=config,
        container_id=env.get("CNI_CONTAINERID", ""),
        netns=env.get("CNI_NETNS", ""),
        ifname=env.get("CNI_IFNAME", ""),
        args=env.get("CNI_ARGS", ""),
        path=path,
        state_dir=default_state_dir(env),
    )


def error_output(error: CNIError) -> bytes:
    """``error`` as a plugin prints it on stdout (exit status 1)."""
    return _dump(error.to_json(), sort=False).encode("utf-8", "surrogateescape")


def run(plugin: Plugin, env: Mapping[str, str], stdin: bytes, stdout: TextIO) -> int:
    """One exec'd invocation: returns the exit status (0 or 1) after printing to ``stdout``."""
    try:
        with internal_errors(plugin.type):
            request = _request(env, stdin)
            out = plugin.handle(request)
            if request.command == "VERSION":
                stdout.write(dumps_compact_ascii(out) + "\n")
            elif out is not None and request.command != "GC":
                version = str(out.get("cniVersion", ""))
                stdout.write(_dump(out, sort=version.startswith("1.")))
        return 0
    except CNIError as e:
        stdout.write(_dump(e.to_json(), sort=False))
    return 1


def _load(target: str) -> Plugin:
    module, _, name = target.partition(":")
    plugin: Plugin = getattr(importlib.import_module(module), name)()
    return plugin


_PR_SET_PDEATHSIG = 1
_WATCH_PARENT = 0.02


def _parent_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _orphaned() -> NoReturn:
    sys.stderr.write("pycni plugin: the process that exec'd it is gone; stopping before changing anything\n")
    os._exit(1)


def _die_with_parent() -> None:
    """Die with the process that exec'd this one, and stop now if it is already gone.

    A runtime killed while this interpreter was starting has already left it to init or a
    subreaper, so the parent must be neither PID 1 nor, when pycni exec'd it, anything but the
    PID pycni passed (``PYCNI_PARENT_PID``) unless that process still lives (a foreign plugin in
    between, e.g. a Go bridge delegating to this IPAM plugin with its environment). Nothing has
    been changed yet, so stopping here leaves nothing a DEL could not clean.

    From then on: under pycni, whose calling thread waits for the plugin, the kernel kills it
    with that thread (``PR_SET_PDEATHSIG``, ~2 ms for ``ctypes``, which plugins that enter a
    namespace import anyway). The signal follows the forking *thread*, which a foreign runtime
    (Go) may end while its child runs, so under any other parent a watcher thread compares the
    parent PID every 20 ms instead.
    """
    import signal

    parent = os.getppid()
    expected = os.environ.get(PARENT_PID_ENV, "")
    if expected == str(parent):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # died before the prctl took effect
            _orphaned()
        return
    if parent == 1 or (expected.isdigit() and not _parent_alive(int(expected))):
        _orphaned()
    import threading
    import time

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(_WATCH_PARENT)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def respond(plugin: Plugin | None, plugin_type: str, env: Mapping[str, str], stdin: bytes) -> tuple[int, bytes]:
    """The exit status and stdout bytes of one invocation of ``plugin`` (``None``: not built in).

    The text is encoded as UTF-8, with the undecodable bytes of the environment restored
    (``surrogateescape``), whatever the locale: what the exec'd plugin and ``pycni serve``
    answer is the same bytes.
    """
    if plugin is None:
        return 1, error_output(_error(f"unknown built-in plugin {plugin_type!r}", ErrorCode.INTERNAL))
    out = io.StringIO()
    status = run(plugin, env, stdin, out)
    return status, out.getvalue().encode("utf-8", "surrogateescape")


def main(
    plugin_type: str, target: str | None = None, stdin: bytes | None = None, targets: Mapping[str, str] | None = None
) -> NoReturn:
    """Entry point of an installed plugin script: exits with the CNI exit status.

    ``target`` (``module:Class``, resolved from the entry point at install time) spares the
    entry-point scan, which imports every built-in plugin (~40 ms). ``stdin`` is the request
    when the caller has read it already (a shim falling back to running the plugin itself);
    ``targets`` (every built-in type's ``module:Class``, from install time) spares the scan when
    the plugin looks another built-in up (a chain's inner plugins, a bridge's IPAM).
    ``$PYCNI_LOG_LEVEL`` turns its log (stderr) on (:mod:`.logs`).
    It leaves through ``os._exit`` once stdout is written: a one-shot plugin has nothing to
    finalise, and interpreter teardown would only add milliseconds to every call.
    """
    _die_with_parent()
    if os.environ.get(LEVEL_ENV):
        configure()
    if targets:
        preset_registry(targets)
    plugin = _load(target) if target else builtin_plugin(plugin_type)
    status, out = respond(plugin, plugin_type, os.environ, sys.stdin.buffer.read() if stdin is None else stdin)
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
    os._exit(status)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m pycni.sdk.skel <plugin type>\n")
        sys.exit(2)
    main(sys.argv[1])

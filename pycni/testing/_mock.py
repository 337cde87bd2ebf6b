"""Test helpers for code that drives pycni: a fake plugin backend (httpx's ``MockTransport`` idea).

:class:`MockBackend` is a :class:`~pycni.backends.Backend` that answers every plugin call from
a handler you supply and records each call; it never execs anything or touches the kernel, so
``Runtime(..., backend=MockBackend(handler))`` or ``pycni.client.CNI(backend=...)`` exercise
the runtime's own logic (chaining, caching, DEL order, error mapping) unprivileged::

    def handler(call: PluginCall) -> dict[str, Any] | None:
        if call.command == "ADD" and call.plugin_type == "bridge":
            return {"cniVersion": call.cni_version, "ips": [{"address": "198.18.0.2/24"}]}
        return call.prev_result  # pass-through for every other plugin and command

    backend = MockBackend(handler)
    Runtime((), cache_dir=tmp, backend=backend).add_network_list(conflist, rt)
    assert [c.plugin_type for c in backend.calls] == ["bridge", "portmap"]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .. import _json
from ..errors import CNIError, PluginError
from ..sdk import PluginRequest
from ..sdk.invoke import VersionInfo
from ..version import CURRENT, SUPPORTED

__all__ = ["MockBackend", "PluginCall", "Handler", "passthrough"]


@attrs.frozen
class PluginCall:
    """One plugin call as the plugin would have seen it: its ``CNI_*`` environment and the
    decoded stdin ``config`` (a copy: the handler cannot alias the runtime's objects)."""

    plugin_type: str
    command: str
    config: dict[str, Any]
    env: dict[str, str]
    container_id: str
    netns: str
    ifname: str
    args: str

    @property
    def cni_version(self) -> str:
        value = self.config.get("cniVersion")
        return value if isinstance(value, str) else ""

    @property
    def network_name(self) -> str:
        value = self.config.get("name")
        return value if isinstance(value, str) else ""

    @property
    def prev_result(self) -> dict[str, Any] | None:
        value = self.config.get("prevResult")
        return value if isinstance(value, dict) else None


# The result of an ADD (a result document), of a GC (optionally ``{"removed": [...]}``), or None.
Handler = Callable[[PluginCall], Mapping[str, Any] | None]


def passthrough(call: PluginCall) -> dict[str, Any] | None:
    """ADD returns the prevResult (or an empty result of the config's version); the rest succeed."""
    if call.command != "ADD":
        return None
    return call.prev_result or {"cniVersion": call.cni_version or CURRENT}


class MockBackend:
    """A backend answering each plugin call from ``handler`` (default :func:`passthrough`).

    ``calls`` records every call in order. A :class:`~pycni.errors.CNIError` the handler raises
    reaches the runtime as a :class:`~pycni.errors.PluginError` with its code, message and
    details, as a failing plugin's JSON error would; any other exception propagates unchanged
    (a bug in the test). Every type is found (at ``<mock>``) and supports ``versions``.
    """

    name = "mock"

    def __init__(self, handler: Handler = passthrough, *, versions: Sequence[str] = SUPPORTED) -> None:
        self.handler = handler
        self.versions = tuple(versions)
        self.calls: list[PluginCall] = []

    def find(self, plugin_type: str, paths: Sequence[str]) -> str:
        return f"<mock>/{plugin_type}"

    def run(self, plugin_type: str, request: PluginRequest) -> dict[str, Any] | None:
        config = _json.loads(request.stdin())
        call = PluginCall(
            plugin_type=plugin_type,
            command=request.command,
            config=config,
            env=request.env(),
            container_id=request.container_id,
            netns=request.netns,
            ifname=request.ifname,
            args=request.args,
        )
        self.calls.append(call)
        try:
            out = self.handler(call)
        except CNIError as e:
            raise PluginError(e.msg, e.details, code=e.code, plugin=plugin_type) from e
        if out is None or request.command not in ("ADD", "GC"):
            return {} if request.command == "ADD" else None
        # Through JSON, as from a plugin's stdout: the runtime cannot alias the handler's objects.
        copy: dict[str, Any] = _json.loads(_json.dumps_compact(dict(out)))
        return copy

    def version_info(self, plugin_type: str, paths: Sequence[str]) -> VersionInfo:
        return VersionInfo(self.versions[-1], self.versions)

    def is_builtin(self, plugin_type: str) -> bool:
        return False

    def validate(self, plugin_type: str, request: PluginRequest) -> None:
        """Like an exec'd plugin: nothing to check before the call."""

"""Running a network list's plugins with libcni's semantics, nothing else: no cache, no locks.

ADD in order threading ``prevResult``, DEL in reverse with a given ``prevResult``, CHECK in
order, GC and STATUS to every plugin, each plugin's stdin built by :mod:`.runtime_conf`
(``name``/``cniVersion`` from the list, its own capabilities' ``runtimeConfig``). Two users:
:class:`pycni.runtime.Runtime`, which adds the results cache and the locks around it, and the
chain plugin (:mod:`pycni.chain`), which runs a folded list inside one plugin call, where the
outer runtime keeps the cache.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from . import netns as _netns
from . import version as _version
from .backends import Backend
from .config import NetworkConfig, NetworkConfigList
from .errors import CNIError, ResultError, VersionError
from .failpoints import failpoint
from .runtime_conf import RuntimeConf, build_config, build_request
from .sdk.attachment import GCAttachment
from .sdk.invoke import VersionInfo
from .sdk.validate import validate_attachment_key, validate_container_id, validate_network_name
from .types import AnyResult, convert, parse_result

__all__ = ["ListRunner", "describe", "DRY_RUN_KEY"]

#: GC stdin key asking a built-in plugin to report what it would collect without collecting it.
DRY_RUN_KEY = "pycni.dev/dry-run"
T = TypeVar("T")
log = logging.getLogger("pycni.runtime")


def describe(plugin: NetworkConfig, op: str) -> str:
    """The context libcni puts before a plugin's error: ``plugin type="bridge" failed (add)``."""
    name = f' name="{plugin.name}"' if plugin.name else ""
    return f'plugin type="{plugin.type}"{name} failed ({op})'


class ListRunner:
    """Runs the plugins of a :class:`~pycni.config.NetworkConfigList` through ``backend``.

    ``path``: ``CNI_PATH``; ``state_dir``: the plugins' records; ``host_netns``: run plugins in
    that network namespace (a path) instead of the caller's; ``strip_capabilities``: drop
    ``capabilities`` from plugin stdin (spec 1.1; libcni keeps it).
    """

    def __init__(
        self,
        path: Sequence[str],
        backend: Backend,
        state_dir: str,
        *,
        host_netns: str | None = None,
        strip_capabilities: bool = False,
    ) -> None:
        self.path = tuple(path)
        self.backend = backend
        self.state_dir = state_dir
        self.host_netns = host_netns
        self.strip_capabilities = strip_capabilities
        self._hosting = threading.local()

    def in_host(self, fn: Callable[..., T], *args: Any) -> T:
        # The calling thread enters the host namespace itself (no thread per call), so what the
        # plugins keep per thread (nftables contexts, netlink sockets) is reused across calls.
        stay: contextlib.ExitStack | None = getattr(self._hosting, "stay", None)
        if stay is None:
            with _netns.entered(self.host_netns):
                return fn(*args)
        if not self._hosting.inside:
            stay.enter_context(_netns.entered(self.host_netns))
            self._hosting.inside = True
        return fn(*args)

    @contextlib.contextmanager
    def hosted(self) -> Iterator[None]:
        """One operation's plugin calls (a list's ADDs, its rollback DELs) share one visit to
        ``host_netns``: the first call enters it (failing there, as each call did alone) and
        the thread leaves it when the block ends, not after every plugin. The path is opened
        once per operation, so a namespace replaced between operations is the next one's."""
        if self.host_netns is None or getattr(self._hosting, "stay", None) is not None:
            yield
            return
        with contextlib.ExitStack() as stay:
            self._hosting.stay, self._hosting.inside = stay, False
            try:
                yield
            finally:
                self._hosting.stay = None

    def run(self, plugin: NetworkConfig, command: str, config: dict[str, Any], rt: RuntimeConf | None) -> Any:
        request = build_request(command, config, rt, self.path, self.state_dir)
        if not log.isEnabledFor(logging.DEBUG):
            return self.in_host(self.backend.run, plugin.type, request)
        started, outcome = time.monotonic(), "code 0"
        try:
            return self.in_host(self.backend.run, plugin.type, request)
        except BaseException as e:
            outcome = f"code {e.code}" if isinstance(e, CNIError) else type(e).__name__
            raise
        finally:
            log.debug(
                "plugin %s %s network=%s container=%s ifname=%s: %s in %.1fms",
                plugin.type,
                command,
                config.get("name", "-"),
                rt.container_id if rt else "-",
                rt.ifname if rt else "-",
                outcome,
                (time.monotonic() - started) * 1000,
            )

    def config(self, net: NetworkConfigList, plugin: NetworkConfig, **kw: Any) -> dict[str, Any]:
        return build_config(
            plugin, name=net.name, cni_version=net.cni_version, strip_capabilities=self.strip_capabilities, **kw
        )

    # -- ADD -----------------------------------------------------------------------------

    def preflight(self, net: NetworkConfigList, rt: RuntimeConf) -> None:
        """libcni's per-plugin checks (look-up, then container ID, network name, ifname), done for
        the whole chain before any plugin runs, plus each built-in plugin's own config check, so
        a missing fourth plugin or a bad value in the third fails before the first has changed
        anything (libcni would find out half-way)."""
        for plugin in net.plugins:
            try:
                self.backend.find(plugin.type, self.path)
                if plugin is net.plugins[0]:  # the same for every plugin: once (as the first's error)
                    validate_container_id(rt.container_id)
                    validate_network_name(net.name)
                    validate_attachment_key(net.name, rt.container_id, rt.ifname)
                if self.backend.is_builtin(plugin.type):
                    config = self.config(net, plugin, capability_args=rt.capability_args)
                    self.backend.validate(plugin.type, build_request("ADD", config, rt, self.path, self.state_dir))
            except CNIError as e:
                raise e.with_context(describe(plugin, "add")) from e

    def add(self, net: NetworkConfigList, rt: RuntimeConf, *, rollback: bool = False) -> AnyResult:
        """Every plugin's ADD in order, each given the previous result; the last result.

        Stops at the first failure. With ``rollback``, the plugins that ran (the failing one
        included) are DEL'd in reverse before the error is raised.
        """
        prev: AnyResult | None = None
        with self.hosted():
            for index, plugin in enumerate(net.plugins):
                failpoint("runtime.add.before-plugin")
                try:
                    prev = self.add_one(net, plugin, rt, prev)
                except CNIError as e:
                    error = e.with_context(describe(plugin, "add"))
                    if rollback:
                        self.rollback(net, net.plugins[: index + 1], rt, prev, error)
                    raise error from e
        assert prev is not None  # a list has at least one plugin
        return prev

    def add_one(
        self, net: NetworkConfigList, plugin: NetworkConfig, rt: RuntimeConf, prev: AnyResult | None
    ) -> AnyResult:
        config = self.config(
            net, plugin, prev_result=None if prev is None else prev.to_json(), capability_args=rt.capability_args
        )
        raw = self.run(plugin, "ADD", config, rt)
        return parse_result(raw, config_version=net.cni_version)

    def rollback(
        self,
        net: NetworkConfigList,
        ran: Sequence[NetworkConfig],
        rt: RuntimeConf,
        prev: AnyResult | None,
        error: CNIError,
    ) -> None:
        """DEL ``ran`` in reverse (best effort) after ``error``, which gets the DELs' failures."""
        failures = self.delete(net, ran, rt, self.prev_for_del(net, prev), best_effort=True)
        error.rollback_errors = tuple(failures)
        for failure in failures:
            error.add_note(f"rollback: {failure}")

    # -- DEL -----------------------------------------------------------------------------

    def prev_for_del(self, net: NetworkConfigList, result: AnyResult | None) -> dict[str, Any] | None:
        """A result as DEL's ``prevResult`` at the list's version (none before 0.4.0)."""
        if result is None or not _version.supports_prev_result_on_del(net.cni_version):
            return None
        try:
            return convert(result, net.cni_version).to_json()
        except ResultError:
            return result.to_json()

    def delete(
        self,
        net: NetworkConfigList,
        plugins: Sequence[NetworkConfig],
        rt: RuntimeConf,
        prev: Mapping[str, Any] | None,
        *,
        best_effort: bool,
    ) -> list[CNIError]:
        """DEL ``plugins`` in reverse with ``prev``. The first failure is raised unless
        ``best_effort``: then every plugin runs and the failures are returned."""
        failures: list[CNIError] = []
        with self.hosted():
            for plugin in reversed(plugins):
                failpoint("runtime.del.before-plugin")
                config = self.config(net, plugin, prev_result=prev, capability_args=rt.capability_args)
                try:
                    self.run(plugin, "DEL", config, rt)
                except CNIError as e:
                    error = e.with_context(describe(plugin, "delete"))
                    if not best_effort:
                        raise error from e
                    failures.append(error)
        return failures

    # -- CHECK, GC, STATUS ---------------------------------------------------------------

    def check(self, net: NetworkConfigList, rt: RuntimeConf, prev: Mapping[str, Any] | None) -> None:
        """CHECK every plugin in order, each given the same (cached) result."""
        with self.hosted():
            for plugin in net.plugins:
                config = self.config(net, plugin, prev_result=prev, capability_args=rt.capability_args)
                self.run(plugin, "CHECK", config, rt)

    def gc(
        self, net: NetworkConfigList, valid: Sequence[GCAttachment] | None, *, extra: Mapping[str, Any] | None = None
    ) -> tuple[list[CNIError], list[str]]:
        """GC to every plugin with ``valid`` (``extra`` keys added to each stdin); the failures,
        and what the plugins that report (built-in ones) said they removed."""
        failures: list[CNIError] = []
        removed: list[str] = []
        with self.hosted():
            for plugin in net.plugins:
                config = self.config(net, plugin, valid_attachments=valid, gc=True)
                config.update(extra or {})
                try:
                    out = self.run(plugin, "GC", config, None)
                except CNIError as e:
                    failures.append(e.with_context(f"failed to GC plugin {plugin.type}"))
                    continue
                if isinstance(out, dict):
                    removed.extend(str(item) for item in out.get("removed", ()))
        return failures, removed

    def status(self, net: NetworkConfigList) -> None:
        """STATUS every plugin in order; the first error keeps its code (50/51)."""
        with self.hosted():
            for plugin in net.plugins:
                self.run(plugin, "STATUS", self.config(net, plugin), None)

    # -- versions --------------------------------------------------------------------------

    def version_info(self, plugin_type: str) -> VersionInfo:
        return self.in_host(self.backend.version_info, plugin_type, self.path)

    def plugin_versions(self, net: NetworkConfigList, plugin: NetworkConfig) -> VersionInfo:
        """``plugin``'s VERSION answer. A built-in one is given its config, as an exec'd one is
        not (libcni sends a dummy): the chain plugin's answer depends on its inner list."""
        if not self.backend.is_builtin(plugin.type):
            return self.version_info(plugin.type)
        out = self.run(plugin, "VERSION", self.config(net, plugin), None)
        return VersionInfo(out["cniVersion"], tuple(out["supportedVersions"]))

    def supported_versions(self, plugins: Iterable[NetworkConfig]) -> tuple[str, ...]:
        """The versions every one of ``plugins`` supports, in the first one's order."""
        common: list[str] | None = None
        for plugin in plugins:
            supported = self.version_info(plugin.type).supported_versions
            common = list(supported) if common is None else [v for v in common if v in supported]
        return tuple(common or ())

    def validate(self, net: NetworkConfigList) -> tuple[list[CNIError], list[str]]:
        """Each plugin must exist and support the list's version: the failures, and the
        capabilities the list enables (file order, no repeats)."""
        failures: list[CNIError] = []
        caps: list[str] = []
        wanted = net.cni_version or "0.1.0"
        for plugin in net.plugins:
            try:
                self.backend.find(plugin.type, self.path)
                info = self.plugin_versions(net, plugin)
                if wanted not in info.supported_versions:
                    raise VersionError(
                        f'plugin {plugin.type} does not support config version "{net.cni_version}"',
                        f"plugin supports {list(info.supported_versions)}",
                    )
            except CNIError as e:
                failures.append(e)
                continue
            caps.extend(c for c in plugin.capabilities if c not in caps)
        return failures, caps

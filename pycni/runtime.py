"""The runtime: libcni's ``api.go`` (ADD/CHECK/DEL/GC/STATUS over a network list or one plugin).

Semantics follow libcni v1.3 exactly (``libcni/api.go``; SPEC.md "Execution of Network
Configurations" and "Garbage Collection"), plus what libcni lacks:
per-container and per-network locking across processes, atomic cache writes, ADD with
rollback, best-effort DEL, a per-call plugin timeout, and plugins run in a chosen host
network namespace (``host_netns``) rather than only the caller's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from . import netns as _netns
from . import version as _version
from .backends import Backend, select_backend, validate_timeout
from .cache import DEFAULT_CACHE_DIR, CachedAttachment, ResultsCache
from .config import NetworkConfig, NetworkConfigList, conflist_from_conf
from .errors import CacheError, CNIError, InvalidArgumentError, MultiError, ResultError, VersionError
from .failpoints import failpoint
from .runtime_conf import RuntimeConf, build_config, build_request
from .sdk import default_state_dir
from .sdk.attachment import GCAttachment
from .sdk.invoke import VersionInfo, inheriting
from .sdk.validate import validate_attachment_key, validate_container_id, validate_network_name
from .types import AnyResult, convert, parse_result

__all__ = ["Runtime", "ReconcileReport", "DEFAULT_PLUGIN_PATH", "DRY_RUN_KEY"]

#: Where plugins are looked for without ``CNI_PATH``: the CNI convention, then Debian's and
#: Ubuntu's ``containernetworking-plugins`` package. Every pycni entry point uses this one.
DEFAULT_PLUGIN_PATH = ("/opt/cni/bin", "/usr/lib/cni")
#: GC stdin key asking a built-in plugin to report what it would collect without collecting it.
DRY_RUN_KEY = "pycni.dev/dry-run"
T = TypeVar("T")
log = logging.getLogger("pycni.runtime")


@attrs.frozen
class ReconcileReport:
    """What :meth:`Runtime.reconcile_network_list` found (and, unless ``dry_run``, removed)."""

    network: str
    dry_run: bool
    stale_attachments: tuple[str, ...] = ()
    collected: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "dryRun": self.dry_run,
            "staleAttachments": list(self.stale_attachments),
            "collected": list(self.collected),
            "skipped": list(self.skipped),
            "errors": list(self.errors),
        }


def _describe(plugin: NetworkConfig, op: str) -> str:
    name = f' name="{plugin.name}"' if plugin.name else ""
    return f'plugin type="{plugin.type}"{name} failed ({op})'


class Runtime:
    """Runs network lists for attachments, as libcni's ``CNIConfig``.

    ``path``: plugin directories (``CNI_PATH``); ``cache_dir``: results cache root;
    ``state_dir``: the plugins' own records (in-process: the request's ``state_dir``; exec'd:
    ``$PYCNI_STATE_DIR``; default :func:`pycni.sdk.default_state_dir`);
    ``backend``: ``exec``, ``inprocess``, ``auto`` or a :class:`~pycni.backends.Backend`;
    ``timeout``: seconds per exec'd plugin call; ``host_netns``: run plugins in that network
    namespace (a path) instead of the caller's; ``strip_capabilities``: drop ``capabilities``
    from plugin stdin as spec 1.1 says (libcni keeps it, the default here too).
    """

    def __init__(
        self,
        path: Sequence[str] | None = None,
        *,
        cache_dir: str = DEFAULT_CACHE_DIR,
        state_dir: str | None = None,
        backend: str | Backend | None = None,
        timeout: float | None = None,
        host_netns: str | None = None,
        strip_capabilities: bool = False,
    ) -> None:
        validate_timeout(timeout)
        if path is None:
            env_path = os.environ.get("CNI_PATH")
            path = env_path.split(":") if env_path else DEFAULT_PLUGIN_PATH
        self.path = tuple(path)
        self.cache = ResultsCache(cache_dir)
        self.state_dir = state_dir or default_state_dir()
        self.backend = (
            backend
            if backend is not None and not isinstance(backend, str)
            else select_backend(backend, timeout=timeout)
        )
        self.host_netns = host_netns
        self.strip_capabilities = strip_capabilities

    # -- plumbing ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, network: str, container_id: str) -> Iterator[None]:
        """The network (shared) and container locks of one operation. Exec'd plugins inherit the
        container lock, so one that outlives a killed runtime holds off the next operation on
        that container until it is done (instead of racing it)."""
        with (
            self.cache.network_lock(network, exclusive=False) as nfd,
            self.cache.container_lock(container_id) as cfd,
            inheriting((nfd, cfd)),
        ):
            yield

    def _in_host(self, fn: Callable[..., T], *args: Any) -> T:
        # The calling thread enters the host namespace itself (no thread per call), so what the
        # plugins keep per thread (nftables contexts, netlink sockets) is reused across calls.
        with _netns.entered(self.host_netns):
            return fn(*args)

    def _run(self, plugin: NetworkConfig, command: str, config: dict[str, Any], rt: RuntimeConf | None) -> Any:
        request = build_request(command, config, rt, self.path, self.state_dir)
        if not log.isEnabledFor(logging.DEBUG):
            return self._in_host(self.backend.run, plugin.type, request)
        started, outcome = time.monotonic(), "code 0"
        try:
            return self._in_host(self.backend.run, plugin.type, request)
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

    def _config(self, net: NetworkConfigList, plugin: NetworkConfig, **kw: Any) -> dict[str, Any]:
        return build_config(
            plugin, name=net.name, cni_version=net.cni_version, strip_capabilities=self.strip_capabilities, **kw
        )

    # -- ADD -----------------------------------------------------------------------------

    def add_network_list(self, net: NetworkConfigList, rt: RuntimeConf, *, rollback: bool = False) -> AnyResult:
        """Run every plugin's ADD in order, chaining results; cache and return the last one.

        Stops at the first failure. With ``rollback``, the plugins that ran (the failing one
        included) are DEL'd in reverse before the error is raised. An unusable cache is reported
        before any plugin runs; if the final cache write still fails, every plugin is DEL'd, as
        nothing would remember the attachment otherwise.
        """
        with self._locked(net.name, rt.container_id):
            self.cache.ensure_writable()
            self._preflight(net, rt)
            self._refuse_attached_elsewhere(net, rt)
            prev: AnyResult | None = None
            for index, plugin in enumerate(net.plugins):
                failpoint("runtime.add.before-plugin")
                try:
                    prev = self._add_one(net, plugin, rt, prev)
                except CNIError as e:
                    error = e.with_context(_describe(plugin, "add"))
                    if rollback:
                        self._rollback(net, net.plugins[: index + 1], rt, prev, error)
                    raise error from e
            assert prev is not None
            failpoint("runtime.add.before-cache-write")
            try:
                self._write_cache(net, rt, prev, net.bytes)
            except CacheError as e:
                self._rollback(net, net.plugins, rt, prev, e)
                raise
            return prev

    def _preflight(self, net: NetworkConfigList, rt: RuntimeConf) -> None:
        """libcni's per-plugin checks (look-up, then container ID, network name, ifname), done for
        the whole chain before any plugin runs, plus each built-in plugin's own config check, so
        a missing fourth plugin or a bad value in the third fails before the first has changed
        anything (libcni would find out half-way)."""
        for plugin in net.plugins:
            try:
                self.backend.find(plugin.type, self.path)
                validate_container_id(rt.container_id)
                validate_network_name(net.name)
                validate_attachment_key(net.name, rt.container_id, rt.ifname)
                if self.backend.is_builtin(plugin.type):
                    config = self._config(net, plugin, capability_args=rt.capability_args)
                    self.backend.validate(plugin.type, build_request("ADD", config, rt, self.path, self.state_dir))
            except CNIError as e:
                raise e.with_context(_describe(plugin, "add")) from e

    def _refuse_attached_elsewhere(self, net: NetworkConfigList, rt: RuntimeConf) -> None:
        """The spec's "not the same (CNI_CONTAINERID, CNI_IFNAME) twice without a DEL", for an
        attachment cached with another netns: refused before any plugin runs, so no plugin and
        no rollback DEL (which would be that attachment's DEL) touches what it holds. A repeated
        ADD into the same netns goes on to the plugins, as libcni's does."""
        try:
            entry = self.cache.read(net.name, rt.container_id, rt.ifname)
        except CacheError:
            return  # an undecodable entry names no netns, and this ADD's cache write replaces it
        if entry is None or not entry.netns or _same_netns(entry.netns, rt.netns):
            return
        raise InvalidArgumentError(
            f'CNI_CONTAINERID "{rt.container_id}" with CNI_IFNAME "{rt.ifname}" is already attached to '
            f'network "{net.name}" in netns "{entry.netns}", not CNI_NETNS "{rt.netns}": DEL it first'
        )

    def _add_one(
        self, net: NetworkConfigList, plugin: NetworkConfig, rt: RuntimeConf, prev: AnyResult | None
    ) -> AnyResult:
        config = self._config(
            net, plugin, prev_result=None if prev is None else prev.to_json(), capability_args=rt.capability_args
        )
        raw = self._run(plugin, "ADD", config, rt)
        return parse_result(raw, config_version=net.cni_version)

    def _rollback(
        self,
        net: NetworkConfigList,
        ran: Sequence[NetworkConfig],
        rt: RuntimeConf,
        prev: AnyResult | None,
        error: CNIError,
    ) -> None:
        prev_json = self._convert_for_del(net, prev)
        failures = self._delete_plugins(net, ran, rt, prev_json, best_effort=True)
        error.rollback_errors = tuple(failures)
        for failure in failures:
            error.add_note(f"rollback: {failure}")

    def _write_cache(self, net: NetworkConfigList, rt: RuntimeConf, result: AnyResult, config: bytes) -> None:
        entry = CachedAttachment(
            container_id=rt.container_id,
            network=net.name,
            ifname=rt.ifname,
            config=config,
            netns=rt.netns,
            cni_args=rt.args,
            capability_args=dict(rt.capability_args),
            result=result.to_json(),
        )
        try:
            self.cache.write(entry)
        except CNIError as e:
            raise CacheError(f'failed to set network "{net.name}" cached result: {e}') from e

    # -- cached results ------------------------------------------------------------------

    def _cached_result(self, net: NetworkConfigList, rt: RuntimeConf) -> AnyResult | None:
        entry = self.cache.read(net.name, rt.container_id, rt.ifname)
        if entry is None or entry.result is None:
            return None
        result = parse_result(entry.result)  # libcni's CreateFromBytes: the cached result's own version
        try:
            return convert(result, net.cni_version)
        except ResultError as e:
            raise ResultError(
                f'failed to convert cached result to config version "{net.cni_version}": {e.msg}'
            ) from None

    def get_network_list_cached_result(self, net: NetworkConfigList, rt: RuntimeConf) -> AnyResult | None:
        """The cached ADD result converted to the list's version; ``None`` when there is none."""
        return self._cached_result(net, rt)

    def get_network_list_cached_config(
        self, net: NetworkConfigList, rt: RuntimeConf
    ) -> tuple[bytes | None, RuntimeConf]:
        """The config bytes cached at ADD and ``rt`` with the cached args/capability args restored."""
        entry = self.cache.read(net.name, rt.container_id, rt.ifname)
        if entry is None or not entry.config:
            return None, rt
        args = entry.cni_args if entry.cni_args else rt.args
        return entry.config, attrs.evolve(rt, args=args, capability_args=dict(entry.capability_args))

    def get_cached_attachments(self, container_id: str | None = None) -> list[CachedAttachment]:
        return self.cache.attachments(container_id)

    # -- DEL -----------------------------------------------------------------------------

    def _convert_for_del(self, net: NetworkConfigList, result: AnyResult | None) -> dict[str, Any] | None:
        if result is None or not _version.supports_prev_result_on_del(net.cni_version):
            return None
        try:
            return convert(result, net.cni_version).to_json()
        except ResultError:
            return result.to_json()

    def _delete_plugins(
        self,
        net: NetworkConfigList,
        plugins: Sequence[NetworkConfig],
        rt: RuntimeConf,
        prev: Mapping[str, Any] | None,
        *,
        best_effort: bool,
    ) -> list[CNIError]:
        failures: list[CNIError] = []
        for plugin in reversed(plugins):
            failpoint("runtime.del.before-plugin")
            config = self._config(net, plugin, prev_result=prev, capability_args=rt.capability_args)
            try:
                self._run(plugin, "DEL", config, rt)
            except CNIError as e:
                error = e.with_context(_describe(plugin, "delete"))
                if not best_effort:
                    raise error from e
                failures.append(error)
        return failures

    def delete_network_list(self, net: NetworkConfigList, rt: RuntimeConf, *, best_effort: bool = False) -> None:
        """DEL every plugin in reverse with the cached result; remove the cache on success.

        An unreadable cache is deleted and DEL goes on without ``prevResult``. A plugin failure
        stops DEL and keeps the cache for a retry; with ``best_effort`` every plugin still runs
        and all failures are raised together (:class:`~pycni.errors.MultiError`).
        """
        validate_attachment_key(net.name, rt.container_id, rt.ifname)
        with self._locked(net.name, rt.container_id):
            self._delete_locked(net, rt, best_effort=best_effort)

    def _delete_locked(self, net: NetworkConfigList, rt: RuntimeConf, *, best_effort: bool) -> None:
        prev: dict[str, Any] | None = None
        if _version.supports_prev_result_on_del(net.cni_version):
            try:
                cached = self._cached_result(net, rt)
            except CNIError:
                self.cache.delete(net.name, rt.container_id, rt.ifname)
                cached = None
            prev = None if cached is None else cached.to_json()
        failures = self._delete_plugins(net, net.plugins, rt, prev, best_effort=best_effort)
        if failures:
            raise failures[0] if len(failures) == 1 else MultiError(failures)
        failpoint("runtime.del.before-cache-delete")
        try:
            self.cache.delete(net.name, rt.container_id, rt.ifname)
        except CacheError:
            pass

    # -- CHECK ---------------------------------------------------------------------------

    def check_network_list(self, net: NetworkConfigList, rt: RuntimeConf) -> None:
        """CHECK every plugin in order against the cached result (needs ≥ 0.4.0)."""
        if not _version.supports_check(net.cni_version):
            raise VersionError(f'configuration version "{net.cni_version}" does not support the CHECK command')
        if net.disable_check:
            return
        validate_attachment_key(net.name, rt.container_id, rt.ifname)
        with self._locked(net.name, rt.container_id):
            try:
                cached = self._cached_result(net, rt)
            except CNIError as e:
                raise CacheError(f'failed to get network "{net.name}" cached result: {e}') from e
            prev = None if cached is None else cached.to_json()
            for plugin in net.plugins:
                config = self._config(net, plugin, prev_result=prev, capability_args=rt.capability_args)
                self._run(plugin, "CHECK", config, rt)

    # -- GC ------------------------------------------------------------------------------

    def gc_network_list(self, net: NetworkConfigList, valid_attachments: Iterable[GCAttachment] | None = None) -> None:
        """DEL cached attachments of this network not in ``valid_attachments`` (all of them when
        ``None``), then send GC to every plugin (≥ 1.1.0). Runs exclusively of ADD/DEL on the
        network; every failure is collected and raised together.
        """
        if net.disable_gc:
            return
        valid = None if valid_attachments is None else list(valid_attachments)
        keep = {(a.container_id, a.ifname) for a in valid or ()}
        with self.cache.network_lock(net.name, exclusive=True):
            stale = [
                e for e in self.cache.attachments() if e.network == net.name and (e.container_id, e.ifname) not in keep
            ]
            failures = self._delete_stale(net, stale, best_effort=False)
            if _version.supports_gc(net.cni_version):
                for plugin in net.plugins:
                    config = self._config(net, plugin, valid_attachments=valid, gc=True)
                    try:
                        self._run(plugin, "GC", config, None)
                    except CNIError as e:
                        failures.append(e.with_context(f"failed to GC plugin {plugin.type}"))
        if failures:
            raise failures[0] if len(failures) == 1 else MultiError(failures)

    def _delete_stale(
        self, net: NetworkConfigList, entries: Iterable[CachedAttachment], *, best_effort: bool
    ) -> list[CNIError]:
        """DEL each cached attachment under its container lock (the caller holds the network's);
        returns the failures, each saying which attachment it was."""
        failures: list[CNIError] = []
        for entry in entries:
            rt = RuntimeConf(
                container_id=entry.container_id,
                netns=entry.netns,
                ifname=entry.ifname,
                args=entry.cni_args,
                capability_args=dict(entry.capability_args),
            )
            try:
                with self.cache.container_lock(rt.container_id) as fd, inheriting((fd,)):
                    self._delete_locked(net, rt, best_effort=best_effort)
            except CNIError as e:
                failures.append(e.with_context(f"failed to delete stale attachment {rt.container_id} {rt.ifname}"))
        return failures

    def reconcile_network_list(self, net: NetworkConfigList, *, dry_run: bool = False) -> ReconcileReport:
        """GC that collects what crashes and reboots leave behind (``pycni gc --reconcile``).

        Cached attachments whose network namespace is gone (:func:`pycni.netns.is_netns`) are stale: they
        are DEL'd with their cached parameters. Every other cached attachment is valid, and the
        plugins get GC with that list, so they remove leases, links and nftables elements of
        attachments nobody remembers (a crash before the cache was written). Built-in plugins
        get GC at 1.1.0 even when the list is older (they support it), and report what they
        collected. With ``dry_run`` nothing is changed: stale attachments are only listed and
        only built-in plugins are asked (to report, not act); they are told that the stale
        attachments are valid, so what they report is what the GC itself would collect
        (the DELs take care of the stale ones).
        """
        collected: list[str] = []
        skipped: list[str] = []
        errors: list[str] = []
        with self.cache.network_lock(net.name, exclusive=True):
            entries = [e for e in self.cache.attachments() if e.network == net.name]
            alive = [_netns.is_netns(e.netns) for e in entries]
            gone = [e for e, ok in zip(entries, alive) if not ok]
            valid = [GCAttachment(e.container_id, e.ifname) for e, ok in zip(entries, alive) if ok or dry_run]
            stale_names = [f"{e.container_id}/{e.ifname} (netns {e.netns or '-'} gone)" for e in gone]
            if not dry_run:
                errors += [str(e) for e in self._delete_stale(net, gone, best_effort=True)]
            for plugin in net.plugins:
                builtin = self.backend.is_builtin(plugin.type)
                version = net.cni_version
                if not _version.supports_gc(version):
                    if not builtin:
                        skipped.append(f"{plugin.type}: config version {version!r} predates GC")
                        continue
                    version = _version.CURRENT
                if dry_run and not builtin:
                    skipped.append(f"{plugin.type}: an exec'd plugin cannot report without collecting")
                    continue
                config = build_config(
                    plugin,
                    name=net.name,
                    cni_version=version,
                    valid_attachments=valid,
                    gc=True,
                    strip_capabilities=self.strip_capabilities,
                )
                if dry_run:
                    config[DRY_RUN_KEY] = True
                try:
                    out = self._run(plugin, "GC", config, None)
                except CNIError as e:
                    errors.append(f"failed to GC plugin {plugin.type}: {e}")
                    continue
                if isinstance(out, dict):
                    collected.extend(f"{plugin.type}: {item}" for item in out.get("removed", ()))
        return ReconcileReport(net.name, dry_run, tuple(stale_names), tuple(collected), tuple(skipped), tuple(errors))

    # -- STATUS --------------------------------------------------------------------------

    def get_status_network_list(self, net: NetworkConfigList) -> None:
        """STATUS every plugin (≥ 1.1.0, else a no-op); the first error keeps its code (50/51)."""
        if not _version.supports_status(net.cni_version):
            return
        for plugin in net.plugins:
            self._run(plugin, "STATUS", self._config(net, plugin), None)

    # -- validation and versions -----------------------------------------------------------

    def get_version_info(self, plugin_type: str) -> VersionInfo:
        return self._in_host(self.backend.version_info, plugin_type, self.path)

    def validate_network_list(self, net: NetworkConfigList) -> list[str]:
        """Every plugin must exist and support the list's version; returns enabled capabilities."""
        failures: list[CNIError] = []
        caps: list[str] = []
        wanted = net.cni_version or "0.1.0"
        for plugin in net.plugins:
            try:
                self.backend.find(plugin.type, self.path)
                info = self.get_version_info(plugin.type)
                if wanted not in info.supported_versions:
                    raise VersionError(
                        f'plugin {plugin.type} does not support config version "{net.cni_version}"',
                        f"plugin supports {list(info.supported_versions)}",
                    )
            except CNIError as e:
                failures.append(e)
                continue
            caps.extend(c for c in plugin.capabilities if c not in caps)
        if failures:
            raise MultiError(failures)
        return caps

    # -- single-plugin variants (libcni AddNetwork & co.) ------------------------------------

    def add_network(self, conf: NetworkConfig, rt: RuntimeConf) -> AnyResult:
        """ADD one plugin config (its own ``name``/``cniVersion``); caches the plugin's bytes."""
        net = conflist_from_conf(conf)
        with self._locked(net.name, rt.container_id):
            self.cache.ensure_writable()
            self._preflight(net, rt)
            self._refuse_attached_elsewhere(net, rt)
            try:
                result = self._add_one(net, net.plugins[0], rt, None)
            except CNIError as e:
                raise e.with_context(_describe(net.plugins[0], "add")) from e
            self._write_cache(net, rt, result, conf.bytes)
            return result

    def check_network(self, conf: NetworkConfig, rt: RuntimeConf) -> None:
        self.check_network_list(attrs.evolve(conflist_from_conf(conf), disable_check=False), rt)

    def delete_network(self, conf: NetworkConfig, rt: RuntimeConf) -> None:
        self.delete_network_list(conflist_from_conf(conf), rt)

    def get_status_network(self, conf: NetworkConfig) -> None:
        self.get_status_network_list(conflist_from_conf(conf))

    def validate_network(self, conf: NetworkConfig) -> list[str]:
        return self.validate_network_list(conflist_from_conf(conf))


def _same_netns(a: str, b: str) -> bool:
    """Whether two netns paths name the same file (one namespace bind-mounted at both)."""
    if a == b:
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)

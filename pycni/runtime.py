"""The runtime: libcni's ``api.go`` (ADD/CHECK/DEL/GC/STATUS over a network list or one plugin).

Semantics follow libcni v1.3 exactly (``libcni/api.go``; SPEC.md "Execution of Network
Configurations" and "Garbage Collection"), plus what libcni lacks:
per-container and per-network locking across processes, atomic cache writes, ADD with
rollback, best-effort DEL, a per-call plugin timeout, and plugins run in a chosen host
network namespace (``host_netns``) rather than only the caller's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs

from . import netns as _netns
from . import version as _version
from .backends import Backend, select_backend, validate_timeout
from .cache import DEFAULT_CACHE_DIR, CachedAttachment, ResultsCache
from .config import NetworkConfig, NetworkConfigList, conflist_from_conf
from .errors import CacheError, CNIError, InvalidArgumentError, MultiError, ResultError, VersionError
from .failpoints import failpoint
from .list_runner import DRY_RUN_KEY, ListRunner, describe
from .runtime_conf import RuntimeConf, build_config
from .sdk import default_state_dir
from .sdk.attachment import GCAttachment
from .sdk.invoke import VersionInfo, inheriting
from .sdk.validate import validate_attachment_key
from .types import AnyResult, convert, parse_result

__all__ = ["Runtime", "ReconcileReport", "DEFAULT_PLUGIN_PATH", "DRY_RUN_KEY"]

#: Where plugins are looked for without ``CNI_PATH``: the CNI convention, then Debian's and
#: Ubuntu's ``containernetworking-plugins`` package. Every pycni entry point uses this one.
DEFAULT_PLUGIN_PATH = ("/opt/cni/bin", "/usr/lib/cni")


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


class Runtime:
    """Runs network lists for attachments, as libcni's ``CNIConfig``: a :class:`ListRunner`
    (how the plugins of a list run) plus the results cache and the locks.

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
        if backend is None or isinstance(backend, str):
            backend = select_backend(backend, timeout=timeout)
        self.cache = ResultsCache(cache_dir)
        #: How the plugins of a list run (shared with the chain plugin, :mod:`pycni.chain`).
        self.plugins = ListRunner(
            path,
            backend,
            state_dir or default_state_dir(),
            host_netns=host_netns,
            strip_capabilities=strip_capabilities,
        )

    @property
    def path(self) -> tuple[str, ...]:
        return self.plugins.path

    @property
    def backend(self) -> Backend:
        return self.plugins.backend

    @property
    def state_dir(self) -> str:
        return self.plugins.state_dir

    @property
    def host_netns(self) -> str | None:
        return self.plugins.host_netns

    @property
    def strip_capabilities(self) -> bool:
        return self.plugins.strip_capabilities

    # -- plumbing ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, network: str, container_id: str) -> Iterator[None]:
        """The network (shared) and container locks of one operation. Exec'd plugins inherit the
        container lock, so one that outlives a killed runtime holds off the next operation on
        that container until it is done (instead of racing it)."""
        with self.cache.attachment_locks(network, container_id) as fds, inheriting(fds):
            yield

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
            self.plugins.preflight(net, rt)
            self._refuse_attached_elsewhere(net, rt)
            result = self.plugins.add(net, rt, rollback=rollback)
            failpoint("runtime.add.before-cache-write")
            try:
                self._write_cache(net, rt, result, net.bytes)
            except CacheError as e:
                self.plugins.rollback(net, net.plugins, rt, result, e)
                raise
            return result

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
        failures = self.plugins.delete(net, net.plugins, rt, prev, best_effort=best_effort)
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
            self.plugins.check(net, rt, None if cached is None else cached.to_json())

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
                failures += self.plugins.gc(net, valid)[0]
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
        with self.cache.network_lock(net.name, exclusive=True), self.plugins.hosted():
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
                    out = self.plugins.run(plugin, "GC", config, None)
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
        self.plugins.status(net)

    # -- validation and versions -----------------------------------------------------------

    def get_version_info(self, plugin_type: str) -> VersionInfo:
        return self.plugins.version_info(plugin_type)

    def validate_network_list(self, net: NetworkConfigList) -> list[str]:
        """Every plugin must exist and support the list's version; returns enabled capabilities."""
        failures, caps = self.plugins.validate(net)
        if failures:
            raise MultiError(failures)
        return caps

    # -- single-plugin variants (libcni AddNetwork & co.) ------------------------------------

    def add_network(self, conf: NetworkConfig, rt: RuntimeConf) -> AnyResult:
        """ADD one plugin config (its own ``name``/``cniVersion``); caches the plugin's bytes."""
        net = conflist_from_conf(conf)
        with self._locked(net.name, rt.container_id):
            self.cache.ensure_writable()
            self.plugins.preflight(net, rt)
            self._refuse_attached_elsewhere(net, rt)
            try:
                result = self.plugins.add_one(net, net.plugins[0], rt, None)
            except CNIError as e:
                raise e.with_context(describe(net.plugins[0], "add")) from e
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

"""The chain plugin (type ``pycni-chain``): a whole network list run inside one plugin call.

Its config is one entry of a conflist whose ``plugins`` key holds an inner list with a
conflist's schema (the form :func:`pycni.chain.fold` writes). It runs that list with the
runtime's own code (:class:`pycni.list_runner.ListRunner`), so with libcni's semantics: ADD in
order threading ``prevResult`` (the last result is its result), DEL in reverse with the
``prevResult`` it was given, CHECK in order, GC and STATUS to every inner plugin, VERSION the
intersection of the inner plugins' versions (when the config is given). Each inner plugin gets
the chain's ``name`` and ``cniVersion`` and, of the chain's ``runtimeConfig``, only the keys its
own ``capabilities`` enable; the chain's ``capabilities`` must cover theirs. Inner built-in types
run in this process (in ``pycni serve``: in the worker that entered the caller's namespaces),
the others are exec'd from ``CNI_PATH``. An inner DEL failure stops DEL unless the config says
``"bestEffortDel": true``; then every inner plugin runs and every failure is reported.

The chain writes no cache: the runtime that called it keeps one entry per network, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .. import _json
from .. import version as _version
from ..backends import AutoBackend
from ..config import NetworkConfigList, conflist_from_bytes
from ..errors import CNIError, ConfigError, ErrorCode, InvalidArgumentError, MultiError
from ..list_runner import DRY_RUN_KEY, ListRunner
from ..runtime_conf import VALID_ATTACHMENTS_KEY, RuntimeConf, format_cni_args
from ..sdk import GCAttachment, GCReport, Plugin, PluginRequest

__all__ = ["ChainPlugin", "CHAIN_TYPE", "BEST_EFFORT_DEL_KEY"]

CHAIN_TYPE = "pycni-chain"
#: The chain's config key asking DEL to run every inner plugin and report every failure.
BEST_EFFORT_DEL_KEY = "bestEffortDel"


def _invalid(msg: str, details: str = "") -> CNIError:
    return CNIError(f"{CHAIN_TYPE}: {msg}", details, code=ErrorCode.INVALID_NETWORK_CONFIG)


def inner_list(config: Mapping[str, Any]) -> NetworkConfigList:
    """The inner network list of a chain config, parsed as a conflist with the chain's ``name``
    and ``cniVersion``; raises code 7 when it is missing or not a valid list."""
    plugins = config.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise _invalid('its config needs a non-empty "plugins" list (a conflist\'s, as `pycni conf fold` writes)')
    name = _json.go_field(config, "name")
    version = _json.go_field(config, "cniVersion")
    listing = {"name": name if isinstance(name, str) else "", "cniVersion": version or "", "plugins": plugins}
    try:
        net = conflist_from_bytes(_json.dumps_compact(listing).encode())
    except ConfigError as e:
        raise _invalid(f"inner plugins: {e.msg}") from None
    if any(p.type == CHAIN_TYPE for p in net.plugins):
        raise _invalid("a chain cannot hold another chain")
    return net


def check_capabilities(config: Mapping[str, Any], net: NetworkConfigList) -> None:
    """The chain's enabled ``capabilities`` must cover every inner plugin's: the runtime injects
    ``runtimeConfig`` only for those it sees. Absent (a runtime that strips them, as spec 1.1
    allows), there is nothing to compare."""
    declared = config.get("capabilities")
    if declared is None:
        return
    enabled = {k for k, v in declared.items() if v is True} if isinstance(declared, Mapping) else set()
    missing = [(cap, p.type) for p in net.plugins for cap in p.capabilities if cap not in enabled]
    if missing:
        wanted = ", ".join(f'"{cap}" (plugin type="{kind}")' for cap, kind in missing)
        raise _invalid(
            f"its capabilities must cover the inner plugins': missing {wanted}",
            "set each to true in the chain's capabilities, or re-fold the list with `pycni conf fold`",
        )


def _cni_args(text: str) -> tuple[tuple[str, str], ...]:
    """``CNI_ARGS`` as pairs that format back to exactly ``text`` (the inner plugins get it)."""
    pairs = tuple((key, value) for key, _, value in (item.partition("=") for item in text.split(";"))) if text else ()
    try:
        same = format_cni_args(pairs) == text
    except InvalidArgumentError:
        same = False
    if not same:
        raise CNIError(f'invalid CNI_ARGS "{text}"', code=ErrorCode.INVALID_ENVIRONMENT_VARIABLES)
    return pairs


def _said(error: CNIError) -> CNIError:
    """An inner plugin's error as the chain says it: which plugin failed (the context the list
    runner added) is part of the message, in-process as on stdout."""
    if not error.context:
        return error
    return CNIError(f"{error.context}: {error.msg}", error.details, code=error.code, plugin=error.plugin)


class ChainPlugin(Plugin):
    """Runs the inner list of its config (see the module's docstring)."""

    type = CHAIN_TYPE

    @staticmethod
    def _runner(request: PluginRequest) -> ListRunner:
        return ListRunner(request.path, AutoBackend(), request.state_dir)

    @staticmethod
    def _attachment(request: PluginRequest) -> RuntimeConf:
        return RuntimeConf(
            container_id=request.container_id,
            netns=request.netns,
            ifname=request.ifname,
            args=_cni_args(request.args),
            capability_args=dict(request.runtime_config),
        )

    def _parts(self, request: PluginRequest) -> tuple[NetworkConfigList, RuntimeConf, ListRunner]:
        net = inner_list(request.config)
        check_capabilities(request.config, net)
        return net, self._attachment(request), self._runner(request)

    def add(self, request: PluginRequest) -> dict[str, Any]:
        net, rt, runner = self._parts(request)
        runner.preflight(net, rt)
        return runner.add(net, rt).to_json()

    def delete(self, request: PluginRequest) -> None:
        net, rt, runner = self._parts(request)
        best_effort = request.config.get(BEST_EFFORT_DEL_KEY) is True
        failures = runner.delete(net, net.plugins, rt, request.prev_result, best_effort=best_effort)
        if failures:
            raise failures[0] if len(failures) == 1 else MultiError(failures)

    def check(self, request: PluginRequest) -> None:
        net, rt, runner = self._parts(request)
        runner.check(net, rt, request.prev_result)

    def gc(self, request: PluginRequest) -> GCReport | None:
        net = inner_list(request.config)
        check_capabilities(request.config, net)
        runner = self._runner(request)
        listed = request.config.get(VALID_ATTACHMENTS_KEY)
        valid = None if listed is None else [GCAttachment.from_json(item) for item in listed]
        extra: dict[str, Any] = {}
        if request.config.get(DRY_RUN_KEY) is True:
            # Only built-in plugins can say what they would collect without collecting it.
            extra[DRY_RUN_KEY] = True
            net = attrs.evolve(net, plugins=tuple(p for p in net.plugins if runner.backend.is_builtin(p.type)))
        failures, removed = runner.gc(net, valid, extra=extra) if net.plugins else ([], [])
        if failures:
            raise failures[0] if len(failures) == 1 else MultiError(failures)
        return GCReport(tuple(removed))

    def status(self, request: PluginRequest) -> None:
        net, _, runner = self._parts(request)
        runner.status(net)

    def handle(self, request: PluginRequest) -> dict[str, Any] | None:
        try:
            if request.command == "VERSION" and "plugins" in request.config:
                return self._versions(request)
            return super().handle(request)
        except CNIError as e:
            raise _said(e) from e

    def validate(self, request: PluginRequest) -> None:
        try:
            net, rt, runner = self._parts(request)
            runner.preflight(net, rt)
        except CNIError as e:
            raise _said(e) from e

    def _versions(self, request: PluginRequest) -> dict[str, Any]:
        """VERSION given the chain's config: what this plugin and every inner one support."""
        net = inner_list(request.config)
        common = self._runner(request).supported_versions(net.plugins)
        supported = [v for v in self.supported_versions if v in common]
        current = _version.CURRENT if _version.CURRENT in supported else (supported[-1] if supported else "")
        return {"cniVersion": current, "supportedVersions": supported}

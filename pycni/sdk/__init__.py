"""The plugin SDK: the layer the runtime and the plugins both stand on.

A plugin implements :class:`Plugin` and receives a :class:`PluginRequest`, whether the runtime
calls it in-process or it was exec'd as a binary (:mod:`.skel`); it reads ``CNI_ARGS`` with
:meth:`PluginRequest.load_args` and runs a delegate (an IPAM plugin) with :func:`delegate`. The
SDK imports only :mod:`pycni.errors`, :mod:`pycni.types`, :mod:`pycni._json`, :mod:`pycni.version`
and the standard library; neither the runtime nor the plugins are imported by it.

Modules: :mod:`.request` (PluginRequest), :mod:`.plugin` (the contract, the built-in registry,
delegation), :mod:`.args` (``CNI_ARGS``), :mod:`.validate` (names, IDs, ifnames), :mod:`.invoke`
(exec'ing a plugin binary), :mod:`.skel` (the exec'd entry point), :mod:`.cancel` (waits that
give up when the caller has gone), :mod:`.logs` (the log level and the attachment on each record).
"""

from __future__ import annotations

from .args import load_args, parse_cni_args
from .attachment import Attachment, GCAttachment
from .invoke import find_plugin
from .plugin import (
    COMMANDS,
    GCReport,
    Plugin,
    builtin_plugin,
    builtin_plugins,
    delegate,
    environ,
    environment,
    internal_errors,
)
from .request import DEFAULT_STATE_DIR, STATE_DIR_ENV, PluginRequest, default_state_dir
from .validate import (
    ifname_problem,
    validate_attachment_key,
    validate_container_id,
    validate_ifname,
    validate_network_name,
)

__all__ = [
    "Attachment",
    "COMMANDS",
    "DEFAULT_STATE_DIR",
    "GCAttachment",
    "STATE_DIR_ENV",
    "GCReport",
    "Plugin",
    "PluginRequest",
    "builtin_plugin",
    "builtin_plugins",
    "default_state_dir",
    "delegate",
    "environ",
    "environment",
    "find_plugin",
    "ifname_problem",
    "internal_errors",
    "load_args",
    "parse_cni_args",
    "validate_attachment_key",
    "validate_container_id",
    "validate_ifname",
    "validate_network_name",
]

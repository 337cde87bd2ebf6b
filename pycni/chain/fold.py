"""Folding a network list into one ``pycni-chain`` plugin, and back.

``fold`` keeps every top-level key of the list (``name``, ``cniVersion``/``cniVersions``,
``disableCheck``, ``disableGC``…: the runtime still reads them) and replaces ``plugins`` with one
chain plugin holding the original entries unchanged, whose ``capabilities`` are the union of
theirs (so the runtime injects the same ``runtimeConfig``). A single-plugin ``.conf`` folds into
a one-entry chain. Drop-ins (``<dir>/<name>/*.conf``) are not folded: the runtime appends them
after the chain, where they ran before. ``unfold`` puts each chain's inner plugins back in its
place.
"""

from __future__ import annotations

import json
from typing import Any

from .. import _json
from ..config import conf_from_bytes, conflist_from_bytes
from ..errors import ConfigError
from .plugin import BEST_EFFORT_DEL_KEY, CHAIN_TYPE

__all__ = ["fold", "unfold", "is_folded"]


def _dump(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


def _object(data: bytes | str, source: str | None) -> dict[str, Any]:
    raw = _json.loads(data)
    if not isinstance(raw, dict):
        raise ConfigError("error parsing configuration list: expected a JSON object", path=source, code=6)
    return raw


def fold(data: bytes | str, *, best_effort_del: bool = False, source: str | None = None) -> bytes:
    """The folded form of a conflist (or a single-plugin conf), as indented JSON bytes.

    ``best_effort_del`` sets the chain's ``bestEffortDel``: DEL runs every inner plugin and
    reports every failure. A list that is already folded is refused.
    """
    raw = _object(data, source)
    if "plugins" not in raw and "type" in raw:
        conf = conf_from_bytes(data, source)  # a .conf: validated as libcni would, then listed
        raw = {"cniVersion": conf.cni_version, "name": conf.name, "plugins": [raw]}
    else:
        conflist_from_bytes(data, source)  # validated as the runtime will load it
    if is_folded(raw):
        raise ConfigError(f"the list is folded already (its one plugin is {CHAIN_TYPE})", path=source)
    plugins = raw["plugins"]
    caps: dict[str, bool] = {}
    for entry in plugins:
        declared = entry.get("capabilities")
        if isinstance(declared, dict):
            caps.update((cap, True) for cap, on in declared.items() if on is True)
    chain: dict[str, Any] = {"type": CHAIN_TYPE}
    if caps:
        chain["capabilities"] = caps
    if best_effort_del:
        chain[BEST_EFFORT_DEL_KEY] = True
    chain["plugins"] = plugins
    return _dump({key: [chain] if key == "plugins" else value for key, value in raw.items()})


def is_folded(conflist: dict[str, Any]) -> bool:
    """Whether a decoded conflist holds a chain plugin."""
    plugins = conflist.get("plugins")
    return isinstance(plugins, list) and any(isinstance(p, dict) and p.get("type") == CHAIN_TYPE for p in plugins)


def unfold(data: bytes | str, *, source: str | None = None) -> bytes:
    """The conflist a folded one came from: each chain plugin replaced by its inner plugins."""
    conflist_from_bytes(data, source)
    raw = _object(data, source)
    if not is_folded(raw):
        raise ConfigError(f"the list is not folded (no {CHAIN_TYPE} plugin)", path=source)
    plugins: list[Any] = []
    for entry in raw["plugins"]:
        if entry.get("type") != CHAIN_TYPE:
            plugins.append(entry)
            continue
        inner = entry.get("plugins")
        if not isinstance(inner, list) or not inner:
            raise ConfigError(f'the {CHAIN_TYPE} plugin has no "plugins" list', path=source)
        plugins.extend(inner)
    return _dump({key: plugins if key == "plugins" else value for key, value in raw.items()})

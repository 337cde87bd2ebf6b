"""Failpoints: named places where a fault can be injected, for the reliability suite.

``failpoint("bridge.add.after-veth")`` does nothing unless ``PYCNI_FAILPOINTS`` names it, e.g.
``PYCNI_FAILPOINTS=bridge.add.after-veth=kill`` (SIGKILL this process, as a crash would),
``...=raise`` (raise a CNI error, as a failing kernel call would) or ``...=sleep:30`` (stall
there, so that a test can kill the caller while this process is mid-operation). Several
entries are separated by ``,``; ``name=kill@3`` fires on the third hit. When
``PYCNI_FAILPOINTS_LOG`` names a file, a line ``<name> <pid>`` is appended to it just before a
failpoint acts (so a test knows it was reached, and by which process). The check is one dict
lookup when the variable is unset, so failpoints stay in production code at no cost.

Every failpoint of the runtime and the built-in plugins, in the order the default chain
(loopback, bridge with host-local, firewall, portmap) reaches them; ptp's ipMasq reaches the
``nft.*.masq.*`` ones too (``tests/unit/test_failpoints.py`` checks this list against the code):

* ADD: ``runtime.add.before-plugin`` (per plugin), ``bridge.add.after-bridge``,
  ``bridge.add.after-record``, ``bridge.add.after-veth``, ``nft.apply.spoofchk.after-record``,
  ``bridge.add.after-spoofchk``, ``host-local.add.after-lease``, ``bridge.add.after-ipam``,
  ``bridge.add.after-container``, ``bridge.add.after-gateway``, ``nft.apply.masq.after-record``,
  ``bridge.add.after-masq``, ``firewall.add.after-ensure``, ``nft.apply.firewall.after-record``,
  ``nft.apply.portmap.after-record``, ``portmap.add.after-nft``,
  ``runtime.add.before-cache-write``;
* DEL: ``runtime.del.before-plugin`` (per plugin), ``nft.release.portmap.after-commit``,
  ``nft.release.firewall.after-commit``, ``bridge.del.after-link``,
  ``nft.release.spoofchk.after-commit``, ``nft.release.masq.after-commit``,
  ``bridge.del.after-nft``, ``host-local.del.before-release``, ``bridge.del.after-ipam``,
  ``runtime.del.before-cache-delete``.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from .errors import CNIError, ErrorCode

__all__ = ["failpoint", "reload"]

_actions: dict[str, tuple[str, int]] = {}
_hits: dict[str, int] = {}
_lock = threading.Lock()


def reload() -> None:
    """Re-read ``PYCNI_FAILPOINTS`` (tests change it at run time)."""
    _actions.clear()
    _hits.clear()
    for entry in filter(None, (e.strip() for e in os.environ.get("PYCNI_FAILPOINTS", "").split(","))):
        name, _, action = entry.partition("=")
        action, _, nth = (action or "kill").partition("@")
        _actions[name] = (action, int(nth or 1))


def _log(name: str) -> None:
    path = os.environ.get("PYCNI_FAILPOINTS_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{name} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def failpoint(name: str) -> None:
    if not _actions or name not in _actions:
        return
    action, nth = _actions[name]
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != nth:
            return
    _log(name)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action.startswith("sleep"):
        time.sleep(float(action.partition(":")[2] or 3600))
        return
    raise CNIError(f"injected fault at {name}", code=ErrorCode.INTERNAL)


reload()

"""Test tooling for pycni and for code that drives it, kept apart from the runtime.

- the mock backend (re-exported here): :class:`MockBackend` answers plugin calls from a handler,
  so ``Runtime``/``CNI`` run unprivileged, with no exec and no kernel;
- :mod:`pycni.testing.probes`: ping and TCP echo between namespaces (the demo, tests, bench);
- :mod:`pycni.testing.strategies`: hypothesis strategies for CNI (the ``fuzz`` extra);
- :mod:`pycni.testing.fuzz`: ``pycni fuzz``, a plugin executable against the CNI contract.

Importing this package loads only the mock backend: the submodules pull in hypothesis or the
kernel libraries (pyroute2, libnftables), which the runtime never needs.
"""

from __future__ import annotations

from ._mock import Handler, MockBackend, PluginCall, passthrough

__all__ = ["MockBackend", "PluginCall", "Handler", "passthrough"]

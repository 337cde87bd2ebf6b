"""Nomad's CNI network configurator: set up, check and tear down one allocation's network.

Drives a go-cni style client (:class:`pycni.client.CNI`) the way Nomad's
``cniNetworkConfigurator`` drives go-cni:

- the network config is loaded lazily, and again whenever the client says it is not initialized;
- a new namespace (``created``) gets ADD with up to 3 attempts, 1 s + U[0, 1000) ms apart (racing
  plugins creating the shared bridge used to fail), reporting the *first* error;
- an existing namespace (agent restart, host reboot) gets CHECK, but only when the bridge plugin
  is ≥ 1.3.0 (older CHECKs are broken); a failed CHECK is a :class:`CheckFailedError`, on which
  the caller destroys and recreates the namespace once; otherwise nothing runs and None returns;
- teardown is DEL with the port maps and no args; if DEL fails (netns gone underneath), forced
  cleanup removes the allocation's leftover NAT state and its report is returned.

One process-wide lock serialises every setup and teardown, as Nomad's does (iptables races).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import CNIError
from ..gocni_result import GoCNIResult
from .args import cni_args
from .cleanup import CleanupReport, force_cleanup
from .conf import ConfSource, load_cni_conf
from .errors import CheckFailedError, InitError, SetupError
from .models import Allocation, Node
from .ports import port_mappings
from .semver import at_least
from .status import AllocNetworkStatus, alloc_net_status, with_consul_dns
from .tproxy import transparent_proxy_config

__all__ = [
    "GoCNIClient",
    "NetworkConfigurator",
    "make_client",
    "ADD_ATTEMPTS",
    "BRIDGE_VERSION_ATTR",
    "CHECK_MIN_BRIDGE_VERSION",
]

ADD_ATTEMPTS = 3
BRIDGE_VERSION_ATTR = "plugins.cni.version.bridge"
CHECK_MIN_BRIDGE_VERSION = (1, 3, 0)
DEFAULT_INTERFACE_PREFIX = "eth"

log = logging.getLogger("pycni.nomad")
_serialised = threading.Lock()


class GoCNIClient(Protocol):
    """What the configurator uses of :class:`pycni.client.CNI`."""

    def status(self) -> None: ...

    def load(self, *opts: Any) -> None: ...

    def setup(self, container_id: str, path: str, *ns_opts: Any) -> GoCNIResult: ...

    def check(self, container_id: str, path: str, *ns_opts: Any) -> None: ...

    def remove(self, container_id: str, path: str, *ns_opts: Any) -> None: ...


def make_client(cni_path: str = "", interface_prefix: str = "", **kwargs: Any) -> GoCNIClient:
    """A client as Nomad makes one: ``cni_path`` (":"-separated) falls back to ``$CNI_PATH``, then
    :data:`pycni.runtime.DEFAULT_PLUGIN_PATH`; the interface prefix to ``eth``. ``kwargs`` go to
    :class:`pycni.client.CNI`."""
    from .. import client
    from ..runtime import DEFAULT_PLUGIN_PATH

    path = cni_path or os.environ.get("CNI_PATH") or os.pathsep.join(DEFAULT_PLUGIN_PATH)
    return client.CNI(
        plugin_dirs=[d for d in path.split(os.pathsep) if d],
        interface_prefix=interface_prefix or DEFAULT_INTERFACE_PREFIX,
        **kwargs,
    )


class NetworkConfigurator:
    """Nomad's configurator for one network (a ``bridge`` conflist or a ``cni/<name>`` config).

    ``conf``: conflist bytes, a ``(conf_dir, network_name)`` pair to look up as Nomad does, or a
    :class:`ConfSource`. ``sleep`` and ``rng`` (``randrange``) pace the ADD retries; ``cleanup``
    is called as ``cleanup(network_name, alloc_id)`` when DEL fails (default: :func:`force_cleanup`).
    """

    def __init__(
        self,
        client: GoCNIClient,
        conf: bytes | tuple[str, str] | ConfSource,
        node: Node,
        *,
        ignore_port_mapping_host_ip: bool = True,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        cleanup: Callable[[str, str], CleanupReport] = force_cleanup,
    ) -> None:
        if isinstance(conf, tuple):
            conf = load_cni_conf(*conf)
        elif not isinstance(conf, ConfSource):
            conf = ConfSource.from_conflist(conf)
        self.client = client
        self.conf = conf
        self.node = node
        self.ignore_port_mapping_host_ip = ignore_port_mapping_host_ip
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._cleanup = cleanup

    @property
    def network_name(self) -> str:
        return self.conf.name

    def _prepare(self) -> None:
        """Host-side preparation before every setup, under the lock (the bridge's forwarding rule)."""

    def _ensure_initialized(self) -> None:
        from .. import client

        try:
            self.client.status()
            return
        except client.NotInitializedError:
            pass
        self.client.load(self.conf.option(client))

    def setup(self, alloc: Allocation, netns_path: str, created: bool) -> AllocNetworkStatus | None:
        """ADD (``created``) and return the network status, or CHECK an existing namespace (None)."""
        from .. import client

        with _serialised:
            self._prepare()
            try:
                self._ensure_initialized()
            except CNIError as e:
                raise InitError(e) from e
            ports = port_mappings(alloc, self.ignore_port_mapping_host_ip)
            tproxy = transparent_proxy_config(alloc, self.node, netns_path, ports)
            ns_opts = (client.with_capability_port_map(ports.capability()), client.with_labels(cni_args(alloc, tproxy)))

            if not created:
                self._check(alloc.id, netns_path, ns_opts)
                return None

            status = alloc_net_status(self._add(alloc.id, netns_path, ns_opts))
            if tproxy is not None and tproxy.consul_dns_ip:
                # No port needed: the tproxy rules DNAT the namespace's port-53 traffic to Consul.
                status = with_consul_dns(status, tproxy.consul_dns_ip)
            return status

    def _check(self, alloc_id: str, netns_path: str, ns_opts: tuple[Any, ...]) -> None:
        version = self.node.attributes.get(BRIDGE_VERSION_ATTR, "")
        if not at_least(version, CHECK_MIN_BRIDGE_VERSION):
            log.debug(
                "network namespace exists but could not check if networking is valid because bridge plugin "
                "version was <1.3.0: continuing anyways (version %r)",
                version,
            )
            return
        try:
            self.client.check(alloc_id, netns_path, *ns_opts)
        except CNIError as e:
            log.warning("network namespace exists but CHECK failed: %s", e)
            raise CheckFailedError(e) from e

    def _add(self, alloc_id: str, netns_path: str, ns_opts: tuple[Any, ...]) -> GoCNIResult:
        first: CNIError | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                return self.client.setup(alloc_id, netns_path, *ns_opts)
            except CNIError as e:
                log.warning("failed to configure network (attempt %d): %s", attempt, e)
                first = first or e
                if attempt == ADD_ATTEMPTS:
                    raise SetupError(first) from first
            self._sleep(1.0 + self._rng.randrange(1000) / 1000)

    def teardown(self, alloc: Allocation, netns_path: str) -> CleanupReport | None:
        """DEL; None when it succeeded, else the report of the forced cleanup that followed.

        A failed forced cleanup raises :class:`~pycni.nomad.errors.CleanupError`.
        """
        from .. import client

        with _serialised:
            self._ensure_initialized()
            ports = port_mappings(alloc, self.ignore_port_mapping_host_ip)
            try:
                self.client.remove(alloc.id, netns_path, client.with_capability_port_map(ports.capability()))
                return None
            except CNIError as e:
                log.warning("error from cni remove; attempting forced cleanup: %s", e)
            # Most likely the pause container or netns was removed from underneath the client.
            return self._cleanup(self.network_name, alloc.id)
